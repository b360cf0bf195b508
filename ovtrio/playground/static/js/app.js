// The playground's main module: wires the page to the server and to what the browser
// keeps. Everything the user or the model writes is inserted as text (dom.js,
// markdown.js); the page's Content-Security-Policy forbids inline script besides.
// Each conversation streams on its own: a reply in one never blocks a send in another.

import { $, h, copyText, flash } from "./dom.js";
import { renderMarkdown } from "./markdown.js";
import { API_MODES, ApiError, ResponsesSocket, buildRequest, continueRequest, getJSON, runDemoTool, send, speak, transcribe, DEMO_TOOL } from "./api.js";
import { ServerPanel } from "./metrics.js";
import { ModelRefresh, fillPicker, modelStatus } from "./models.js";
import { curlSnippet, pythonSnippet } from "./snippets.js";
import { installTokenTips, renderTokens } from "./tokens.js";
import { branch, switchVersion } from "./versions.js";
import { enhance, pdfText } from "./vendor.js";
import { TEXT_LIMIT, fileChips, isPdf, isText, readAsDataURL, thumbnails } from "./attachments.js";
import { splitThinking, statsView } from "./replies.js";
import { Recording, canRecord, insertAtCursor, isAudio } from "./speech.js";
import * as store from "./store.js";

const state = {
  settings: store.loadSettings(),
  conversations: [],
  currentId: null,
  key: store.rememberedKey(),
  models: [],
  modelCards: [],
  transcriber: null, // the id of a model of kind "transcription", when one is served
  speaker: null, // the id of a model of kind "speech", when one is served
  aloud: null, // the reply being read aloud: {audio, button, url}
  recording: null, // the microphone's Recording while it records
  modelsProblem: null, // "key" when /v1/models refused the key (or its absence)
  goneModel: null, // the chosen model, when the server no longer lists it
  images: [], // data URLs waiting for the next message
  files: [], // text files ({name, text}) waiting for the next message
  reading: new Set(), // attachments still being read
  runs: new Map(), // conversation id -> {controller, reply, conversation}
  probabilities: { logprobs: true, top: null },
  sockets: new Map(), // conversation id -> its ResponsesSocket
  views: new WeakMap(), // message -> its element
  pending: new Set(), // replies waiting for their next render
  saveTimers: new Map(), // conversation id -> a save due while it streams
  search: "",
  unsaved: new Set(), // ids of the conversations whose last change the browser refused
};

const ui = {
  app: $(".app"),
  prompt: $("#prompt"),
  attach: $("#attach"),
  picker: $("#attach-file"),
  pendingImages: $("#pending-images"),
  audioButton: $("#attach-audio"),
  mic: $("#mic"),
  speechStatus: $("#speech-status"),
  composer: $("#composer"),
  send: $("#send"),
  stop: $("#stop"),
  messages: $("#messages"),
  conversations: $("#conversations"),
  sidebar: $("#sidebar"),
  menu: $("#menu-toggle"),
  backdrop: $("#backdrop"),
  search: $("#search"),
  model: $("#model"),
  modes: $("#api-mode"),
  tokenView: $("#token-view"),
  settings: $("#settings"),
  settingsToggle: $("#settings-toggle"),
  keyBanner: $("#key-banner"),
  keyMessage: $("#key-message"),
  keyInput: $("#api-key"),
  remember: $("#remember-key"),
  toast: $("#toast"),
  tip: $("#tip"),
  announce: $("#announce"),
};

const coarse = window.matchMedia("(pointer: coarse)");
const narrow = window.matchMedia("(max-width: 860px)");

// ---- conversations ------------------------------------------------------------

function current() {
  return state.conversations.find((c) => c.id === state.currentId) || null;
}

function runOf(conversation) {
  return (conversation && state.runs.get(conversation.id)) || null;
}

// One conversation written as one record: a refusal (a full disk) loses only its latest
// change, and says so.
async function save(conversation) {
  clearTimeout(state.saveTimers.get(conversation.id));
  state.saveTimers.delete(conversation.id);
  if (!state.conversations.includes(conversation)) return; // deleted (while it streamed)
  // html[data-writing] while a write is under way (what a test waits on).
  const root = document.documentElement;
  root.dataset.writing = String(Number(root.dataset.writing || 0) + 1);
  const error = await store.saveConversation(storable(conversation));
  const left = Number(root.dataset.writing) - 1;
  if (left) root.dataset.writing = String(left);
  else delete root.dataset.writing;
  const was = state.unsaved.has(conversation.id);
  if (error) state.unsaved.add(conversation.id);
  else state.unsaved.delete(conversation.id);
  if (error) {
    const full = error.name === "QuotaExceededError" || /quota/i.test(error.message || "");
    toast(
      `Not kept: “${conversation.title}”${full ? " — the browser's storage for this page is full" : ` — the browser refused to store it (${error.name || error.message})`}. ` +
        "Its last kept version stays; delete conversations or images to make room."
    );
  }
  if (was !== Boolean(error)) renderConversations();
}

// A request is kept with its reply (Copy as curl / Python after a reload) unless it is
// big: one that carries images would keep them twice.
const KEEP_REQUESTS_UNDER = 256 * 1024;

function storable(conversation) {
  const slim = (m) => {
    let out = m;
    if (m.request && JSON.stringify(m.request.body).length > KEEP_REQUESTS_UNDER) {
      out = { ...m };
      delete out.request;
    }
    if (m.versions) out = { ...out, versions: m.versions.map((tail) => tail && tail.map(slim)) };
    return out;
  };
  return { ...conversation, messages: conversation.messages.map(slim) };
}

// While a reply streams its conversation is written once a second, so a reload keeps
// what had arrived (its images are stored apart, once: the record stays small).
function saveSoon(conversation) {
  if (state.saveTimers.has(conversation.id)) return;
  state.saveTimers.set(
    conversation.id,
    setTimeout(() => {
      state.saveTimers.delete(conversation.id);
      save(conversation);
    }, 1000)
  );
}

function select(id) {
  state.currentId = id;
  const conversation = current();
  if (conversation && conversation.model && state.models.includes(conversation.model) && ui.model.value !== conversation.model) {
    ui.model.value = conversation.model;
    showAttach();
  }
  $("#c-system").value = (conversation && conversation.system) || "";
  renderConversations();
  renderMessages();
  showRunning();
  closeSidebar();
  if (!coarse.matches) ui.prompt.focus();
}

function startNew() {
  const empty = state.conversations.find((c) => !c.messages.length);
  if (empty) return select(empty.id);
  const conversation = store.newConversation();
  state.conversations.unshift(conversation);
  save(conversation);
  select(conversation.id);
}

function when(time) {
  const date = new Date(time);
  const today = new Date();
  if (date.toDateString() === today.toDateString()) return date.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  const options = { day: "numeric", month: "short" };
  if (date.getFullYear() !== today.getFullYear()) options.year = "numeric";
  return date.toLocaleDateString([], options);
}

