// The conversation schema an imported file is read against. A file someone sent is
// data, never code: each field the page knows is checked for its type (a wrong one
// refuses that conversation with a sentence naming the field), fields it does not know
// are dropped, and a reply's request must be one the page itself sends (its API mode
// and that mode's route), so nothing the page later turns into a snippet or a request
// can carry more than a value.

// The route each API mode posts to (api.js buildRequest; "socket" is the Responses
// API over a WebSocket, its snippets show the same request over HTTP).
export const ROUTES = { chat: "/v1/chat/completions", responses: "/v1/responses", socket: "/v1/responses" };
const ROLES = ["user", "assistant", "tool"];
const MESSAGE_STRINGS = ["reasoning", "responseId", "error", "toolCallId", "name"];
const MAX_BODY_DEPTH = 24; // deeper than any request the page builds
const MAX_VERSION_DEPTH = 8; // versions of versions: a conversation edited back and forth

export class SchemaError extends Error {}

function refuse(where, what) {
  throw new SchemaError(`${where}: ${what}`);
}

function describe(value) {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  if (typeof value === "string") return `the string ${JSON.stringify(value.length > 60 ? value.slice(0, 60) + "…" : value)}`;
  return typeof value === "object" ? "an object" : `${typeof value} ${String(value)}`;
}

function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function string(value, where) {
  if (typeof value !== "string") refuse(where, `must be a string, not ${describe(value)}`);
  return value;
}

function finite(value, where) {
  if (typeof value !== "number" || !Number.isFinite(value)) refuse(where, `must be a number, not ${describe(value)}`);
  return value;
}

function object(value, where) {
  if (!isObject(value)) refuse(where, `must be an object, not ${describe(value)}`);
  return value;
}

function array(value, where, item) {
  if (!Array.isArray(value)) refuse(where, `must be an array, not ${describe(value)}`);
  return value.map((v, i) => item(v, `${where}[${i}]`));
}

// JSON data (what JSON.parse gives) with bounded depth: a request body.
function json(value, where, depth = 0) {
  if (depth > MAX_BODY_DEPTH) refuse(where, `nests deeper than ${MAX_BODY_DEPTH} levels`);
  if (value === null || typeof value === "string" || typeof value === "boolean") return value;
  if (typeof value === "number") return finite(value, where);
  if (Array.isArray(value)) return value.map((v, i) => json(v, `${where}[${i}]`, depth + 1));
  if (isObject(value)) return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, json(v, `${where}.${k}`, depth + 1)]));
  refuse(where, `must be JSON data, not ${describe(value)}`);
}

export function readRequest(value, where) {
  object(value, where);
  const mode = string(value.mode, where + ".mode");
  if (!Object.hasOwn(ROUTES, mode)) refuse(where + ".mode", `must be one of ${Object.keys(ROUTES).join(", ")}, not ${describe(mode)}`);
  const path = string(value.path, where + ".path");
  if (path !== ROUTES[mode]) refuse(where + ".path", `must be the ${mode} route ${ROUTES[mode]}, not ${describe(path)}`);
  return { mode, path, body: object(json(value.body, where + ".body"), where + ".body") };
}

function scalar(value, where) {
  if (value !== null && !["string", "number", "boolean"].includes(typeof value)) refuse(where, `must be a string, number or boolean, not ${describe(value)}`);
  if (typeof value === "number") finite(value, where);
  return value;
}

function token(value, where) {
  object(value, where);
  return { t: string(value.t, where + ".t"), lp: finite(value.lp, where + ".lp") };
}

function readMessage(m, where, depth = 0) {
  object(m, where);
  const role = string(m.role, where + ".role");
  if (!ROLES.includes(role)) refuse(where + ".role", `must be one of ${ROLES.join(", ")}, not ${describe(role)}`);
  const out = { role, content: string(m.content, where + ".content") };
  for (const name of MESSAGE_STRINGS) if (m[name] != null) out[name] = string(m[name], `${where}.${name}`);
  if (m.images != null) {
    out.images = array(m.images, where + ".images", (url, at) => {
      if (!string(url, at).startsWith("data:image/")) refuse(at, "must be an image's data: URL");
      return url;
    });
  }
  if (m.files != null) {
    out.files = array(m.files, where + ".files", (f, at) => ({ name: string(object(f, at).name, at + ".name"), text: string(f.text, at + ".text") }));
  }
  if (m.toolCalls != null) {
    out.toolCalls = array(m.toolCalls, where + ".toolCalls", (c, at) => {
      object(c, at);
      return {
        id: c.id == null ? "" : string(c.id, at + ".id"),
        name: string(c.name, at + ".name"),
        arguments: c.arguments == null ? "" : string(c.arguments, at + ".arguments"),
      };
    });
  }
  if (m.request != null) out.request = readRequest(m.request, where + ".request");
  if (m.stats != null) {
    out.stats = {};
    for (const [k, v] of Object.entries(object(m.stats, where + ".stats"))) if (scalar(v, `${where}.stats.${k}`) !== null) out.stats[k] = v;
  }
  if (m.tokens != null) {
    out.tokens = array(m.tokens, where + ".tokens", (t, at) => ({
      ...token(t, at),
      top: t.top == null ? [] : array(t.top, at + ".top", token),
    }));
  }
  if (m.versions != null) {
    if (depth >= MAX_VERSION_DEPTH) refuse(where + ".versions", `nests deeper than ${MAX_VERSION_DEPTH} levels`);
    out.versions = array(m.versions, where + ".versions", (tail, at) => (tail === null ? null : array(tail, at, (v, vat) => readMessage(v, vat, depth + 1))));
    const version = m.version;
    if (!Number.isInteger(version) || version < 0 || version >= out.versions.length) refuse(where + ".version", `must be an index into its ${out.versions.length} versions, not ${describe(version)}`);
    out.version = version;
  }
  return out;
}

// One conversation of a file, cleaned; throws a SchemaError naming the first bad field.
export function readConversation(c, where) {
  object(c, where);
  const out = {
    id: string(c.id, where + ".id"),
    title: string(c.title, where + ".title"),
    created: c.created == null ? Date.now() : finite(c.created, where + ".created"),
    updated: c.updated == null ? Date.now() : finite(c.updated, where + ".updated"),
    messages: array(c.messages, where + ".messages", (m, at) => readMessage(m, at)),
  };
  if (c.system != null) out.system = string(c.system, where + ".system");
  if (c.model != null) out.model = string(c.model, where + ".model");
  return out;
}
