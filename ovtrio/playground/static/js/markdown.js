// A small Markdown renderer that builds DOM nodes. There is no HTML pass-through: a
// `<script>` or `<img onerror=...>` in the text stays visible text. Links keep only
// http:, https: and mailto: targets; anything else (javascript:, data:, ...) is shown
// as plain text. It covers what chat models write: fenced code (with a copy button),
// headings, lists, quotes, tables, rules, emphasis, inline code, links, and math
// ($...$, \(...\), $$...$$, \[...\]) kept as its TeX source in `.math` elements, which
// vendor.js typesets with KaTeX (as it gives `data-lang` code blocks to highlight.js).
//
// The work is linear in the text's length whatever the text: blocks (lists, quotes)
// nest MAX_NESTING deep and spans (emphasis, links) MAX_NESTING deep, deeper ones
// staying as their text; a closing marker is looked for once per kind and position
// (`Finder`), and a link is looked for within LINK_WINDOW characters. A streaming reply
// is drawn again at each frame, so a reply of nested lists or a run of `*` must not
// cost more than its length.

import { h, copyText, flash } from "./dom.js";

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$/;
const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}>\s?(.*)$/;
const LIST_ITEM = /^( *)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const TABLE_DIVIDER = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;
const MATH_OPEN = /^ {0,3}(\$\$|\\\[)/;
const SAFE_SCHEMES = new Set(["http:", "https:", "mailto:"]);
export const MAX_NESTING = 16;
const LINK_WINDOW = 2048;

export function renderMarkdown(text) {
  const fragment = document.createDocumentFragment();
  blocks(text.replace(/\r\n?/g, "\n").split("\n"), fragment, 0);
  return fragment;
}

export function safeHref(url) {
  try {
    const parsed = new URL(url, document.baseURI);
    return SAFE_SCHEMES.has(parsed.protocol) ? parsed.href : null;
  } catch {
    return null;
  }
}

function startsBlock(line) {
  return FENCE.test(line) || MATH_OPEN.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || LIST_ITEM.test(line);
}

function blocks(lines, parent, depth) {
  if (depth >= MAX_NESTING) {
    // Nested deeper than a reader follows: the rest is shown as it was written.
    const text = lines.join("\n").trim();
    if (text) parent.append(h("p", { class: "md-deep", text }));
    return;
  }
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let match;
    if (!line.trim()) {
      i++;
    } else if ((match = FENCE.exec(line))) {
      const fence = match[1];
      const body = [];
      i++;
      while (i < lines.length && !(lines[i].trim().startsWith(fence[0].repeat(fence.length)) && !lines[i].trim().slice(fence.length).trim())) {
        body.push(lines[i]);
        i++;
      }
      i++; // the closing fence (or the end of a reply still streaming)
      parent.append(codeBlock(body.join("\n"), match[2]));
    } else if ((match = MATH_OPEN.exec(line))) {
      const close = match[1] === "$$" ? "$$" : "\\]";
      let rest = line.trim().slice(2);
      const tex = [];
      i++;
      for (;;) {
        const end = rest.indexOf(close);
        if (end >= 0) {
          tex.push(rest.slice(0, end));
          break;
        }
        tex.push(rest);
        if (i >= lines.length) break; // still streaming
        rest = lines[i++];
      }
      parent.append(h("div", { class: "math display", text: tex.join("\n").trim() }));
    } else if ((match = HEADING.exec(line))) {
      parent.append(inline(match[2], h("h" + Math.min(match[1].length + 2, 6), { class: "md-h" + match[1].length }), depth));
      i++;
    } else if (RULE.test(line)) {
      parent.append(h("hr"));
      i++;
    } else if (QUOTE.test(line)) {
      const quoted = [];
      while (i < lines.length && (match = QUOTE.exec(lines[i]))) {
        quoted.push(match[1]);
        i++;
      }
      const quote = h("blockquote");
      blocks(quoted, quote, depth + 1);
      parent.append(quote);
    } else if (LIST_ITEM.test(line)) {
      i = list(lines, i, parent, depth);
    } else if (line.includes("|") && i + 1 < lines.length && TABLE_DIVIDER.test(lines[i + 1]) && lines[i + 1].includes("-")) {
      i = table(lines, i, parent, depth);
    } else {
      const paragraph = [];
      while (i < lines.length && lines[i].trim() && (paragraph.length === 0 || !startsBlock(lines[i]))) {
        paragraph.push(lines[i].trim());
        i++;
      }
      parent.append(inline(paragraph.join("\n"), h("p"), depth));
    }
  }
}