function matches(conversation, query) {
  if (!query) return true;
  const q = query.toLowerCase();
  return conversation.title.toLowerCase().includes(q) || conversation.messages.some((m) => m.content.toLowerCase().includes(q));
}

function renderConversations() {
  const list = [...state.conversations].sort((a, b) => b.updated - a.updated).filter((c) => matches(c, state.search));
  const rows = list.map((c) => {
    const streaming = state.runs.has(c.id);
    const label = h(
      "button",
      { class: "conv-title", type: "button", title: c.title, "aria-current": c.id === state.currentId ? "true" : null, onclick: () => select(c.id) },
      h("span", { class: "conv-name", text: c.title }),
      h("span", { class: "conv-date", text: streaming ? "replying…" : state.unsaved.has(c.id) ? "not kept" : when(c.updated) })
    );
    const rename = h("button", { class: "conv-rename ghost", type: "button", title: "Rename", "aria-label": `Rename “${c.title}”`, text: "✎" });
    const remove = h("button", { class: "conv-delete ghost", type: "button", title: "Delete", "aria-label": `Delete “${c.title}”`, text: "✕" });
    const row = h("div", { class: "conv" + (c.id === state.currentId ? " active" : "") + (streaming ? " streaming" : "") + (state.unsaved.has(c.id) ? " unsaved" : ""), "data-id": c.id }, label, rename, remove);
    rename.addEventListener("click", () => renameInline(c, row, label));
    remove.addEventListener("click", () => {
      if (!remove.classList.contains("confirm")) {
        remove.classList.add("confirm");
        remove.textContent = "Delete?";
        remove.setAttribute("aria-label", `Confirm: delete “${c.title}”`);
        setTimeout(() => {
          remove.classList.remove("confirm");
          remove.textContent = "✕";
          remove.setAttribute("aria-label", `Delete “${c.title}”`);
        }, 3000);
        return;
      }
      const run = runOf(c);
      if (run) run.controller.abort();
      state.conversations = state.conversations.filter((x) => x !== c);
      store.deleteConversation(c.id);
      if (state.currentId === c.id) state.currentId = state.conversations[0] ? state.conversations[0].id : null;
      renderConversations();
      renderMessages();
      showRunning();
      ui.conversations.querySelector(".conv-title")?.focus();
    });
    return row;
  });
  if (!rows.length && state.search) rows.push(h("p", { class: "conv-none", text: "No conversation matches." }));
  ui.conversations.replaceChildren(...rows);
}

function renameInline(conversation, row, title) {
  const input = h("input", { class: "conv-input", type: "text", value: conversation.title, "aria-label": "Conversation name" });
  title.replaceWith(input);
  input.focus();
  input.select();
  let done = false;
  const finish = (keep) => {
    if (done) return;
    done = true;
    if (keep && input.value.trim()) {
      conversation.title = input.value.trim().slice(0, 120);
      save(conversation);
    }
    renderConversations();
  };
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") finish(true);
    if (event.key === "Escape") {
      event.stopPropagation();
      finish(false);
    }
  });
  input.addEventListener("blur", () => finish(true));
}

// ---- messages -------------------------------------------------------------------

function renderMessages() {
  const conversation = current();
  if (!conversation || !conversation.messages.length) {
    ui.messages.replaceChildren(emptyState());
    return;
  }
  ui.messages.replaceChildren(...conversation.messages.map((m, i) => messageView(conversation, m, i)));
  ui.messages.scrollTop = ui.messages.scrollHeight;
}

function emptyState() {
  const enter = coarse.matches
    ? [h("li", { text: "Enter adds a line; the Send button sends" })]
    : [h("li", null, h("kbd", { text: "Enter" }), " sends, ", h("kbd", { text: "Shift" }), "+", h("kbd", { text: "Enter" }), " adds a line"), h("li", null, h("kbd", { text: "Esc" }), " stops a reply")];
  return h(
    "div",
    { class: "empty-state" },
    h("div", { class: "empty-mark", "aria-hidden": "true" }),
    h("h2", { text: "Try the model" }),
    h("p", { text: "Ask anything below. Replies stream from this server; switch the API above to compare Chat Completions, Responses and Responses over a WebSocket." }),
    h("ul", { class: "hints" }, enter, h("li", { text: "Token view colours each token by its probability" }))
  );
}

function messageView(conversation, message, index) {
  const el = h("article", { class: "msg " + message.role });
  state.views.set(message, el);
  fillMessage(el, conversation, message, index);
  return el;
}

// "‹ 2/3 ›" on a message that starts more than one version of the turns.
function versionNav(conversation, message, index, busy) {
  if (!message.versions || message.versions.length < 2) return null;
  const go = (step) => {
    if (runOf(conversation)) return;
    if (switchVersion(conversation, index, message.version + step)) {
      save(conversation);
      renderMessages();
    }
  };
  return h(
    "span",
    { class: "versions", role: "group", "aria-label": "Versions" },
    h("button", { class: "ghost small", type: "button", text: "‹", "aria-label": "Previous version", disabled: busy || message.version === 0, onclick: () => go(-1) }),
    h("span", { class: "version-count", text: `${message.version + 1}/${message.versions.length}` }),
    h("button", { class: "ghost small", type: "button", text: "›", "aria-label": "Next version", disabled: busy || message.version === message.versions.length - 1, onclick: () => go(1) })
  );
}

