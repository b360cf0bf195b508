// What the page keeps in the browser (localStorage): settings, conversations, and the
// API key only when the user asked for it to be remembered.

const SETTINGS = "ovtrio.settings";
const CONVERSATIONS = "ovtrio.conversations";
const KEY = "ovtrio.apiKey";
export const EXPORT_FORMAT = "ovtrio-playground-conversations";

export const DEFAULT_SETTINGS = {
  api: "chat",
  model: "",
  system: "",
  temperature: "",
  top_p: "",
  max_tokens: "",
  seed: "",
  stop: "",
  logprobs: true,
  // Alternatives need the finished reply (the server scores it once it ends), so a
  // reply asking for them arrives whole: off by default, the reply streams.
  top_logprobs: 0,
  extra: "",
  tokenView: false,
};

function read(name, fallback) {
  try {
    const raw = localStorage.getItem(name);
    return raw == null ? fallback : JSON.parse(raw);
  } catch {
    return fallback;
  }
}

function write(name, value) {
  try {
    localStorage.setItem(name, JSON.stringify(value));
    return true;
  } catch {
    return false; // full or disabled storage: the page goes on without keeping it
  }
}

export function loadSettings() {
  return { ...DEFAULT_SETTINGS, ...read(SETTINGS, {}) };
}

export function saveSettings(settings) {
  write(SETTINGS, settings);
}

export function loadConversations() {
  const list = read(CONVERSATIONS, []);
  return Array.isArray(list) ? list.filter(isConversation) : [];
}

export function saveConversations(list) {
  return write(CONVERSATIONS, list);
}

export function rememberedKey() {
  try {
    return localStorage.getItem(KEY) || "";
  } catch {
    return "";
  }
}

export function rememberKey(key) {
  try {
    if (key) localStorage.setItem(KEY, key);
    else localStorage.removeItem(KEY);
  } catch {
    // storage disabled: the key lives in memory only
  }
}

export function newId(prefix) {
  const bytes = crypto.getRandomValues(new Uint8Array(9));
  return prefix + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

export function newConversation() {
  const now = Date.now();
  return { id: newId("c_"), title: "New chat", created: now, updated: now, messages: [] };
}

function isMessage(m) {
  return m && typeof m === "object" && (m.role === "user" || m.role === "assistant") && typeof m.content === "string";
}

export function isConversation(c) {
  return (
    c && typeof c === "object" && typeof c.id === "string" && typeof c.title === "string" && Array.isArray(c.messages) && c.messages.every(isMessage)
  );
}

export function exportDocument(conversations) {
  return { format: EXPORT_FORMAT, version: 1, exported: new Date().toISOString(), conversations };
}

// The conversations of an exported file; throws an Error with a sentence for a bad one.
export function readExport(text) {
  let doc;
  try {
    doc = JSON.parse(text);
  } catch {
    throw new Error("The file is not JSON.");
  }
  const list = Array.isArray(doc) ? doc : doc && doc.conversations;
  if (!Array.isArray(list)) throw new Error("The file holds no conversations.");
  const good = list.filter(isConversation);
  if (!good.length) throw new Error("None of the file's conversations could be read.");
  return good.map((c) => ({
    id: c.id,
    title: c.title,
    created: Number(c.created) || Date.now(),
    updated: Number(c.updated) || Date.now(),
    messages: c.messages.map(cleanMessage),
  }));
}

// Only the fields the page knows, with their types: an imported file is data, not code.
function cleanMessage(m) {
  const out = { role: m.role, content: m.content };
  if (typeof m.reasoning === "string" && m.reasoning) out.reasoning = m.reasoning;
  if (typeof m.responseId === "string") out.responseId = m.responseId;
  if (typeof m.error === "string") out.error = m.error;
  if (Array.isArray(m.images)) out.images = m.images.filter((url) => typeof url === "string" && url.startsWith("data:image/"));
  if (m.stats && typeof m.stats === "object") {
    out.stats = {};
    for (const [k, v] of Object.entries(m.stats)) if (["number", "string", "boolean"].includes(typeof v)) out.stats[k] = v;
  }
  if (Array.isArray(m.tokens)) {
    out.tokens = m.tokens
      .filter((t) => t && typeof t.t === "string" && typeof t.lp === "number")
      .map((t) => ({
        t: t.t,
        lp: t.lp,
        top: Array.isArray(t.top) ? t.top.filter((a) => a && typeof a.t === "string" && typeof a.lp === "number").map((a) => ({ t: a.t, lp: a.lp })) : [],
      }));
  }
  return out;
}
