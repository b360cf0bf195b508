// Requests to the server in the three ways the page speaks: Chat Completions (SSE),
// Responses (SSE) and Responses over the WebSocket. Each way turns the server's stream
// into the same calls on a `sink`: text(delta, tokens), reasoning(delta),
// toolCall(index, {id, name, arguments}) (arguments arrive in fragments),
// usage({prompt, completion, cached}), responseId(id), finish(reason).

export const API_MODES = { chat: "Chat Completions", responses: "Responses", socket: "Responses · WebSocket" };

export class ApiError extends Error {
  constructor(status, message, param = null, code = null) {
    super(message);
    this.status = status;
    this.param = param;
    this.code = code;
  }
}

function number(value, parse = parseFloat) {
  if (value === "" || value == null) return undefined;
  const parsed = parse(String(value), 10);
  return Number.isFinite(parsed) ? parsed : undefined;
}

// The stop field holds one stop string per line; "\n" written out means a newline.
// All are sent: a server that takes fewer says so in a 400 the reply shows.
export function stopStrings(text) {
  return String(text || "")
    .split("\n")
    .map((s) => s.replace(/\\n/g, "\n").replace(/\\t/g, "\t"))
    .filter((s) => s.length > 0);
}

// The small built-in tool the settings can offer the model: the page runs it itself.
export const DEMO_TOOL = {
  type: "function",
  function: {
    name: "get_current_time",
    description: "The current date and time in an IANA time zone.",
    parameters: { type: "object", properties: { timezone: { type: "string", description: "e.g. Europe/Paris" } }, required: ["timezone"] },
  },
};

export function runDemoTool(argumentsText) {
  let zone = "UTC";
  try {
    zone = String(JSON.parse(argumentsText || "{}").timezone || "UTC");
  } catch {
    return JSON.stringify({ error: "arguments are not JSON" });
  }
  try {
    return JSON.stringify({ timezone: zone, time: new Date().toLocaleString("sv-SE", { timeZone: zone }) });
  } catch {
    return JSON.stringify({ error: `unknown time zone ${zone}` });
  }
}

// The user's extra JSON fields (an object), or an Error with a sentence.
export function extraFields(text) {
  if (!String(text || "").trim()) return {};
  let value;
  try {
    value = JSON.parse(text);
  } catch {
    throw new Error("Extra request fields are not valid JSON.");
  }
  if (!value || typeof value !== "object" || Array.isArray(value)) throw new Error("Extra request fields must be a JSON object.");
  return value;
}

function sampling(settings, maxName) {
  const fields = {
    temperature: number(settings.temperature),
    top_p: number(settings.top_p),
    top_k: number(settings.top_k, parseInt),
    min_p: number(settings.min_p),
    presence_penalty: number(settings.presence_penalty),
    frequency_penalty: number(settings.frequency_penalty),
    repetition_penalty: number(settings.repetition_penalty),
    [maxName]: number(settings.max_tokens, parseInt),
    seed: number(settings.seed, parseInt),
  };
  const stop = stopStrings(settings.stop);
  if (stop.length) fields.stop = stop;
  return Object.fromEntries(Object.entries(fields).filter(([, v]) => v !== undefined));
}

// A user message may carry `images` (data URLs) and `files` (text files, as their
// text): they become parts after its text (no text part when there is none).
function withParts(message, textPart, imagePart) {
  const files = message.files || [];
  const images = message.images || [];
  if (!images.length && !files.length) return message.content;
  const parts = message.content ? [textPart(message.content)] : [];
  for (const file of files) parts.push(textPart(`File ${file.name}:\n\n\`\`\`\n${file.text}\n\`\`\``));
  return [...parts, ...images.map(imagePart)];
}

function chatMessage(m) {
  if (m.role === "tool") return { role: "tool", tool_call_id: m.toolCallId, content: m.content };
  if (m.role === "assistant") {
    if (!m.toolCalls || !m.toolCalls.length) return { role: "assistant", content: m.content };
    return {
      role: "assistant",
      content: m.content || null,
      tool_calls: m.toolCalls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } })),
    };
  }
  return { role: "user", content: withParts(m, (text) => ({ type: "text", text }), (url) => ({ type: "image_url", image_url: { url } })) };
}