function fillMessage(el, conversation, message, index) {
  const run = runOf(conversation);
  const busy = Boolean(run);
  const live = Boolean(run && run.reply === message);
  el.classList.toggle("streaming", live);
  if (live) el.setAttribute("aria-busy", "true");
  else el.removeAttribute("aria-busy");
  const parts = [];
  if (message.role === "user") {
    if (message.images && message.images.length) parts.push(thumbnails(message.images));
    if (message.files && message.files.length) parts.push(fileChips(message.files));
    const attached = (message.images && message.images.length) || (message.files && message.files.length);
    if (message.content || !attached) parts.push(h("div", { class: "bubble", text: message.content }));
    parts.push(
      h(
        "div",
        { class: "actions" },
        versionNav(conversation, message, index, busy),
        h("button", { class: "ghost small", type: "button", text: "Edit", disabled: busy, onclick: () => editMessage(el, conversation, index) }),
        copyButton(() => message.content)
      )
    );
  } else if (message.role === "tool") {
    parts.push(h("div", { class: "who", text: `result of ${message.name || "the tool"}` }), h("pre", { class: "tool-result", text: message.content }));
  } else {
    parts.push(h("div", { class: "who", text: (message.stats && message.stats.model) || "assistant" }));
    const { thinking, answer, open } = splitThinking(message.content);
    const reasoning = [message.reasoning, thinking].filter(Boolean).join("\n\n");
    if (reasoning) {
      const thinkingNow = live && (open || (!answer && !message.toolCalls));
      parts.push(h("details", { class: "reasoning" }, h("summary", { text: thinkingNow ? "Reasoning…" : "Reasoning" }), h("div", { class: "reasoning-body", text: reasoning })));
    }
    const body = h("div", { class: "content" });
    if (state.settings.tokenView && message.tokens && message.tokens.length) body.append(renderTokens(message.tokens, coarse.matches));
    else if (answer) body.append(renderMarkdown(answer));
    else if (live && !reasoning && !(message.toolCalls && message.toolCalls.length)) {
      body.append(h("span", { class: "typing", role: "img", "aria-label": "waiting for the first token" }, h("i"), h("i"), h("i")));
      const model = message.stats && message.stats.model;
      if (model && statusOf(model) === "loading") body.append(h("span", { class: "note loading", text: `Loading ${model} on the server…` }));
    }
    if (state.settings.tokenView && !(message.tokens && message.tokens.length) && message.content) {
      body.prepend(h("p", { class: "note", text: "No token probabilities were recorded for this reply." }));
    }
    parts.push(body);
    if (message.toolCalls && message.toolCalls.length) parts.push(toolCallsView(conversation, message, index, live));
    if (message.error) parts.push(h("p", { class: "error", text: message.error }));
    if (message.stats && message.stats.finish === "interrupted") {
      parts.push(h("p", { class: "note cut", text: "Cut off: the page was closed or reloaded before this reply ended." }));
    }
    if (!live) {
      const actions = h(
        "div",
        { class: "actions" },
        versionNav(conversation, message, index, busy),
        h("button", { class: "ghost small", type: "button", text: "Regenerate", disabled: busy, onclick: () => regenerate(conversation, index) }),
        copyButton(() => message.content)
      );
      if (state.speaker && answer) actions.append(readAloudButton(answer));
      if (canContinue(conversation, message, index)) {
        actions.prepend(h("button", { class: "ghost small", type: "button", text: "Continue", disabled: busy, onclick: () => generate(conversation, message, true) }));
      }
      const request = message.request;
      if (request) {
        actions.append(
          copyButton(() => curlSnippet(request, Boolean(state.key)), "Copy as curl"),
          copyButton(() => pythonSnippet(request, Boolean(state.key)), "Copy as Python")
        );
      }
      parts.push(h("div", { class: "foot" }, statsView(message.stats), actions));
    }
  }
  el.replaceChildren(...parts);
  enhance(el);
}

// A reply cut at its token limit, the last of a conversation without tool calls, can be
// carried on (api.js continueRequest).
function canContinue(conversation, message, index) {
  return (
    message.stats &&
    message.stats.finish === "length" &&
    index === conversation.messages.length - 1 &&
    message.content &&
    !conversation.messages.some((m) => m.role === "tool" || (m.toolCalls && m.toolCalls.length))
  );
}

// The calls a reply makes, each with its arguments and a box for its result; the
// results go back to the model in one request. The page's own demo tool runs here.
function toolCallsView(conversation, message, index, live) {
  const answered = conversation.messages.slice(index + 1).some((m) => m.role === "tool");
  const last = index === conversation.messages.length - 1;
  const boxes = [];
  const calls = message.toolCalls.map((call, k) => {
    let args = call.arguments;
    try {
      const parsed = JSON.parse(call.arguments);
      args = JSON.stringify(parsed);
      if (args.length > 60) args = JSON.stringify(parsed, null, 2);
    } catch {
      // shown as it came (still streaming, or not JSON)
    }
    const rows = [h("div", { class: "tool-head" }, h("span", { class: "tool-tag", text: "tool call" }), h("code", { class: "tool-name", text: call.name || "…" })), h("pre", { class: "tool-args", text: args })];
    if (!live && !answered && last) {
      const result = h("textarea", { class: "tool-output", rows: 2, "aria-label": `Result of ${call.name}`, placeholder: "The tool's result (text or JSON)" });
      boxes.push({ call, result });
      rows.push(result);
      if (call.name === DEMO_TOOL.function.name) {
        rows.push(h("button", { class: "ghost small", type: "button", text: "Run the demo tool", onclick: () => (result.value = runDemoTool(call.arguments)) }));
      }
    }
    return h("div", { class: "tool-call", "data-index": k }, rows);
  });
  const box = h("div", { class: "tool-calls" }, calls);
  if (boxes.length) {
    const sendResults = h("button", { class: "primary small", type: "button", text: boxes.length > 1 ? "Send the results" : "Send the result" });
    sendResults.addEventListener("click", () => {
      if (runOf(conversation)) return;
      for (const { call, result } of boxes) conversation.messages.push({ role: "tool", toolCallId: call.id, name: call.name, content: result.value });
      generate(conversation);
    });
    box.append(sendResults);
  }
  return box;
}

function copyButton(text, label = "Copy") {
  const button = h("button", { class: "ghost small", type: "button", text: label });
  button.addEventListener("click", async () => flash(button, (await copyText(text())) ? "Copied" : "Copy failed"));
  return button;
}

// Editing keeps the message and the turns after it as the previous version.
function editMessage(el, conversation, index) {
  const message = conversation.messages[index];
  const area = h("textarea", { class: "edit-area", rows: 3, "aria-label": "Edit message" });
  area.value = message.content;
  // Its images can be taken out (one the server refused, say), not added.
  const images = [...(message.images || [])];
  const imageBox = h("div", { class: "edit-images" });
  const showImages = () => imageBox.replaceChildren(...(images.length ? [thumbnails(images, (i) => (images.splice(i, 1), showImages()))] : []));
  showImages();
  const saveButton = h("button", { class: "primary small", type: "button", text: "Save & send" });
  const cancel = h("button", { class: "ghost small", type: "button", text: "Cancel", onclick: () => renderMessages() });
  saveButton.addEventListener("click", () => {
    if ((!area.value.trim() && !images.length) || runOf(conversation)) return;
    const edited = { role: "user", content: area.value };
    if (images.length) edited.images = images;
    branch(conversation, index, [edited]);
    generate(conversation);
  });
  area.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing && !coarse.matches) {
      event.preventDefault();
      saveButton.click();
    }
  });
  el.replaceChildren(imageBox, area, h("div", { class: "actions" }, saveButton, cancel));
  area.focus();
}

// Regenerating keeps the reply it replaces as the previous version.
function regenerate(conversation, index) {
  if (runOf(conversation)) return;
  const reply = newReply();
  branch(conversation, index, [reply]);
  generate(conversation, reply);
}

// Re-render a streaming reply at most once a frame.
function schedule(conversation, reply) {
  saveSoon(conversation);
  renderSoon(conversation, reply);
}

