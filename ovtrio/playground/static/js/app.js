// The playground's main module: wires the page to the server and to what the browser
// keeps. Everything the user or the model writes is inserted as text (dom.js,
// markdown.js); the page's Content-Security-Policy forbids inline script besides.

import { $, h, copyText, flash } from "./dom.js";
import { renderMarkdown } from "./markdown.js";
import { API_MODES, ApiError, ResponsesSocket, buildRequest, getJSON, send } from "./api.js";
import { ServerPanel } from "./metrics.js";
import { curlSnippet, pythonSnippet } from "./snippets.js";
import { installTokenTips, renderTokens } from "./tokens.js";
import * as store from "./store.js";

const state = {
  settings: store.loadSettings(),
  conversations: store.loadConversations(),
  currentId: null,
  key: store.rememberedKey(),
  models: [],
  modelCards: [],
  images: [], // data URLs waiting for the next message
  running: null,
  probabilities: { logprobs: true, top: null },
  socket: new ResponsesSocket(),
  requests: new WeakMap(), // reply -> the request that produced it
  views: new WeakMap(), // message -> its element
  pending: new Set(), // replies waiting for their next render
};

const ui = {
  prompt: $("#prompt"),
  attach: $("#attach"),
  picker: $("#attach-file"),
  pendingImages: $("#pending-images"),
  composer: $("#composer"),
  send: $("#send"),
  stop: $("#stop"),
  messages: $("#messages"),
  conversations: $("#conversations"),
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
};

// ---- conversations ------------------------------------------------------------

function current() {
  return state.conversations.find((c) => c.id === state.currentId) || null;
}

function save() {
  if (!store.saveConversations(state.conversations)) toast("The browser's storage is full: this conversation is not kept.");
}

function select(id) {
  state.currentId = id;
  renderConversations();
  renderMessages();
  ui.prompt.focus();
}

function startNew() {
  const empty = state.conversations.find((c) => !c.messages.length);
  if (empty) return select(empty.id);
  const conversation = store.newConversation();
  state.conversations.unshift(conversation);
  save();
  select(conversation.id);
}

function renderConversations() {
  const list = [...state.conversations].sort((a, b) => b.updated - a.updated);
  ui.conversations.replaceChildren(
    ...list.map((c) => {
      const title = h("button", { class: "conv-title", type: "button", title: c.title, text: c.title, onclick: () => select(c.id) });
      const rename = h("button", { class: "conv-rename ghost", type: "button", title: "Rename", "aria-label": "Rename", text: "✎" });
      const remove = h("button", { class: "conv-delete ghost", type: "button", title: "Delete", "aria-label": "Delete", text: "✕" });
      const row = h("div", { class: "conv" + (c.id === state.currentId ? " active" : ""), "data-id": c.id }, title, rename, remove);
      rename.addEventListener("click", () => renameInline(c, row, title));
      remove.addEventListener("click", () => {
        if (!remove.classList.contains("confirm")) {
          remove.classList.add("confirm");
          remove.textContent = "Delete?";
          setTimeout(() => {
            remove.classList.remove("confirm");
            remove.textContent = "✕";
          }, 3000);
          return;
        }
        if (state.running && state.running.conversation === c) stop();
        state.conversations = state.conversations.filter((x) => x !== c);
        save();
        if (state.currentId === c.id) state.currentId = state.conversations[0] ? state.conversations[0].id : null;
        renderConversations();
        renderMessages();
      });
      return row;
    })
  );
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
      save();
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
  return h(
    "div",
    { class: "empty-state" },
    h("div", { class: "empty-mark", "aria-hidden": "true" }),
    h("h1", { text: "Try the model" }),
    h("p", { text: "Ask anything below. Replies stream from this server; switch the API above to compare Chat Completions, Responses and Responses over a WebSocket." }),
    h(
      "ul",
      { class: "hints" },
      h("li", null, h("kbd", { text: "Enter" }), " sends, ", h("kbd", { text: "Shift" }), "+", h("kbd", { text: "Enter" }), " adds a line"),
      h("li", null, h("kbd", { text: "Esc" }), " stops a reply"),
      h("li", { text: "Token view colours each token by its probability" })
    )
  );
}