function responsesItems(m) {
  if (m.role === "tool") return [{ type: "function_call_output", call_id: m.toolCallId, output: m.content }];
  if (m.role === "assistant") {
    const items = m.content || !m.toolCalls ? [{ role: "assistant", content: m.content }] : [];
    for (const c of m.toolCalls || []) items.push({ type: "function_call", call_id: c.id, name: c.name, arguments: c.arguments });
    return items;
  }
  return [{ role: "user", content: withParts(m, (text) => ({ type: "input_text", text }), (url) => ({ type: "input_image", image_url: url })) }];
}

function tools(settings, extra) {
  if (!settings.demo_tool) return {};
  const given = Array.isArray(extra.tools) ? extra.tools : [];
  return { tools: [...given, DEMO_TOOL] };
}

// The request for answering the last (user or tool) messages of `history`.
// `probabilities`: {logprobs: bool, top: number|null}; `chain`: whether a Responses
// request may continue from the previous reply's stored response. `system`: the
// conversation's system prompt.
export function buildRequest({ mode, model, settings, system, history, probabilities, chain = true }) {
  const extra = extraFields(settings.extra);
  const logprobs = {};
  if (probabilities.logprobs) {
    logprobs.logprobs = true;
    if (probabilities.top) logprobs.top_logprobs = probabilities.top;
  }
  const format = settings.response_format === "json_object" ? { type: "json_object" } : null;
  if (mode === "chat") {
    const messages = [];
    if (system.trim()) messages.push({ role: "system", content: system });
    for (const m of history) messages.push(chatMessage(m));
    const body = {
      model,
      messages,
      stream: true,
      stream_options: { include_usage: true },
      ...sampling(settings, "max_tokens"),
      ...(format ? { response_format: format } : {}),
      ...logprobs,
      ...extra,
      ...tools(settings, extra),
    };
    return { mode, path: "/v1/chat/completions", body };
  }
  let last = history.length - 1;
  while (last >= 0 && history[last].role !== "assistant") last--;
  const previous = last >= 0 ? history[last] : null;
  const chained = chain && previous && previous.responseId;
  const turns = chained ? history.slice(last + 1) : history;
  const body = { model };
  if (system.trim()) body.instructions = system;
  if (chained) body.previous_response_id = previous.responseId;
  body.input = turns.flatMap(responsesItems);
  if (mode === "responses") body.stream = true;
  Object.assign(body, sampling(settings, "max_output_tokens"), format ? { text: { format } } : {}, logprobs, extra, tools(settings, extra));
  return { mode, path: "/v1/responses", body };
}

// Continuing a reply cut at its token limit: the Messages API (/v1/messages) carries on
// from an assistant message that ends the conversation ("prefill"); Chat Completions
// and Responses would start a new turn instead. Text, images and files only (a
// conversation with tool calls is not continued).
export function continueRequest({ model, settings, system, history, reply }) {
  const block = (text) => ({ type: "text", text });
  const image = (url) => {
    const match = /^data:([^;,]+);base64,(.*)$/s.exec(url);
    return { type: "image", source: { type: "base64", media_type: match ? match[1] : "image/png", data: match ? match[2] : "" } };
  };
  const messages = history.map((m) => ({ role: m.role, content: m.role === "user" ? withParts(m, block, image) : m.content }));
  messages.push({ role: "assistant", content: reply.content });
  const sampled = sampling(settings, "max_tokens");
  const body = { model, max_tokens: sampled.max_tokens || 1024, messages, stream: true };
  if (system.trim()) body.system = system;
  for (const name of ["temperature", "top_p", "top_k"]) if (sampled[name] !== undefined) body[name] = sampled[name];
  if (sampled.stop) body.stop_sequences = sampled.stop;
  return { mode: "messages", path: "/v1/messages", body };
}

function headers(key) {
  const out = { "Content-Type": "application/json", Accept: "text/event-stream" };
  if (key) out.Authorization = "Bearer " + key;
  return out;
}

async function errorOf(response) {
  let message = `The server answered ${response.status} ${response.statusText}.`;
  let param = null;
  let code = null;
  try {
    const body = await response.json();
    if (body && body.error) {
      message = body.error.message || message;
      param = body.error.param || null;
      code = body.error.code || null;
    }
  } catch {
    // not JSON: the status line says enough
  }
  return new ApiError(response.status, message, param, code);
}