function renderSoon(conversation, reply) {
  if (state.pending.has(reply)) return;
  state.pending.add(reply);
  requestAnimationFrame(() => {
    state.pending.delete(reply);
    const el = state.views.get(reply);
    if (!el || !el.isConnected || current() !== conversation) return;
    const atBottom = ui.messages.scrollHeight - ui.messages.scrollTop - ui.messages.clientHeight < 80;
    fillMessage(el, conversation, reply, conversation.messages.indexOf(reply));
    if (atBottom) ui.messages.scrollTop = ui.messages.scrollHeight;
  });
}

// ---- sending ------------------------------------------------------------------------

let submitting = false;

async function submitPrompt() {
  const conversationBefore = current();
  if (submitting || runOf(conversationBefore)) return;
  if (!ui.prompt.value.trim() && !state.images.length && !state.files.length && !state.reading.size) return;
  if (!ui.model.value) {
    if (state.modelsProblem === "key") {
      const sentence = state.key ? "The server refused this API key: enter the right one above, then send." : "This server needs an API key: enter it above, then send.";
      showKeyBanner(sentence);
      toast(sentence);
      ui.keyInput.focus();
    } else toast(state.models.length ? "Pick a model first." : "The server lists no model yet.");
    return;
  }
  if (ui.model.value === state.goneModel) {
    toast(`${state.goneModel} is no longer served: pick another model.`);
    refresh.now();
    return;
  }
  // Images still being read go with this message: wait for them.
  if (state.reading.size) {
    submitting = true;
    ui.send.disabled = true;
    try {
      while (state.reading.size) await Promise.allSettled([...state.reading]);
    } finally {
      submitting = false;
      ui.send.disabled = false;
    }
    if (current() !== conversationBefore) return;
  }
  const text = ui.prompt.value;
  if (!text.trim() && !state.images.length && !state.files.length) return;
  if (state.images.length && !modelTakesImages()) {
    toast(`${ui.model.value} does not read images: remove them or pick a model that does.`);
    return;
  }
  let conversation = current();
  if (!conversation) {
    conversation = store.newConversation();
    state.conversations.unshift(conversation);
    state.currentId = conversation.id;
  }
  const message = { role: "user", content: text };
  if (state.images.length) message.images = state.images.splice(0);
  if (state.files.length) message.files = state.files.splice(0);
  showPendingImages();
  conversation.messages.push(message);
  if (conversation.title === "New chat") {
    conversation.title = text.trim().replace(/\s+/g, " ").slice(0, 48) || (message.files ? message.files[0].name : "Image");
  }
  ui.prompt.value = "";
  autosize();
  generate(conversation);
}

function newReply() {
  return { role: "assistant", content: "", tokens: [], stats: { mode: state.settings.api, model: ui.model.value } };
}

function socketFor(conversation) {
  let socket = state.sockets.get(conversation.id);
  if (!socket) {
    socket = new ResponsesSocket();
    state.sockets.set(conversation.id, socket);
  }
  return socket;
}

// Ask for `reply` (a new one at the end when none is given); `continuing`: carry on a
// reply cut at its token limit, appending to it.
async function generate(conversation, reply = null, continuing = false) {
  const mode = state.settings.api;
  const model = ui.model.value;
  if (!reply) {
    reply = newReply();
    conversation.messages.push(reply);
  }
  const history = conversation.messages.slice(0, conversation.messages.indexOf(reply));
  const before = continuing ? { ...reply.stats } : null;
  reply.stats = continuing ? { mode: before.mode, model, continued: true } : { mode, model };
  if (continuing) {
    reply.tokens = []; // the continuation comes without probabilities
    delete reply.error;
  }
  conversation.model = model;
  conversation.updated = Date.now();
  const controller = new AbortController();
  const run = { controller, reply, conversation, model, first: false, loadTimer: null };
  state.runs.set(conversation.id, run);
  watchLoad(run);
  showRunning();
  save(conversation);
  renderConversations();
  if (state.currentId === conversation.id) renderMessages();

  const started = performance.now();
  let first = null;
  let last = null;
  let usage = null;
  const calls = new Map();
  const mark = () => {
    last = performance.now();
    if (first !== null) return;
    first = last;
    run.first = true;
    // Loaded now: the picker says so without waiting for the reply's end.
    const status = statusOf(model);
    if (status && status !== "loaded") refresh.now(true);
  };
  const sink = {
    text(delta, tokens) {
      if (delta || tokens.length) mark();
      reply.content += delta;
      if (tokens.length) reply.tokens.push(...tokens);
      schedule(conversation, reply);
    },
    reasoning(delta) {
      mark();
      reply.reasoning = (reply.reasoning || "") + delta;
      schedule(conversation, reply);
    },
    toolCall(index, part) {
      mark();
      let call = calls.get(index);
      if (!call) {
        call = { id: "", name: "", arguments: "" };
        calls.set(index, call);
        reply.toolCalls = [...calls.values()];
      }
      if (part.id) call.id = part.id;
      if (part.name) call.name = part.name;
      call.arguments += part.arguments || "";
      schedule(conversation, reply);
    },
    usage(u) {
      usage = { ...(usage || {}), ...Object.fromEntries(Object.entries(u).filter(([, v]) => v !== undefined)) };
    },
    responseId(id) {
      reply.responseId = id;
    },
    finish(reason) {
      reply.stats.finish = reason;
    },
  };

  let chain = true;
  const system = conversation.system && conversation.system.trim() ? conversation.system : state.settings.system;
  for (let attempt = 0; attempt < 4; attempt++) {
    let request;
    try {
      request = continuing
        ? continueRequest({ model, settings: state.settings, system, history, reply })
        : buildRequest({ mode, model, settings: state.settings, system, history, probabilities: state.probabilities, chain });
    } catch (error) {
      reply.error = error.message;
      break;
    }
    if (!continuing) reply.request = request;
    try {
      await send(request, { key: state.key, signal: controller.signal, sink, socket: socketFor(conversation) });
      break;
    } catch (error) {
      if (error.name === "AbortError") {
        reply.stats.finish = "stopped";
        break;
      }
      const nothingYet = first === null;
      if (error instanceof ApiError && nothingYet && (error.status === 400 || error.status === 404)) {
        // Degrade instead of failing: a server that cannot give alternatives, or
        // probabilities at all, or has forgotten the previous response.
        if (error.param === "top_logprobs" && state.probabilities.top) {
          state.probabilities.top = 0;
          toast("This server reports only the chosen token's probability, without alternatives.");
          continue;
        }
        if (error.param === "logprobs" && state.probabilities.logprobs) {
          state.probabilities.logprobs = false;
          toast("This server does not report token probabilities.");
          continue;
        }
        if (error.param === "previous_response_id" && chain) {
          chain = false;
          continue;
        }
      }
      reply.error = await explain(error);
      break;
    }
  }

  const ended = performance.now();
  Object.assign(reply.stats, {
    ttft: first !== null ? first - started : null,
    prompt: usage ? usage.prompt : undefined,
    completion: usage ? usage.completion : reply.tokens.length || undefined,
    cached: usage ? usage.cached : undefined,
  });
  if (continuing && before.completion != null && reply.stats.completion != null) reply.stats.completion += before.completion;
  const generated = continuing && usage ? usage.completion : reply.stats.completion;
  // A reply asked with alternatives comes whole once the server has scored it: its
  // tokens all arrive within a few milliseconds, so the rate is over the whole request
  // (and the time to its first token is when the whole arrived).
  if (first !== null && generated > 4 && last - first < 25) {
    reply.stats.whole = true;
    reply.stats.tps = (generated * 1000) / (ended - started);
  } else if (first !== null && generated > 1 && ended > first) {
    reply.stats.tps = ((generated - 1) * 1000) / (ended - first);
  }
  for (const key of Object.keys(reply.stats)) if (reply.stats[key] === undefined || reply.stats[key] === null) delete reply.stats[key];
  if (!reply.tokens.length) delete reply.tokens;
  if (!reply.stats.finish && !reply.error) reply.stats.finish = "stop";
  if (reply.toolCalls && reply.stats.finish === "stop") reply.stats.finish = "tool_calls";
  state.runs.delete(conversation.id);
  clearTimeout(run.loadTimer);
  refresh.now(true); // the request may have loaded its model, or unloaded another
  conversation.updated = Date.now();
  save(conversation);
  showRunning();
  renderConversations();
  if (state.currentId === conversation.id) renderMessages();
  announce(reply.error ? "The reply failed: " + reply.error : `Reply finished in “${conversation.title}”.`);
}