function messageView(conversation, message, index) {
  const el = h("article", { class: "msg " + message.role });
  state.views.set(message, el);
  fillMessage(el, conversation, message, index);
  return el;
}

function fillMessage(el, conversation, message, index) {
  const busy = Boolean(state.running);
  const live = state.running && state.running.reply === message;
  el.classList.toggle("streaming", Boolean(live));
  const parts = [];
  if (message.role === "user") {
    if (message.images && message.images.length) parts.push(thumbnails(message.images));
    if (message.content || !message.images || !message.images.length) parts.push(h("div", { class: "bubble", text: message.content }));
    parts.push(
      h(
        "div",
        { class: "actions" },
        h("button", { class: "ghost small", type: "button", text: "Edit", disabled: busy, onclick: () => editMessage(el, conversation, index) }),
        copyButton(() => message.content)
      )
    );
  } else {
    parts.push(h("div", { class: "who", text: (message.stats && message.stats.model) || "assistant" }));
    if (message.reasoning) {
      const details = h("details", { class: "reasoning" }, h("summary", { text: live && !message.content ? "Reasoning…" : "Reasoning" }), h("div", { class: "reasoning-body", text: message.reasoning }));
      parts.push(details);
    }
    const body = h("div", { class: "content" });
    if (state.settings.tokenView && message.tokens && message.tokens.length) body.append(renderTokens(message.tokens));
    else if (message.content) body.append(renderMarkdown(message.content));
    else if (live) body.append(h("span", { class: "typing", "aria-label": "waiting for the first token" }, h("i"), h("i"), h("i")));
    if (state.settings.tokenView && !(message.tokens && message.tokens.length) && message.content) {
      body.prepend(h("p", { class: "note", text: "No token probabilities were recorded for this reply." }));
    }
    parts.push(body);
    if (message.error) parts.push(h("p", { class: "error", role: "alert", text: message.error }));
    if (!live) {
      const stats = statsView(message.stats);
      const actions = h(
        "div",
        { class: "actions" },
        h("button", { class: "ghost small", type: "button", text: "Regenerate", disabled: busy, onclick: () => regenerate(conversation, index) }),
        copyButton(() => message.content)
      );
      const request = state.requests.get(message);
      if (request) {
        actions.append(
          copyButton(() => curlSnippet(request, Boolean(state.key)), "Copy as curl"),
          copyButton(() => pythonSnippet(request, Boolean(state.key)), "Copy as Python")
        );
      }
      parts.push(h("div", { class: "foot" }, stats, actions));
    }
  }
  el.replaceChildren(...parts);
}

function copyButton(text, label = "Copy") {
  const button = h("button", { class: "ghost small", type: "button", text: label });
  button.addEventListener("click", async () => flash(button, (await copyText(text())) ? "Copied" : "Copy failed"));
  return button;
}

function statsView(stats) {
  if (!stats) return h("div", { class: "stats" });
  const items = [];
  const add = (label, value) => value != null && value !== "" && items.push(h("span", { class: "stat" }, h("b", { text: value }), " " + label));
  add("to first token", stats.ttft != null ? formatMs(stats.ttft) : null);
  if (stats.whole) items.push(h("span", { class: "stat", text: "arrived whole (scored once it ended)" }));
  add("tok/s", stats.tps != null ? stats.tps.toFixed(1) : null);
  add("prompt", stats.prompt);
  add("completion", stats.completion);
  add("cached", stats.cached != null ? stats.cached : stats.prompt != null ? "–" : null);
  if (stats.mode) items.push(h("span", { class: "stat mode", text: API_MODES[stats.mode] || stats.mode }));
  if (stats.finish && stats.finish !== "stop") items.push(h("span", { class: "stat finish", text: stats.finish }));
  return h("div", { class: "stats" }, items);
}

function formatMs(ms) {
  return ms >= 1000 ? (ms / 1000).toFixed(2) + " s" : Math.round(ms) + " ms";
}

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
    if ((!area.value.trim() && !images.length) || state.running) return;
    const edited = { ...message, content: area.value };
    if (images.length) edited.images = images;
    else delete edited.images;
    conversation.messages = [...conversation.messages.slice(0, index), edited];
    generate(conversation);
  });
  area.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      saveButton.click();
    }
  });
  el.replaceChildren(imageBox, area, h("div", { class: "actions" }, saveButton, cancel));
  area.focus();
}

