// What the page keeps in the browser: settings (localStorage), conversations (IndexedDB,
// one record per conversation, so that a write refused for a full disk loses only that
// conversation's latest change, never another conversation; their images apart, once
// each), and the API key only when the user asked for it to be remembered.

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
// Two stores: "conversations", one record each, and "images", each attached image once
// under its SHA-256, which the conversation's record names ("idb:<hash>") instead of
// holding it: the record a streaming reply rewrites every second stays small.

const IMAGES = "images";
const REF = "idb:";
const hashes = new Map(); // data URL -> its key
const storedImages = new Set(); // keys known to be in the images store

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
      const req = indexedDB.open(DB_NAME, 2);
      req.onupgradeneeded = () => {
        const db = req.result;
        if (!db.objectStoreNames.contains(DB_STORE)) db.createObjectStore(DB_STORE, { keyPath: "id" });
        if (!db.objectStoreNames.contains(IMAGES)) db.createObjectStore(IMAGES);
      };
      req.onsuccess = () => resolve(req.result);
      req.onerror = () => reject(req.error);
    });
  }
  return opened;
}

// Runs `work(stores)` in one transaction over both stores; resolves once it commits.
async function transaction(mode, work) {
  const db = await database();
  return new Promise((resolve, reject) => {
    const tx = db.transaction([DB_STORE, IMAGES], mode);
    let result;
    try {
      Promise.resolve(work({ conversations: tx.objectStore(DB_STORE), images: tx.objectStore(IMAGES) })).then((r) => (result = r), reject);
    } catch (error) {
      tx.abort();
      reject(error);
      return;
    }
    tx.oncomplete = () => resolve(result);
    tx.onabort = () => reject(tx.error || new DOMException("The write was aborted.", "AbortError"));
    tx.onerror = () => reject(tx.error);
  });
}

async function keyOf(url) {
  let key = hashes.get(url);
  if (!key) {
    const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(url));
    key = Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
    hashes.set(url, key);
  }
  return key;
}

// The messages with every image replaced by a reference (`found` gets key -> URL).
async function withRefs(messages, found) {
  const out = [];
  for (const m of messages) {
    let copy = m;
    if (m.images && m.images.length) {
      const refs = [];
      for (const url of m.images) {
        if (!url.startsWith("data:")) {
          refs.push(url);
          continue;
        }
        const key = await keyOf(url);
        found.set(key, url);
        refs.push(REF + key);
      }
      copy = { ...m, images: refs };
    }
    if (m.versions) copy = { ...copy, versions: await Promise.all(m.versions.map((tail) => (tail ? withRefs(tail, found) : null))) };
    out.push(copy);
  }
  return out;
}

function resolveRefs(messages, images, used) {
  for (const m of messages) {
    if (m.images) {
      m.images = m.images
        .map((ref) => {
          if (!ref.startsWith(REF)) return ref;
          used.add(ref.slice(REF.length));
          return images.get(ref.slice(REF.length));
        })
        .filter(Boolean);
    }
    for (const tail of m.versions || []) if (tail) resolveRefs(tail, images, used);
  }
}

// Every kept conversation; those an earlier version kept in localStorage move here once.
// Images no conversation names any more are dropped.
export async function loadConversations() {
  let list = [];
  const images = new Map();
  try {
    await transaction("readonly", async ({ conversations, images: store }) => {
      const [records, keys, values] = await Promise.all([request(conversations.getAll()), request(store.getAllKeys()), request(store.getAll())]);
      list = records;
      keys.forEach((key, i) => images.set(key, values[i]));
    });
  } catch {
    return { list: read(OLD_CONVERSATIONS, []).filter(isConversation), available: false };
  }
  const used = new Set();
  for (const c of list) if (Array.isArray(c.messages)) resolveRefs(c.messages, images, used);
  for (const [key, url] of images) {
    storedImages.add(key);
    hashes.set(url, key);
  }
  const unused = [...images.keys()].filter((key) => !used.has(key));
  if (unused.length) {
    transaction("readwrite", ({ images: store }) => Promise.all(unused.map((key) => request(store.delete(key))))).then(
      () => unused.forEach((key) => storedImages.delete(key)),
      () => {}
    );
  }
  const old = read(OLD_CONVERSATIONS, null);
  if (Array.isArray(old)) {
    const known = new Set(list.map((c) => c.id));
    const moved = old.filter((c) => isConversation(c) && !known.has(c.id));
    let failed = false;
    for (const c of moved) if (await saveConversation(c)) failed = true;
    if (!failed) localStorage.removeItem(OLD_CONVERSATIONS); // else tried again on the next load
    list = list.concat(moved);
  }
  return { list: list.filter(isConversation), available: true };
}

// Resolves to null when kept, or to the browser's error (a QuotaExceededError when full).
export async function saveConversation(conversation) {
  try {
    const found = new Map();
    const record = { ...conversation, messages: await withRefs(conversation.messages, found) };
    const fresh = [...found].filter(([key]) => !storedImages.has(key));
    await transaction("readwrite", ({ conversations, images }) => {
      for (const [key, url] of fresh) images.put(url, key);
      return request(conversations.put(record));
    });
    for (const [key] of fresh) storedImages.add(key);
    return null;
  } catch (error) {
    return error || new Error("not kept");
  }
}

export async function deleteConversation(id) {
  try {
    await transaction("readwrite", ({ conversations }) => request(conversations.delete(id)));
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