// A sentence for what went wrong, never a stack.
async function explain(error) {
  if (error instanceof ApiError) {
    if (error.status === 401) return keyRefused(error);
    if (error.code === "socket_failed") {
      try {
        await getJSON("/v1/models", state.key);
      } catch (probe) {
        if (probe instanceof ApiError && probe.status === 401) return keyRefused(probe);
      }
      return "The WebSocket could not connect to the server.";
    }
    if (error.status === 429) return "The server is busy right now (429): " + error.message;
    if (error.status === 0) return error.message;
    return `The server refused the request (${error.status}): ${error.message}`;
  }
  if (error instanceof TypeError) return "The server could not be reached. Is it still running?";
  return "Something went wrong: " + (error && error.message ? error.message : String(error));
}

function keyRefused(error) {
  state.modelsProblem = "key";
  const sentence = state.key
    ? "The server refused this API key. Check it and send again."
    : "This server needs an API key. Enter it above and send again.";
  showKeyBanner(sentence);
  return sentence;
}

function stop() {
  const run = runOf(current());
  if (run) run.controller.abort();
}

// Send or Stop, for the conversation shown.
function showRunning() {
  const running = Boolean(runOf(current()));
  ui.send.hidden = running;
  ui.stop.hidden = !running;
  document.body.classList.toggle("running", running);
}

// ---- models, key, settings --------------------------------------------------------------

// The picker follows the server (models.js): the list is read again on the page's own
// triggers, and while a request waits for its model's load.
const refresh = new ModelRefresh(listModels);
const LOAD_FIRST_LOOK_MS = 400;
const LOAD_LOOK_MS = 1000;

function statusOf(id) {
  return modelStatus(state.modelCards.find((card) => card.id === id));
}

// `background`: asked by a timer or an event, not by the user: a failure then says
// nothing and keeps the list shown (the server panel says when the server is down), and
// there is no asking while the server refuses the key (the same key, the same 401).
async function listModels(background = false) {
  if (background && state.modelsProblem === "key") return;
  let list;
  try {
    list = await getJSON("/v1/models", state.key);
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) keyRefused(error);
    else if (background) return;
    else toast("Could not list the models: " + (error.message || error));
    state.modelCards = [];
    state.models = [];
    state.goneModel = null;
    ui.model.replaceChildren();
    ui.model.disabled = true;
    showAttach();
    return;
  }
  // Only models that chat: /v1/models also lists embedding, rerank and
  // transcription models, each card's `kind` says which.
  state.modelCards = (list.data || []).filter((m) => !m.kind || m.kind === "generation");
  state.models = state.modelCards.map((m) => m.id);
  const ears = (list.data || []).find((m) => m.kind === "transcription");
  state.transcriber = ears ? ears.id : null;
  const voice = (list.data || []).find((m) => m.kind === "speech");
  state.speaker = voice ? voice.id : null;
  // A background look leaves alone a key field the user opened.
  if (!background || state.modelsProblem) hideKeyBanner();
  state.modelsProblem = null;
  const conversation = current();
  const wanted = conversation && conversation.model && state.models.includes(conversation.model) ? conversation.model : state.settings.model;
  const gone = fillPicker(ui.model, state.modelCards, wanted);
  if (gone && gone !== state.goneModel) toast(`${gone} is no longer served by the server: pick another model.`);
  state.goneModel = gone;
  ui.model.disabled = !state.models.length;
  showAttach();
  showSpeech();
  // A reply waiting for its first token says whether its model is loading.
  for (const run of state.runs.values()) if (!run.first) renderSoon(run.conversation, run.reply);
}

// A request for a model that is not loaded waits for its load: the list is read again
// while no token has come (and the page is shown), so the picker and the waiting reply
// show the server's "loading"; a model loaded already answers before the first look.
function watchLoad(run) {
  if (!statusOf(run.model)) return; // a server that reports no states
  const waiting = () => !run.first && state.runs.get(run.conversation.id) === run;
  const look = async () => {
    if (!waiting()) return;
    if (!document.hidden) await refresh.now(true);
    if (waiting() && ["unloaded", "loading", "unloading"].includes(statusOf(run.model))) run.loadTimer = setTimeout(look, LOAD_LOOK_MS);
  };
  run.loadTimer = setTimeout(look, LOAD_FIRST_LOOK_MS);
}

function showKeyBanner(sentence) {
  ui.keyMessage.textContent = sentence;
  ui.keyBanner.hidden = false;
  ui.keyInput.value = state.key;
  ui.remember.checked = Boolean(store.rememberedKey());
}

function hideKeyBanner() {
  ui.keyBanner.hidden = true;
}

function useKey(event) {
  event.preventDefault();
  state.key = ui.keyInput.value.trim();
  store.rememberKey(ui.remember.checked ? state.key : "");
  for (const socket of state.sockets.values()) socket.close(); // opened with the old key
  refresh.now();
  ui.prompt.focus();
}

const FIELDS = [
  "system",
  "temperature",
  "top_p",
  "top_k",
  "min_p",
  "presence_penalty",
  "frequency_penalty",
  "repetition_penalty",
  "max_tokens",
  "seed",
  "stop",
  "response_format",
  "top_logprobs",
  "extra",
  "theme",
];
const fieldOf = (name) => $("#s-" + name.replaceAll("_", "-"));