function regenerate(conversation, index) {
  if (state.running) return;
  conversation.messages = conversation.messages.slice(0, index);
  generate(conversation);
}

// Re-render a streaming reply at most once a frame.
function schedule(reply) {
  if (state.pending.has(reply)) return;
  state.pending.add(reply);
  requestAnimationFrame(() => {
    state.pending.delete(reply);
    const el = state.views.get(reply);
    const conversation = current();
    if (!el || !el.isConnected || !conversation) return;
    const atBottom = ui.messages.scrollHeight - ui.messages.scrollTop - ui.messages.clientHeight < 80;
    fillMessage(el, conversation, reply, conversation.messages.indexOf(reply));
    if (atBottom) ui.messages.scrollTop = ui.messages.scrollHeight;
  });
}

// ---- sending ------------------------------------------------------------------------

function submitPrompt() {
  const text = ui.prompt.value;
  if ((!text.trim() && !state.images.length) || state.running) return;
  if (!ui.model.value) {
    toast(state.models.length ? "Pick a model first." : "The server lists no model yet.");
    return;
  }
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
  showPendingImages();
  conversation.messages.push(message);
  if (conversation.title === "New chat") conversation.title = text.trim().replace(/\s+/g, " ").slice(0, 48) || "Image";
  ui.prompt.value = "";
  autosize();
  generate(conversation);
}

async function generate(conversation) {
  const history = conversation.messages.slice();
  const mode = state.settings.api;
  const model = ui.model.value;
  const reply = { role: "assistant", content: "", tokens: [], stats: { mode, model } };
  conversation.messages.push(reply);
  conversation.updated = Date.now();
  const controller = new AbortController();
  state.running = { controller, reply, conversation };
  setRunning(true);
  save();
  renderConversations();
  if (state.currentId === conversation.id) renderMessages();

  const started = performance.now();
  let first = null;
  let last = null;
  let usage = null;
  const mark = () => {
    last = performance.now();
    if (first === null) first = last;
  };
  const sink = {
    text(delta, tokens) {
      if (delta || tokens.length) mark();
      reply.content += delta;
      if (tokens.length) reply.tokens.push(...tokens);
      schedule(reply);
    },
    reasoning(delta) {
      mark();
      reply.reasoning = (reply.reasoning || "") + delta;
      schedule(reply);
    },
    usage(u) {
      usage = u;
    },
    responseId(id) {
      reply.responseId = id;
    },
    finish(reason) {
      reply.stats.finish = reason;
    },
  };

  let chain = true;
  for (let attempt = 0; attempt < 4; attempt++) {
    let request;
    try {
      request = buildRequest({ mode, model, settings: state.settings, history, probabilities: state.probabilities, chain });
    } catch (error) {
      reply.error = error.message;
      break;
    }
    state.requests.set(reply, request);
    try {
      await send(request, { key: state.key, signal: controller.signal, sink, socket: state.socket });
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
    ttft: first !== null ? ended >= first ? first - started : null : null,
    prompt: usage ? usage.prompt : undefined,
    completion: usage ? usage.completion : reply.tokens.length || undefined,
    cached: usage ? usage.cached : undefined,
  });
  const generated = reply.stats.completion;
  // A reply asked with alternatives comes whole once the server has scored it: its
  // tokens all arrive within a few milliseconds, so the rate is over the whole request.
  if (first !== null && generated > 4 && last - first < 25) {
    reply.stats.whole = true;
    reply.stats.ttft = null;
    reply.stats.tps = (generated * 1000) / (ended - started);
  } else if (first !== null && generated > 1 && ended > first) {
    reply.stats.tps = ((generated - 1) * 1000) / (ended - first);
  }
  if (!reply.tokens.length) delete reply.tokens;
  if (!reply.stats.finish && !reply.error) reply.stats.finish = "stop";
  state.running = null;
  conversation.updated = Date.now();
  save();
  setRunning(false);
  if (state.currentId === conversation.id) renderMessages();
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
  const sentence = state.key
    ? "The server refused this API key. Check it and send again."
    : "This server needs an API key. Enter it above and send again.";
  showKeyBanner(sentence);
  return sentence;
}