export async function getJSON(path, key, signal) {
  const response = await fetch(path, { headers: key ? { Authorization: "Bearer " + key } : {}, signal, cache: "no-store" });
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

// The text of an audio file or recording (a File or a named Blob) by OpenAI's multipart
// /v1/audio/transcriptions; a refusal (a 4xx naming the file) is thrown as an ApiError.
export async function transcribe(audio, name, model, key, signal) {
  const form = new FormData();
  form.append("model", model);
  form.append("file", audio, name);
  const response = await fetch("/v1/audio/transcriptions", { method: "POST", body: form, headers: key ? { Authorization: "Bearer " + key } : {}, signal });
  if (!response.ok) throw await errorOf(response);
  const body = await response.json();
  return String((body && body.text) || "");
}

// A reply read aloud by OpenAI's /v1/audio/speech (`model` a speech model): a wav Blob;
// a refusal is thrown as an ApiError. The route takes at most 4096 characters.
export async function speak(text, model, key, signal) {
  const headers = { "Content-Type": "application/json" };
  if (key) headers.Authorization = "Bearer " + key;
  const body = JSON.stringify({ model, input: text.slice(0, 4096), voice: "alloy", response_format: "wav" });
  const response = await fetch("/v1/audio/speech", { method: "POST", body, headers, signal });
  if (!response.ok) throw await errorOf(response);
  return response.blob();
}

// Server-sent events of a fetch response: {event, data} for each.
async function* serverSentEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value.replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
        else if (line.startsWith("event:")) event = line.slice(6).trim();
      }
      if (data.length) yield { event, data: data.join("\n") };
    }
  }
}

export function tokensOf(entries) {
  return (entries || []).map((entry) => ({
    t: entry.token,
    lp: entry.logprob,
    top: (entry.top_logprobs || []).map((alt) => ({ t: alt.token, lp: alt.logprob })),
  }));
}

export async function send(request, { key, signal, sink, socket }) {
  if (request.mode === "socket") return socket.run(request.body, key, signal, sink);
  const response = await fetch(request.path, { method: "POST", headers: headers(key), body: JSON.stringify(request.body), signal });
  if (!response.ok) throw await errorOf(response);
  for await (const { data } of serverSentEvents(response)) {
    if (data === "[DONE]") break;
    let message;
    try {
      message = JSON.parse(data);
    } catch {
      continue;
    }
    if (request.mode === "chat") chatChunk(message, sink);
    else if (request.mode === "messages") messagesEvent(message, sink);
    else if (responsesEvent(message, sink)) break;
  }
}

function chatChunk(chunk, sink) {
  if (chunk.error) throw new ApiError(chunk.error.code === "invalid_api_key" ? 401 : 500, chunk.error.message, chunk.error.param);
  const choice = chunk.choices && chunk.choices[0];
  if (choice) {
    const delta = choice.delta || {};
    const reasoning = delta.reasoning_content || delta.reasoning;
    if (reasoning) sink.reasoning(reasoning);
    const tokens = choice.logprobs && choice.logprobs.content ? tokensOf(choice.logprobs.content) : [];
    if (delta.content || tokens.length) sink.text(delta.content || "", tokens);
    for (const call of delta.tool_calls || []) {
      const fn = call.function || {};
      sink.toolCall(call.index || 0, { id: call.id, name: fn.name, arguments: fn.arguments || "" });
    }
    if (choice.finish_reason) sink.finish(choice.finish_reason);
  }
  if (chunk.usage) {
    const details = chunk.usage.prompt_tokens_details || {};
    sink.usage({ prompt: chunk.usage.prompt_tokens, completion: chunk.usage.completion_tokens, cached: details.cached_tokens });
  }
}

const STOP_REASONS = { end_turn: "stop", stop_sequence: "stop", max_tokens: "length", tool_use: "tool_calls" };

function messagesEvent(event, sink) {
  if (event.type === "message_start" && event.message && event.message.usage) {
    sink.usage({ prompt: event.message.usage.input_tokens, completion: 0 });
  } else if (event.type === "content_block_delta" && event.delta) {
    if (event.delta.type === "text_delta") sink.text(event.delta.text || "", []);
    else if (event.delta.type === "thinking_delta") sink.reasoning(event.delta.thinking || "");
  } else if (event.type === "message_delta") {
    if (event.delta && event.delta.stop_reason) sink.finish(STOP_REASONS[event.delta.stop_reason] || event.delta.stop_reason);
    if (event.usage) sink.usage({ completion: event.usage.output_tokens });
  } else if (event.type === "error") {
    const error = event.error || {};
    throw new ApiError(error.type === "authentication_error" ? 401 : 400, error.message || "The server sent an error.");
  }
}