function bindSettings() {
  for (const name of FIELDS) {
    const input = fieldOf(name);
    input.value = state.settings[name] ?? "";
    input.addEventListener(input.tagName === "SELECT" ? "change" : "input", () => {
      state.settings[name] = input.value;
      if (name === "top_logprobs") resetProbabilities();
      if (name === "theme") applyTheme();
      store.saveSettings(state.settings);
    });
  }
  for (const name of ["logprobs", "demo_tool"]) {
    const box = fieldOf(name);
    box.checked = Boolean(state.settings[name]);
    box.addEventListener("change", () => {
      state.settings[name] = box.checked;
      resetProbabilities();
      store.saveSettings(state.settings);
    });
  }
  const own = $("#c-system");
  own.addEventListener("input", () => {
    const conversation = current();
    if (!conversation) return;
    conversation.system = own.value;
    saveSoon(conversation);
  });
  ui.tokenView.checked = state.settings.tokenView;
  ui.tokenView.addEventListener("change", () => {
    state.settings.tokenView = ui.tokenView.checked;
    store.saveSettings(state.settings);
    renderMessages();
  });
  ui.model.addEventListener("change", () => {
    if (state.goneModel) state.goneModel = fillPicker(ui.model, state.modelCards, null); // another chosen: the gone one goes
    state.settings.model = ui.model.value;
    store.saveSettings(state.settings);
    const conversation = current();
    if (conversation && conversation.messages.length) {
      conversation.model = ui.model.value;
      save(conversation);
    }
  });
  const modes = [...ui.modes.querySelectorAll("[role=radio]")];
  const choose = (button) => {
    state.settings.api = button.dataset.mode;
    store.saveSettings(state.settings);
    showMode();
  };
  for (const button of modes) {
    button.addEventListener("click", () => choose(button));
    // A radio group: arrows move the choice, one Tab stop for the group.
    button.addEventListener("keydown", (event) => {
      const step = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1 }[event.key];
      if (!step) return;
      event.preventDefault();
      const next = modes[(modes.indexOf(button) + step + modes.length) % modes.length];
      choose(next);
      next.focus();
    });
  }
  showMode();
  resetProbabilities();
  applyTheme();
  $("#reset-settings").addEventListener("click", () => {
    const { api, model, tokenView, theme } = state.settings;
    state.settings = { ...store.DEFAULT_SETTINGS, api, model, tokenView, theme };
    store.saveSettings(state.settings);
    bindValues();
  });
}

function bindValues() {
  for (const name of FIELDS) fieldOf(name).value = state.settings[name] ?? "";
  for (const name of ["logprobs", "demo_tool"]) fieldOf(name).checked = Boolean(state.settings[name]);
  resetProbabilities();
}

function applyTheme() {
  const theme = state.settings.theme;
  if (theme === "light" || theme === "dark") document.documentElement.dataset.theme = theme;
  else delete document.documentElement.dataset.theme;
}

function resetProbabilities() {
  const top = parseInt(state.settings.top_logprobs, 10);
  state.probabilities = { logprobs: Boolean(state.settings.logprobs), top: Number.isFinite(top) && top > 0 ? Math.min(top, 20) : null };
}

function showMode() {
  if (!API_MODES[state.settings.api]) state.settings.api = "chat";
  for (const button of ui.modes.querySelectorAll("[role=radio]")) {
    const on = button.dataset.mode === state.settings.api;
    button.setAttribute("aria-checked", String(on));
    button.tabIndex = on ? 0 : -1;
    button.classList.toggle("on", on);
  }
}

// ---- panels: settings, and the conversations on a narrow screen -----------------------------

function openSettings() {
  ui.settings.hidden = false;
  ui.app.classList.add("settings-open");
  ui.settingsToggle.setAttribute("aria-expanded", "true");
  showBackdrop();
  $("#close-settings").focus();
}

function closeSettings(restoreFocus = true) {
  if (ui.settings.hidden) return;
  ui.settings.hidden = true;
  ui.app.classList.remove("settings-open");
  ui.settingsToggle.setAttribute("aria-expanded", "false");
  showBackdrop();
  if (restoreFocus) ui.settingsToggle.focus();
}

function openSidebar() {
  ui.app.classList.add("sidebar-open");
  ui.menu.setAttribute("aria-expanded", "true");
  showBackdrop();
  $("#new-chat").focus();
}

function closeSidebar(restoreFocus = false) {
  if (!ui.app.classList.contains("sidebar-open")) return;
  ui.app.classList.remove("sidebar-open");
  ui.menu.setAttribute("aria-expanded", "false");
  showBackdrop();
  if (restoreFocus) ui.menu.focus();
}

// A backdrop behind a panel that covers the chat (any panel on a narrow screen; on a
// wide one Settings takes a column of its own and the chat narrows).
function showBackdrop() {
  const covering = ui.app.classList.contains("sidebar-open") || (!ui.settings.hidden && window.matchMedia("(max-width: 1100px)").matches);
  ui.backdrop.hidden = !covering;
}

// ---- export / import ---------------------------------------------------------------------

