// What the page keeps in the browser: settings (localStorage), conversations (IndexedDB,
// one record per conversation, so that a write refused for a full disk loses only that
// conversation's latest change, never another conversation), and the API key only when
// the user asked for it to be remembered.

const SETTINGS = "ovtrio.settings";
const OLD_CONVERSATIONS = "ovtrio.conversations"; // where earlier versions kept them all
const KEY = "ovtrio.apiKey";
const DB_NAME = "ovtrio-playground";
const DB_STORE = "conversations";
export const EXPORT_FORMAT = "ovtrio-playground-conversations";

export const DEFAULT_SETTINGS = {
  api: "chat",
  model: "",
  system: "",
  temperature: "",
  top_p: "",
  top_k: "",
  min_p: "",
  presence_penalty: "",
  frequency_penalty: "",
  repetition_penalty: "",
  max_tokens: "",
  seed: "",
  stop: "",
  response_format: "",
  logprobs: true,
  // Alternatives need the finished reply (the server scores it once it ends), so a
  // reply asking for them arrives whole: off by default, the reply streams.
  top_logprobs: 0,
  extra: "",
  demo_tool: false,
  tokenView: false,
  theme: "system",
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

// ---- conversations (IndexedDB) ---------------------------------------------------------

function request(req) {
  return new Promise((resolve, reject) => {
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
}

let opened = null;
function database() {
  if (!opened) {
    opened = new Promise((resolve, reject) => {
      const req = indexedDB.open(DB_NAME, 1);
      req.onupgradeneeded = () => req.result.createObjectStore(DB_STORE, { keyPath: "id" });
      req.onsuccess = () => resolve(req.result);
      req.onerror = () => reject(req.error);
    });
  }
  return opened;
}

async function transaction(mode, work) {
  const db = await database();
  return new Promise((resolve, reject) => {
    const tx = db.transaction(DB_STORE, mode);
    let result;
    Promise.resolve(work(tx.objectStore(DB_STORE))).then((r) => (result = r), reject);
    tx.oncomplete = () => resolve(result);
    tx.onabort = () => reject(tx.error || new DOMException("The write was aborted.", "AbortError"));
    tx.onerror = () => reject(tx.error);
  });
}

// Every kept conversation; those an earlier version kept in localStorage move here once.
export async function loadConversations() {
  let list = [];
  try {
    list = await transaction("readonly", (store) => request(store.getAll()));
  } catch {
    return { list: read(OLD_CONVERSATIONS, []).filter(isConversation), available: false };
  }
  const old = read(OLD_CONVERSATIONS, null);
  if (Array.isArray(old)) {
    const known = new Set(list.map((c) => c.id));
    const moved = old.filter((c) => isConversation(c) && !known.has(c.id));
    try {
      for (const c of moved) await saveConversation(c);
      localStorage.removeItem(OLD_CONVERSATIONS);
      list = list.concat(moved);
    } catch {
      // kept where they were; tried again on the next load
    }
  }
  return { list: list.filter(isConversation), available: true };
}

// Resolves to null when kept, or to the browser's error (a QuotaExceededError when full).
export async function saveConversation(conversation) {
  try {
    await transaction("readwrite", (store) => request(store.put(conversation)));
    return null;
  } catch (error) {
    return error || new Error("not kept");
  }
}

export async function deleteConversation(id) {
  try {
    await transaction("readwrite", (store) => request(store.delete(id)));
  } catch {
    // nothing more to do: a conversation that was not kept is gone anyway
  }
}

// ---- the API key -------------------------------------------------------------------------

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
  return m && typeof m === "object" && ["user", "assistant", "tool"].includes(m.role) && typeof m.content === "string";
}

export function isConversation(c) {
  return (
    c && typeof c === "object" && typeof c.id === "string" && typeof c.title === "string" && Array.isArray(c.messages) && c.messages.every(isMessage)
  );
}

export function exportDocument(conversations) {
  return { format: EXPORT_FORMAT, version: 2, exported: new Date().toISOString(), conversations };
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
  return good.map((c) => {
    const out = {
      id: c.id,
      title: c.title,
      created: Number(c.created) || Date.now(),
      updated: Number(c.updated) || Date.now(),
      messages: c.messages.map(cleanMessage),
    };
    if (typeof c.system === "string") out.system = c.system;
    if (typeof c.model === "string") out.model = c.model;
    return out;
  });
}

function plain(value, depth = 0) {
  // JSON data only (a request body the page sent): no functions, bounded depth.
  if (depth > 12) return null;
  if (value === null || ["string", "number", "boolean"].includes(typeof value)) return value;
  if (Array.isArray(value)) return value.map((v) => plain(v, depth + 1));
  if (typeof value === "object") return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, plain(v, depth + 1)]));
  return null;
}

// Only the fields the page knows, with their types: an imported file is data, not code.
function cleanMessage(m) {
  const out = { role: m.role, content: m.content };
  for (const name of ["reasoning", "responseId", "error", "toolCallId", "name"]) if (typeof m[name] === "string") out[name] = m[name];
  if (Array.isArray(m.images)) out.images = m.images.filter((url) => typeof url === "string" && url.startsWith("data:image/"));
  if (Array.isArray(m.files)) out.files = m.files.filter((f) => f && typeof f.name === "string" && typeof f.text === "string").map((f) => ({ name: f.name, text: f.text }));
  if (Array.isArray(m.toolCalls)) {
    out.toolCalls = m.toolCalls
      .filter((c) => c && typeof c.name === "string")
      .map((c) => ({ id: String(c.id || ""), name: c.name, arguments: String(c.arguments || "") }));
  }
  if (m.request && typeof m.request === "object" && typeof m.request.path === "string") {
    out.request = { mode: String(m.request.mode), path: m.request.path, body: plain(m.request.body) };
  }
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
  if (Array.isArray(m.versions) && Number.isInteger(m.version)) {
    out.versions = m.versions.map((tail) => (Array.isArray(tail) ? tail.filter(isMessage).map(cleanMessage) : null));
    out.version = Math.max(0, Math.min(m.version, out.versions.length - 1));
  }
  return out;
}
