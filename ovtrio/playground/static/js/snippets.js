// "Copy as curl" and "Copy as Python": the exact body the page just sent. The key is
// never written into a snippet; it is read from OVTRIO_API_KEY. Every value a snippet
// carries (the URL, headers, body) is quoted for its language: a POSIX shell word in
// single quotes, a Python string literal, so a snippet runs one curl or one call
// whatever a request kept in an imported conversation holds.

const PYTHON_PARAMS = {
  chat: new Set(["model", "messages", "stream", "stream_options", "temperature", "top_p", "max_tokens", "max_completion_tokens", "seed", "stop", "logprobs", "top_logprobs", "response_format", "n", "frequency_penalty", "presence_penalty", "tools", "tool_choice", "reasoning_effort", "user", "metadata"]),
  responses: new Set(["model", "input", "instructions", "previous_response_id", "stream", "store", "temperature", "top_p", "max_output_tokens", "text", "reasoning", "top_logprobs", "include", "tools", "tool_choice", "metadata", "parallel_tool_calls"]),
};

function origin() {
  return location.origin;
}

// One word for a POSIX shell: inside single quotes nothing is special but the quote
// itself, which closes, is written escaped and reopens.
export function shellWord(text) {
  return "'" + String(text).replace(/'/g, "'\\''") + "'";
}

// A Python string literal of `text`. JSON's escapes (\" \\ \n \uXXXX ...) mean the
// same in Python; U+2028 and U+2029, which JSON leaves raw, are escaped too.
export function pythonString(text) {
  return JSON.stringify(String(text)).replace(/[\u2028\u2029]/g, (c) => "\\u" + c.charCodeAt(0).toString(16));
}

export function curlSnippet(request, withKey) {
  const lines = [];
  let body = request.body;
  if (request.mode === "socket") {
    lines.push("# Sent over the WebSocket; the same request over HTTP (SSE):");
    body = { ...body, stream: true };
  }
  lines.push(`curl -N ${shellWord(origin() + request.path)} \\`);
  lines.push(`  -H ${shellWord("Content-Type: application/json")} \\`);
  // Double quotes on purpose: the shell puts the key in from the environment.
  if (withKey) lines.push(`  -H "Authorization: Bearer $OVTRIO_API_KEY" \\`);
  lines.push(`  -d ${shellWord(JSON.stringify(body, null, 2))}`);
  return lines.join("\n");
}

// A JSON value written as a Python literal.
export function pythonLiteral(value, indent = 0) {
  const pad = " ".repeat(indent + 4);
  const end = " ".repeat(indent);
  if (value === null || value === undefined) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  if (typeof value === "number") return Number.isFinite(value) ? String(value) : "None";
  if (typeof value === "string") return pythonString(value);
  if (Array.isArray(value)) {
    if (!value.length) return "[]";
    return "[\n" + value.map((v) => pad + pythonLiteral(v, indent + 4) + ",\n").join("") + end + "]";
  }
  const entries = Object.entries(value);
  if (!entries.length) return "{}";
  return "{\n" + entries.map(([k, v]) => pad + pythonString(k) + ": " + pythonLiteral(v, indent + 4) + ",\n").join("") + end + "}";
}

export function pythonSnippet(request, withKey) {
  const key = withKey ? 'os.environ["OVTRIO_API_KEY"]' : '"unused"';
  const head = ["import os", "", "from openai import OpenAI", "", `client = OpenAI(base_url=${pythonString(origin() + "/v1")}, api_key=${key})`];
  if (request.mode === "socket") {
    return [
      ...head,
      "",
      "with client.responses.connect() as connection:",
      "    connection.send(" + pythonLiteral({ type: "response.create", ...request.body }, 4) + ")",
      "    for event in connection:",
      '        if event.type == "response.output_text.delta":',
      '            print(event.delta, end="", flush=True)',
      '        elif event.type in ("response.completed", "response.failed", "response.incomplete", "error"):',
      "            break",
      "print()",
    ].join("\n");
  }
  const known = request.mode === "chat" ? PYTHON_PARAMS.chat : PYTHON_PARAMS.responses;
  const args = [];
  const extra = {};
  for (const [name, value] of Object.entries(request.body)) {
    if (known.has(name)) args.push(`    ${name}=${pythonLiteral(value, 4)},`);
    else extra[name] = value;
  }
  if (Object.keys(extra).length) args.push(`    extra_body=${pythonLiteral(extra, 4)},`);
  const call = request.mode === "chat" ? "client.chat.completions.create(" : "client.responses.create(";
  const loop =
    request.mode === "chat"
      ? ["for chunk in stream:", "    if chunk.choices and chunk.choices[0].delta.content:", '        print(chunk.choices[0].delta.content, end="", flush=True)']
      : ["for event in stream:", '    if event.type == "response.output_text.delta":', '        print(event.delta, end="", flush=True)'];
  return [...head, "", "stream = " + call, ...args, ")", ...loop, "print()"].join("\n");
}