// One Responses event; true once the response is over.
function responsesEvent(event, sink) {
  switch (event.type) {
    case "response.created":
      sink.responseId(event.response.id);
      return false;
    case "response.output_text.delta":
      sink.text(event.delta || "", tokensOf(event.logprobs));
      return false;
    case "response.output_item.added":
      if (event.item && event.item.type === "function_call") {
        sink.toolCall("r" + event.output_index, { id: event.item.call_id, name: event.item.name, arguments: event.item.arguments || "" });
      }
      return false;
    case "response.function_call_arguments.delta":
      sink.toolCall("r" + event.output_index, { arguments: event.delta || "" });
      return false;
    case "response.reasoning_summary_text.delta":
    case "response.reasoning_text.delta":
      sink.reasoning(event.delta || "");
      return false;
    case "response.completed":
    case "response.incomplete": {
      const response = event.response || {};
      const usage = response.usage;
      if (usage) {
        const details = usage.input_tokens_details || {};
        sink.usage({ prompt: usage.input_tokens, completion: usage.output_tokens, cached: details.cached_tokens });
      }
      sink.finish(event.type === "response.completed" ? "stop" : (response.incomplete_details || {}).reason || "incomplete");
      return true;
    }
    case "response.failed": {
      const error = (event.response && event.response.error) || {};
      throw new ApiError(500, error.message || "The response failed.", null, error.code);
    }
    case "error": {
      const error = event.error || event;
      throw new ApiError(error.code === "invalid_api_key" ? 401 : 400, error.message || "The server sent an error.", error.param, error.code);
    }
    default:
      return false;
  }
}

// Responses over one WebSocket, kept open between requests. Browsers cannot set an
// Authorization header on a WebSocket: the key is offered as the subprotocol
// `openai-insecure-api-key.<key>` beside `responses` (docs/operations.md#api-keys says more).
// There is no cancel frame, so Stop closes the socket: the server then cancels every
// response on it. The next request opens a new one.
export class ResponsesSocket {
  constructor() {
    this.ws = null;
    this.key = null;
    this.streams = new Map();
    this.counter = 0;
  }

  url() {
    return (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/v1/responses";
  }

  open(key) {
    if (this.ws && this.ws.readyState <= WebSocket.OPEN && this.key === key) return this.ready;
    this.close();
    const protocols = key ? ["responses", "openai-insecure-api-key." + key] : [];
    const ws = new WebSocket(this.url(), protocols);
    this.ws = ws;
    this.key = key;
    this.ready = new Promise((resolve, reject) => {
      ws.addEventListener("open", () => resolve(ws), { once: true });
      ws.addEventListener("close", () => reject(new ApiError(0, "The WebSocket could not connect.", null, "socket_failed")), { once: true });
    });
    ws.addEventListener("message", (message) => this.dispatch(message.data));
    ws.addEventListener("close", () => {
      if (this.ws === ws) this.ws = null;
      for (const stream of this.streams.values()) stream.fail(new ApiError(0, "The WebSocket closed before the reply ended.", null, "socket_closed"));
      this.streams.clear();
    });
    this.ready.catch(() => {});
    return this.ready;
  }

  close() {
    if (this.ws) {
      const ws = this.ws;
      this.ws = null;
      ws.close();
    }
  }

  dispatch(data) {
    let event;
    try {
      event = JSON.parse(data);
    } catch {
      return;
    }
    const targets = event.stream_id != null ? [this.streams.get(event.stream_id)] : [...this.streams.values()];
    for (const stream of targets) if (stream) stream.handle(event);
  }

  async run(body, key, signal, sink) {
    await this.open(key);
    const streamId = "s" + ++this.counter;
    return new Promise((resolve, reject) => {
      const finish = (error) => {
        this.streams.delete(streamId);
        signal.removeEventListener("abort", onAbort);
        if (error) reject(error);
        else resolve();
      };
      const onAbort = () => {
        finish(new DOMException("Stopped", "AbortError"));
        this.close(); // the server cancels the response with the socket
      };
      this.streams.set(streamId, {
        handle: (event) => {
          try {
            if (responsesEvent(event, sink)) finish();
          } catch (error) {
            finish(error);
          }
        },
        fail: finish,
      });
      signal.addEventListener("abort", onAbort);
      this.ws.send(JSON.stringify({ type: "response.create", stream_id: streamId, ...body }));
    });
  }
}