function exportConversations() {
  const doc = store.exportDocument(state.conversations.filter((c) => c.messages.length));
  const blob = new Blob([JSON.stringify(doc, null, 2)], { type: "application/json" });
  const url = URL.createObjectURL(blob);
  const link = h("a", { href: url, download: `ovtrio-conversations-${new Date().toISOString().slice(0, 10)}.json` });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

async function importConversations(file) {
  let imported, refused;
  try {
    ({ conversations: imported, refused } = store.readExport(await file.text()));
  } catch (error) {
    toast(error.message);
    return;
  }
  const known = new Map(state.conversations.map((c) => [c.id, c]));
  let added = 0;
  for (const conversation of imported) {
    const existing = known.get(conversation.id);
    if (existing && JSON.stringify(existing.messages) === JSON.stringify(conversation.messages)) continue;
    if (existing) conversation.id = store.newId("c_");
    state.conversations.unshift(conversation);
    save(conversation);
    added++;
  }
  const said = added ? `Imported ${added} conversation${added > 1 ? "s" : ""}.` : "Those conversations are already here.";
  const left = refused.length ? ` ${refused.length} left out: ${refused[0]}${refused.length > 1 ? ` (and ${refused.length - 1} more)` : ""}.` : "";
  toast(said + left);
  if (added) select(state.conversations[0].id);
}

// ---- attachments ----------------------------------------------------------------------------
// When /v1/models says the model reads images (`input_modalities` containing "image"),
// the attach button, paste and drop put data URLs on the next user message as `images`
// (kept with the conversation); api.js sends them as image parts. The server checks
// their size and number and answers a 400 the reply shows as a sentence.

function modelTakesImages() {
  const card = state.modelCards.find((m) => m.id === ui.model.value);
  const modalities = (card && (card.input_modalities || (card.capabilities && card.capabilities.input_modalities))) || [];
  return Array.isArray(modalities) && modalities.includes("image");
}

function showAttach() {
  const takes = modelTakesImages();
  ui.attach.hidden = !takes;
  ui.attach.disabled = !takes;
  ui.picker.disabled = !takes;
  showConstraints();
}

// When /v1/models says the model's output cannot be constrained (`structured_output`
// not available: XGrammar missing), the response-format control says why and is off:
// a JSON reply would only come back as a 400.
function showConstraints() {
  const card = state.modelCards.find((m) => m.id === ui.model.value);
  const constrain = card && card.structured_output;
  const unavailable = Boolean(constrain && constrain.available === false);
  const format = $("#s-response-format");
  format.disabled = unavailable;
  format.title = unavailable ? `Unavailable: ${constrain.reason || "this server cannot constrain output"}` : "";
  if (unavailable && format.value) {
    format.value = "";
    state.settings.response_format = ""; // for this model only: not saved
  }
}

function showPendingImages() {
  const urls = state.images;
  const files = state.files;
  ui.pendingImages.hidden = !urls.length && !files.length;
  const parts = [];
  if (urls.length) {
    parts.push(
      thumbnails(urls, (i) => {
        state.images.splice(i, 1);
        showPendingImages();
      })
    );
  }
  if (files.length) {
    parts.push(
      fileChips(files, (i) => {
        state.files.splice(i, 1);
        showPendingImages();
      })
    );
  }
  ui.pendingImages.replaceChildren(...parts);
  ui.attach.textContent = urls.length ? `Image (${urls.length})` : "Image";
}

// Files picked, pasted or dropped: images (for a model that reads them) and text files
// are attached; anything else is refused here with a sentence and never sent.
async function attachImages(files) {
  if (state.transcriber) {
    const audio = files.filter(isAudio);
    if (audio.length) transcribeFiles(audio);
    files = files.filter((file) => !isAudio(file));
  }
  if (!files.length) return;
  const images = files.filter((file) => file.type.startsWith("image/"));
  if (images.length && !modelTakesImages()) {
    toast(`${ui.model.value || "This model"} does not read images.`);
    return;
  }
  const refused = [];
  const tooBig = [];
  const unreadable = [];
  for (const file of files) {
    const image = file.type.startsWith("image/");
    const pdf = !image && isPdf(file);
    if (!image && !pdf && !isText(file)) {
      refused.push(file.name || "the file");
      continue;
    }
    if (!image && !pdf && file.size > TEXT_LIMIT) {
      tooBig.push(file.name || "the file");
      continue;
    }
    // Kept in the set until read: a send meanwhile waits for it (submitPrompt).
    const reading = image ? readAsDataURL(file) : pdf ? file.arrayBuffer().then(pdfText) : file.text();
    state.reading.add(reading);
    try {
      const read = await reading;
      if (image) state.images.push(read);
      else if (pdf && !read.trim()) unreadable.push(file.name || "the PDF");
      else state.files.push({ name: file.name || "file.txt", text: read.slice(0, TEXT_LIMIT) });
    } catch {
      refused.push(file.name || "the file");
    } finally {
      state.reading.delete(reading);
    }
  }
  showPendingImages();
  const sentences = [];
  if (refused.length) sentences.push(`Not attached: ${refused.join(", ")} ${refused.length > 1 ? "are not images or text files" : "is not an image or a text file"} the browser could read.`);
  if (tooBig.length) sentences.push(`Not attached: ${tooBig.join(", ")} (text files of 1 MB at most).`);
  if (unreadable.length) sentences.push(`Not attached: ${unreadable.join(", ")} holds no text (a scan?).`);
  if (sentences.length) toast(sentences.join(" "));
}

function bindImages() {
  const textPicker = $("#attach-text-file");
  $("#attach-text").addEventListener("click", () => textPicker.click());
  textPicker.addEventListener("change", () => {
    attachImages([...textPicker.files]);
    textPicker.value = "";
  });
  ui.attach.addEventListener("click", () => ui.picker.click());
  ui.picker.addEventListener("change", () => {
    attachImages([...ui.picker.files]);
    ui.picker.value = "";
  });
  ui.prompt.addEventListener("paste", (event) => {
    const files = [...(event.clipboardData ? event.clipboardData.files : [])];
    if (!files.length) return; // text pastes as text
    event.preventDefault();
    attachImages(files);
  });
  // A file dropped anywhere on the page is attached (or refused), never opened by the
  // browser in place of the page.
  const carriesFiles = (event) => event.dataTransfer && [...event.dataTransfer.types].includes("Files");
  document.addEventListener("dragover", (event) => {
    if (!carriesFiles(event)) return;
    event.preventDefault();
    event.dataTransfer.dropEffect = modelTakesImages() ? "copy" : "none";
  });
  document.addEventListener("drop", (event) => {
    if (!carriesFiles(event)) return;
    event.preventDefault();
    attachImages([...event.dataTransfer.files]);
  });
  ui.model.addEventListener("change", showAttach);
  showPendingImages();
}

// ---- reading aloud ----------------------------------------------------------------------------
// When /v1/models lists a model of kind "speech", a reply has a Read aloud button: its
// answer (not its reasoning) goes to /v1/audio/speech and plays; a second click, or
// another reply's button, stops it. A refusal shows above the box.

function readAloudButton(text) {
  const button = h("button", { class: "ghost small read-aloud", type: "button", text: "Read aloud", "aria-pressed": "false" });
  button.addEventListener("click", () => readAloud(button, text));
  return button;
}

async function readAloud(button, text) {
  const again = state.aloud && state.aloud.button === button;
  stopReading();
  if (again) return;
  button.disabled = true;
  button.textContent = "Reading…";
  try {
    const blob = await speak(text, state.speaker, state.key);
    const url = URL.createObjectURL(blob);
    const audio = new Audio(url);
    state.aloud = { audio, button, url };
    audio.addEventListener("ended", () => state.aloud && state.aloud.audio === audio && stopReading());
    button.disabled = false;
    button.textContent = "Stop reading";
    button.setAttribute("aria-pressed", "true");
    await audio.play();
  } catch (error) {
    if (state.aloud && state.aloud.button === button) stopReading();
    button.disabled = false;
    button.textContent = "Read aloud";
    if (error instanceof ApiError && error.status === 401) keyRefused(error);
    speechStatus(`Not read aloud: ${error.message || error}`, true);
  }
}

function stopReading() {
  const aloud = state.aloud;
  if (!aloud) return;
  state.aloud = null;
  aloud.audio.pause();
  URL.revokeObjectURL(aloud.url);
  aloud.button.textContent = "Read aloud";
  aloud.button.setAttribute("aria-pressed", "false");
}

// ---- speech ---------------------------------------------------------------------------------
// When /v1/models lists a model of kind "transcription", the microphone button records
// and an audio file (picked, pasted or dropped) is sent to /v1/audio/transcriptions: the
// text comes back into the message box at its cursor, to be read and sent. What happens
// meanwhile, and a refusal (the server's sentence), shows above the box.

function showSpeech() {
  const offered = Boolean(state.transcriber);
  ui.audioButton.hidden = !offered;
  ui.mic.hidden = !offered || !canRecord();
  if (!offered) speechStatus("");
}

function speechStatus(text, error = false) {
  ui.speechStatus.textContent = text;
  ui.speechStatus.hidden = !text;
  ui.speechStatus.classList.toggle("error", error);
}

// One audio file after another, each into the box where the cursor is.
async function transcribeFiles(files) {
  for (const file of files) await transcribeInto(file, file.name || "audio");
}

async function transcribeInto(audio, name) {
  speechStatus(`Transcribing ${name}…`);
  ui.mic.disabled = true;
  const reading = transcribe(audio, name, state.transcriber, state.key);
  state.reading.add(reading); // a send meanwhile waits for the text
  try {
    const text = await reading;
    insertAtCursor(ui.prompt, text);
    speechStatus("");
    ui.prompt.focus();
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) keyRefused(error);
    speechStatus(`Not transcribed: ${name}: ${error.message || error}`, true);
  } finally {
    state.reading.delete(reading);
    ui.mic.disabled = false;
  }
}

