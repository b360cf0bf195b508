// What the page keeps in the browser: settings (localStorage), conversations (IndexedDB,
// one record per conversation, so that a write refused for a full disk loses only that
// conversation's latest change, never another conversation; their images apart, once
// each), and the API key only when the user asked for it to be remembered.

import { readConversation, readRequest, SchemaError } from "./schema.js";

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
  for (const c of list) {
    if (!Array.isArray(c.messages)) continue;
    resolveRefs(c.messages, images, used);
    dropForeignRequests(c.messages);
  }
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

// A request kept by a version of the page that did not check what it imported is
// dropped unless it is one the page sends: its snippets could otherwise carry it.
function dropForeignRequests(messages) {
  for (const m of messages) {
    if (!m || typeof m !== "object") continue;
    if (m.request) {
      try {
        m.request = readRequest(m.request, "request");
      } catch {
        delete m.request;
      }
    }
    for (const tail of Array.isArray(m.versions) ? m.versions : []) if (Array.isArray(tail)) dropForeignRequests(tail);
  }
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

// The conversations of an exported file, read against the conversation schema
// (schema.js): {conversations, refused}, `refused` a sentence for each conversation
// left out. Throws an Error with a sentence when none can be read.
export function readExport(text) {
  let doc;
  try {
    doc = JSON.parse(text);
  } catch {
    throw new Error("The file is not JSON.");
  }
  const list = Array.isArray(doc) ? doc : doc && doc.conversations;
  if (!Array.isArray(list)) throw new Error("The file holds no conversations.");
  const conversations = [];
  const refused = [];
  list.forEach((c, i) => {
    try {
      conversations.push(readConversation(c, `conversations[${i}]`));
    } catch (error) {
      if (!(error instanceof SchemaError)) throw error;
      refused.push(error.message);
    }
  });
  if (!conversations.length) {
    throw new Error(refused.length ? `None of the file's conversations could be read: ${refused[0]}${refused.length > 1 ? ` (and ${refused.length - 1} more)` : ""}.` : "The file holds no conversations.");
  }
  return { conversations, refused };
}