function list(lines, start, parent, depth) {
  const first = LIST_ITEM.exec(lines[start]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const el = ordered ? h("ol") : h("ul");
  if (ordered && parseInt(first[2], 10) !== 1) el.start = parseInt(first[2], 10);
  let i = start;
  let loose = false;
  const items = [];
  while (i < lines.length) {
    const match = LIST_ITEM.exec(lines[i]);
    if (!match || match[1].length !== indent || /\d/.test(match[2]) !== ordered) break;
    const content = [match[3]];
    const inner = indent + match[2].length + 1;
    i++;
    while (i < lines.length) {
      const next = lines[i];
      if (!next.trim()) {
        const following = lines[i + 1];
        if (following !== undefined && following.search(/\S/) >= inner) {
          content.push("");
          loose = true;
          i++;
          continue;
        }
        break;
      }
      const item = LIST_ITEM.exec(next);
      if (item && item[1].length <= indent) break;
      if (next.search(/\S/) < inner && !item && startsBlock(next)) break;
      content.push(next.slice(Math.min(inner, next.search(/\S/))));
      i++;
    }
    items.push(content);
    if (i < lines.length && !lines[i].trim() && LIST_ITEM.test(lines[i + 1] || "")) {
      const nextItem = LIST_ITEM.exec(lines[i + 1]);
      if (nextItem[1].length === indent) {
        loose = true;
        i++;
      }
    }
  }
  for (const content of items) {
    const li = h("li");
    if (!loose && content.length && !content.slice(1).some((l) => startsBlock(l) || !l.trim())) {
      inline(content.join("\n"), li, depth + 1);
    } else {
      blocks(content, li, depth + 1);
    }
    el.append(li);
  }
  parent.append(el);
  return i;
}

function cells(line) {
  let row = line.trim();
  if (row.startsWith("|")) row = row.slice(1);
  if (row.endsWith("|") && !row.endsWith("\\|")) row = row.slice(0, -1);
  return row.split(/(?<!\\)\|/).map((cell) => cell.trim().replace(/\\\|/g, "|"));
}

function table(lines, start, parent, depth) {
  const head = cells(lines[start]);
  const aligns = cells(lines[start + 1]).map((c) => (c.startsWith(":") && c.endsWith(":") ? "center" : c.endsWith(":") ? "right" : null));
  const thead = h("thead", null, h("tr", null, head.map((cell, k) => inline(cell, h("th", { class: aligns[k] ? "align-" + aligns[k] : null }), depth))));
  const tbody = h("tbody");
  let i = start + 2;
  while (i < lines.length && lines[i].includes("|") && lines[i].trim()) {
    const row = cells(lines[i]);
    tbody.append(h("tr", null, head.map((_, k) => inline(row[k] || "", h("td", { class: aligns[k] ? "align-" + aligns[k] : null }), depth))));
    i++;
  }
  parent.append(h("div", { class: "table-wrap" }, h("table", null, thead, tbody)));
  return i;
}

function codeBlock(code, language) {
  const copy = h("button", { class: "code-copy", type: "button", title: "Copy the code", text: "Copy" });
  copy.addEventListener("click", async () => flash(copy, (await copyText(code)) ? "Copied" : "Copy failed"));
  return h(
    "div",
    { class: "code" },
    h("div", { class: "code-bar" }, h("span", { class: "code-lang", text: language || "text" }), copy),
    h("pre", null, h("code", { text: code, "data-lang": language || null }))
  );
}

// Where the next closer of a kind is. Each kind's last answer is kept: a search from
// `from` that falls between the last search's start and what it found has the same
// answer, so a scan from left to right looks at each position about once per kind,
// however many openers wait for a closer that never comes.
class Finder {
  constructor(text) {
    this.text = text;
    this.last = new Map(); // kind -> [from, found]
  }

  remembered(kind, from, search) {
    const last = this.last.get(kind);
    if (last && from >= last[0] && (last[1] < 0 || from <= last[1])) return last[1];
    const found = search(from);
    this.last.set(kind, [from, found]);
    return found;
  }

  // The first position at or after `from` where `accepts(position)` holds, or -1.
  find(kind, from, accepts) {
    return this.remembered("?" + kind, from, (at) => {
      while (at < this.text.length && !accepts(at)) at++;
      return at < this.text.length ? at : -1;
    });
  }

  indexOf(token, from) {
    return this.remembered("=" + token, from, (at) => this.text.indexOf(token, at));
  }
}

// Inline spans: `code`, **strong**, *em*, ~~del~~, [links](url), bare URLs, \escapes,
// line breaks. Emphasis markers without a closing partner stay as text.
function inline(text, parent, depth) {
  if (depth >= MAX_NESTING) {
    parent.append(document.createTextNode(text));
    return parent;
  }
  const finder = new Finder(text);
  let plain = "";
  const flush = () => {
    if (plain) parent.append(document.createTextNode(plain));
    plain = "";
  };
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    const math = c === "$" || c === "\\" ? mathAt(text, i, finder) : null;
    if (math) {
      flush();
      parent.append(h("span", { class: "math" + (math.display ? " display" : ""), text: math.tex }));
      i = math.end;
      continue;
    }
    if (c === "\\" && i + 1 < text.length && /[!-/:-@[-`{-~]/.test(text[i + 1])) {
      plain += text[i + 1];
      i += 2;
      continue;
    }
    if (c === "\n") {
      flush();
      parent.append(h("br"));
      i++;
      continue;
    }
    if (c === "`") {
      const run = /^`+/.exec(text.slice(i))[0];
      const end = finder.indexOf(run, i + run.length);
      // A span of spaces only stays text: it shows nothing, and Chromium lays out a run of
      // such boxes in time that grows with the square of their number.
      if (end > 0 && text.slice(i + run.length, end).trim()) {
        flush();
        parent.append(h("code", { text: text.slice(i + run.length, end).replace(/^ (.*) $/, "$1") }));
        i = end + run.length;
        continue;
      }
      plain += run;
      i += run.length;
      continue;
    }
    const pair = text.slice(i, i + 2);
    if (pair === "**" || pair === "__" || pair === "~~") {
      const end = finder.indexOf(pair, i + 2);
      if (end > i + 2 && !/\s/.test(text[i + 2])) {
        flush();
        parent.append(inline(text.slice(i + 2, end), h(pair === "~~" ? "del" : "strong"), depth + 1));
        i = end + 2;
        continue;
      }
    }
    if ((c === "*" || c === "_") && text[i + 1] !== c && text[i + 1] && !/\s/.test(text[i + 1])) {
      const wordBefore = c === "_" && i > 0 && /\w/.test(text[i - 1]);
      const end = finder.find("em" + c, i + 1, (at) => text[at] === c && text[at + 1] !== c && !/\s/.test(text[at - 1]) && !(c === "_" && /\w/.test(text[at + 1] || "")));
      if (!wordBefore && end > i + 1) {
        flush();
        parent.append(inline(text.slice(i + 1, end), h("em"), depth + 1));
        i = end + 1;
        continue;
      }
    }
    if (c === "[") {
      const link = /^\[([^\]\n]*)\]\(\s*<?([^\s()<>]*(?:\([^\s()]*\)[^\s()<>]*)*)>?(?:\s+"[^"]*")?\s*\)/.exec(text.slice(i, i + LINK_WINDOW));
      if (link) {
        flush();
        parent.append(anchor(link[1], link[2], false, depth + 1));
        i += link[0].length;
        continue;
      }
    }
    if ((c === "h" || c === "w") && (i === 0 || /[\s(]/.test(text[i - 1]))) {
      const bare = /^(?:https?:\/\/|www\.)[^\s<>"]+/.exec(text.slice(i));
      if (bare) {
        const url = bare[0].replace(/[.,;:!?)'"]+$/, "");
        flush();
        parent.append(anchor(url, url.startsWith("www.") ? "https://" + url : url, true));
        i += url.length;
        continue;
      }
    }
    plain += c;
    i++;
  }
  flush();
  return parent;
}

// Math starting at text[i]: {tex, display, end}, or null. A lone `$` (prices: "$5 and
// $10") is text: the TeX may not start or end with a space, nor the closing `$` be
// followed by a digit.
function mathAt(text, i, finder) {
  const pairs = [
    ["$$", "$$", true],
    ["\\[", "\\]", true],
    ["\\(", "\\)", false],
    ["$", "$", false],
  ];
  for (const [open, close, display] of pairs) {
    if (!text.startsWith(open, i)) continue;
    const from = i + open.length;
    const end = open === "$" ? finder.find("unescaped $", from, (at) => text[at] === "$" && text[at - 1] !== "\\") : finder.indexOf(close, from);
    if (open === "$") {
      if (end < 0 || end === from || /\s/.test(text[from]) || /\s/.test(text[end - 1]) || /\d/.test(text[end + 1] || "")) return null;
    }
    if (end < 0 || end === from) continue;
    return { tex: text.slice(from, end), display, end: end + close.length };
  }
  return null;
}

function anchor(label, url, bare = false, depth = 0) {
  const href = safeHref(url);
  if (!href) {
    // Not a scheme we link to: the text stays, inert.
    return h("span", { class: "link-refused", title: "Link not followed: " + url.slice(0, 200) }, bare ? url : inline(label, h("span"), depth));
  }
  const a = h("a", { href, target: "_blank", rel: "noopener noreferrer nofollow" });
  return bare ? append(a, url) : inline(label || url, a, depth);
}

function append(el, text) {
  el.textContent = text;
  return el;
}