function stop() {
  if (state.running) state.running.controller.abort();
}

function setRunning(running) {
  ui.send.hidden = running;
  ui.stop.hidden = !running;
  document.body.classList.toggle("running", running);
}

// ---- models, key, settings --------------------------------------------------------------

async function loadModels() {
  try {
    const list = await getJSON("/v1/models", state.key);
    // Only models that chat: /v1/models also lists embedding, rerank and
    // transcription models, each card's `kind` says which.
    state.modelCards = (list.data || []).filter((m) => !m.kind || m.kind === "generation");
    state.models = state.modelCards.map((m) => m.id);
    hideKeyBanner();
  } catch (error) {
    state.models = [];
    if (error instanceof ApiError && error.status === 401) keyRefused(error);
    else toast("Could not list the models: " + (error.message || error));
  }
  const wanted = state.settings.model;
  ui.model.replaceChildren(...state.models.map((id) => h("option", { value: id, text: id })));
  if (state.models.includes(wanted)) ui.model.value = wanted;
  ui.model.disabled = !state.models.length;
  showAttach();
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
  state.socket.close(); // a socket opened with the old key
  loadModels();
  ui.prompt.focus();
}

const FIELDS = ["system", "temperature", "top_p", "max_tokens", "seed", "stop", "top_logprobs", "extra"];

function bindSettings() {
  for (const name of FIELDS) {
    const input = $("#s-" + name.replace("_", "-"));
    input.value = state.settings[name] ?? "";
    input.addEventListener("input", () => {
      state.settings[name] = input.value;
      if (name === "top_logprobs") resetProbabilities();
      store.saveSettings(state.settings);
    });
  }
  const logprobs = $("#s-logprobs");
  logprobs.checked = state.settings.logprobs;
  logprobs.addEventListener("change", () => {
    state.settings.logprobs = logprobs.checked;
    resetProbabilities();
    store.saveSettings(state.settings);
  });
  ui.tokenView.checked = state.settings.tokenView;
  ui.tokenView.addEventListener("change", () => {
    state.settings.tokenView = ui.tokenView.checked;
    store.saveSettings(state.settings);
    renderMessages();
  });
  ui.model.addEventListener("change", () => {
    state.settings.model = ui.model.value;
    store.saveSettings(state.settings);
  });
  for (const button of ui.modes.querySelectorAll("button")) {
    button.addEventListener("click", () => {
      state.settings.api = button.dataset.mode;
      store.saveSettings(state.settings);
      showMode();
    });
  }
  showMode();
  resetProbabilities();
  $("#reset-settings").addEventListener("click", () => {
    const { api, model, tokenView } = state.settings;
    state.settings = { ...store.DEFAULT_SETTINGS, api, model, tokenView };
    store.saveSettings(state.settings);
    bindValues();
  });
}

function bindValues() {
  for (const name of FIELDS) $("#s-" + name.replace("_", "-")).value = state.settings[name] ?? "";
  $("#s-logprobs").checked = state.settings.logprobs;
  resetProbabilities();
}

function resetProbabilities() {
  const top = parseInt(state.settings.top_logprobs, 10);
  state.probabilities = { logprobs: Boolean(state.settings.logprobs), top: Number.isFinite(top) && top > 0 ? Math.min(top, 20) : null };
}

function showMode() {
  if (!API_MODES[state.settings.api]) state.settings.api = "chat";
  for (const button of ui.modes.querySelectorAll("button")) {
    const on = button.dataset.mode === state.settings.api;
    button.setAttribute("aria-checked", String(on));
    button.classList.toggle("on", on);
  }
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
  let imported;
  try {
    imported = store.readExport(await file.text());
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
    added++;
  }
  save();
  toast(added ? `Imported ${added} conversation${added > 1 ? "s" : ""}.` : "Those conversations are already here.");
  if (added) select(state.conversations[0].id);
}

// ---- images ---------------------------------------------------------------------------------
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
}