async function toggleRecording() {
  if (state.recording) {
    const recording = state.recording;
    state.recording = null;
    ui.mic.setAttribute("aria-pressed", "false");
    ui.mic.textContent = "Mic";
    const { blob, name } = await recording.stop();
    await transcribeInto(blob, name);
    return;
  }
  const recording = new Recording();
  try {
    await recording.start();
  } catch (error) {
    speechStatus(`The microphone is not available: ${error.message || error.name || error}`, true);
    return;
  }
  state.recording = recording;
  ui.mic.setAttribute("aria-pressed", "true");
  ui.mic.textContent = "Stop recording";
  speechStatus("Recording… press Stop recording to transcribe.");
}

function bindSpeech() {
  const picker = $("#attach-audio-file");
  ui.audioButton.addEventListener("click", () => picker.click());
  picker.addEventListener("change", () => {
    transcribeFiles([...picker.files]);
    picker.value = "";
  });
  ui.mic.addEventListener("click", toggleRecording);
}

// ---- little things --------------------------------------------------------------------------

let toastTimer = null;
function toast(text) {
  ui.toast.textContent = text;
  ui.toast.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => (ui.toast.hidden = true), 6000);
}

// Said once to a screen reader when a reply ends (the streaming text itself is not a
// live region: it would be read again at every frame).
function announce(text) {
  ui.announce.textContent = "";
  requestAnimationFrame(() => (ui.announce.textContent = text));
}

function autosize() {
  ui.prompt.style.height = "auto";
  ui.prompt.style.height = Math.min(ui.prompt.scrollHeight, 240) + "px";
}

function showPromptHint() {
  ui.prompt.placeholder = coarse.matches ? "Message the model" : "Message the model (Enter sends, Shift+Enter adds a line)";
}

function bindComposer() {
  ui.composer.addEventListener("submit", (event) => {
    event.preventDefault();
    submitPrompt();
  });
  ui.prompt.addEventListener("keydown", (event) => {
    // On a touch screen Enter adds a line (the keyboard has no Shift+Enter); Send sends.
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing && !coarse.matches) {
      event.preventDefault();
      submitPrompt();
    }
  });
  ui.prompt.addEventListener("input", autosize);
  ui.stop.addEventListener("click", stop);
  showPromptHint();
  coarse.addEventListener("change", showPromptHint);
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape") return;
    if (!ui.settings.hidden) {
      event.preventDefault();
      closeSettings();
    } else if (ui.app.classList.contains("sidebar-open")) {
      event.preventDefault();
      closeSidebar(true);
    } else if (runOf(current())) {
      event.preventDefault();
      stop();
    }
  });
}

// A reply that was streaming when the page went away is marked so, not left as if it
// had ended.
function markInterrupted(conversation) {
  let changed = false;
  for (const m of conversation.messages) {
    if (m.role === "assistant" && m.stats && !m.stats.finish && !m.error) {
      m.stats.finish = "interrupted";
      changed = true;
    }
  }
  return changed;
}

async function init() {
  bindComposer();
  bindSettings();
  bindImages();
  bindSpeech();
  $("#new-chat").addEventListener("click", startNew);
  $("#export").addEventListener("click", exportConversations);
  const importFile = $("#import-file");
  $("#import").addEventListener("click", () => importFile.click());
  importFile.addEventListener("change", () => {
    if (importFile.files[0]) importConversations(importFile.files[0]);
    importFile.value = "";
  });
  ui.search.addEventListener("input", () => {
    state.search = ui.search.value.trim();
    renderConversations();
  });
  ui.settingsToggle.addEventListener("click", () => (ui.settings.hidden ? openSettings() : closeSettings()));
  $("#close-settings").addEventListener("click", () => closeSettings());
  ui.menu.addEventListener("click", () => (ui.app.classList.contains("sidebar-open") ? closeSidebar(true) : openSidebar()));
  ui.backdrop.addEventListener("click", () => {
    closeSidebar(true);
    closeSettings(false);
  });
  narrow.addEventListener("change", () => {
    closeSidebar();
    showBackdrop();
  });
  // Leaving the page: the writes due while replies stream are started at once.
  window.addEventListener("pagehide", () => {
    for (const id of [...state.saveTimers.keys()]) {
      const conversation = state.conversations.find((c) => c.id === id);
      if (conversation) save(conversation);
    }
  });
  $("#key-form").addEventListener("submit", useKey);
  $("#show-key").addEventListener("click", () => showKeyBanner("Enter the key this server expects, if it needs one."));
  installTokenTips(ui.messages, ui.tip);

  const { list, available } = await store.loadConversations();
  state.conversations = list;
  for (const conversation of list) if (markInterrupted(conversation)) save(conversation);
  if (!available) toast("This browser keeps no conversations here (IndexedDB is not available): they last until the page closes.");
  const latest = [...state.conversations].sort((a, b) => b.updated - a.updated)[0];
  state.currentId = latest ? latest.id : null;
  $("#c-system").value = (latest && latest.system) || "";
  renderConversations();
  renderMessages();
  ui.prompt.disabled = false;
  if (!coarse.matches) ui.prompt.focus();
  document.documentElement.dataset.ready = "true";
  performance.mark("playground-ready");

  refresh.now();
  refresh.start(ui.model);
  new ServerPanel(
    { running: $("#m-running"), queued: $("#m-queued"), kv: $("#m-kv"), kvBar: $("#m-kv-bar"), rate: $("#m-rate"), status: $("#panel-status"), spark: $("#m-spark") },
    () => state.key,
    () => ui.model.value
  ).start();
}

init();