function thumbnails(urls, onRemove = null) {
  return h(
    "div",
    { class: "attachments" },
    urls.map((url, i) => {
      const image = h("img", { class: "thumb", src: url, alt: `image ${i + 1}` });
      if (!onRemove) return image;
      const remove = h("button", { class: "thumb-remove", type: "button", title: "Remove", "aria-label": `Remove image ${i + 1}`, text: "✕", onclick: () => onRemove(i) });
      return h("span", { class: "thumb-box" }, image, remove);
    })
  );
}

function showPendingImages() {
  const urls = state.images;
  ui.pendingImages.hidden = !urls.length;
  ui.pendingImages.replaceChildren(
    ...(urls.length
      ? [
          thumbnails(urls, (i) => {
            state.images.splice(i, 1);
            showPendingImages();
          }),
        ]
      : [])
  );
  ui.attach.textContent = urls.length ? `Image (${urls.length})` : "Image";
}

function readAsDataURL(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

// Files picked, pasted or dropped: images are attached, anything else is refused here
// with a sentence and never sent.
async function attachImages(files) {
  if (!files.length) return;
  if (!modelTakesImages()) {
    toast(`${ui.model.value || "This model"} does not read images.`);
    return;
  }
  const refused = [];
  for (const file of files) {
    if (!file.type.startsWith("image/")) {
      refused.push(file.name || "the file");
      continue;
    }
    try {
      state.images.push(await readAsDataURL(file));
    } catch {
      refused.push(file.name || "the file");
    }
  }
  showPendingImages();
  if (refused.length) toast(`Not attached: ${refused.join(", ")} ${refused.length > 1 ? "are not images" : "is not an image"} the browser could read.`);
}

function bindImages() {
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

// ---- little things --------------------------------------------------------------------------

let toastTimer = null;
function toast(text) {
  ui.toast.textContent = text;
  ui.toast.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => (ui.toast.hidden = true), 4000);
}

function autosize() {
  ui.prompt.style.height = "auto";
  ui.prompt.style.height = Math.min(ui.prompt.scrollHeight, 240) + "px";
}

function bindComposer() {
  ui.composer.addEventListener("submit", (event) => {
    event.preventDefault();
    submitPrompt();
  });
  ui.prompt.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      submitPrompt();
    }
  });
  ui.prompt.addEventListener("input", autosize);
  ui.stop.addEventListener("click", stop);
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && state.running) {
      event.preventDefault();
      stop();
    }
  });
}

function init() {
  bindComposer();
  bindSettings();
  bindImages();
  $("#new-chat").addEventListener("click", startNew);
  $("#export").addEventListener("click", exportConversations);
  const importFile = $("#import-file");
  $("#import").addEventListener("click", () => importFile.click());
  importFile.addEventListener("change", () => {
    if (importFile.files[0]) importConversations(importFile.files[0]);
    importFile.value = "";
  });
  ui.settingsToggle.addEventListener("click", () => {
    const open = ui.settings.hidden;
    ui.settings.hidden = !open;
    ui.settingsToggle.setAttribute("aria-expanded", String(open));
  });
  $("#close-settings").addEventListener("click", () => {
    ui.settings.hidden = true;
    ui.settingsToggle.setAttribute("aria-expanded", "false");
  });
  $("#key-form").addEventListener("submit", useKey);
  $("#show-key").addEventListener("click", () => showKeyBanner("Enter the key this server expects, if it needs one."));
  installTokenTips(ui.messages, ui.tip);

  const latest = [...state.conversations].sort((a, b) => b.updated - a.updated)[0];
  state.currentId = latest ? latest.id : null;
  renderConversations();
  renderMessages();
  ui.prompt.disabled = false;
  ui.prompt.focus();
  document.documentElement.dataset.ready = "true";
  performance.mark("playground-ready");

  loadModels();
  new ServerPanel(
    { running: $("#m-running"), queued: $("#m-queued"), kv: $("#m-kv"), kvBar: $("#m-kv-bar"), rate: $("#m-rate"), status: $("#panel-status"), spark: $("#m-spark") },
    () => state.key,
    () => ui.model.value
  ).start();
}

init();
