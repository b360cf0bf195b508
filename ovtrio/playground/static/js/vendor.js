// The third-party libraries the page ships (static/vendor/, each with its license),
// loaded only when first needed: highlight.js for code blocks, KaTeX for math, PDF.js
// for the text of an attached PDF. Both build DOM from the text they are given and escape it; KaTeX's styles are
// set through the CSSOM, which the page's Content-Security-Policy allows.

import { h } from "./dom.js";

const ready = { hljs: null, katex: null };
const loading = {};
const waiting = new Set();

function load(name) {
  if (!loading[name]) {
    if (name === "katex") {
      document.head.append(h("link", { rel: "stylesheet", href: "/playground/vendor/katex/katex.min.css" }));
      loading[name] = import("../vendor/katex/katex.min.js").then(() => self.katex);
    } else {
      loading[name] = import("../vendor/highlight/highlight.min.js").then((module) => module.default);
    }
    loading[name].then(
      (lib) => {
        ready[name] = lib;
        const roots = [...waiting];
        waiting.clear();
        for (const root of roots) if (root.isConnected) enhance(root);
      },
      () => {} // not loaded: code stays plain, math as written
    );
  }
}

// Highlight the code blocks and typeset the math under `root` (rendered by
// markdown.js): at once when the libraries are loaded, else once they are.
export function enhance(root) {
  const codes = root.querySelectorAll("code[data-lang]:not([data-done])");
  const maths = root.querySelectorAll(".math:not([data-done])");
  if (codes.length) {
    if (ready.hljs) codes.forEach((code) => highlight(ready.hljs, code));
    else (waiting.add(root), load("hljs"));
  }
  if (maths.length) {
    if (ready.katex) maths.forEach((el) => typeset(ready.katex, el));
    else (waiting.add(root), load("katex"));
  }
}

function highlight(hljs, code) {
  code.dataset.done = "true";
  const language = code.dataset.lang.toLowerCase();
  if (!hljs.getLanguage(language)) return;
  // highlight.js escapes the text; its result is spans with hljs-* classes only.
  code.innerHTML = hljs.highlight(code.textContent, { language, ignoreIllegals: true }).value;
  code.classList.add("hljs");
}

function typeset(lib, el) {
  el.dataset.done = "true";
  const tex = el.textContent;
  try {
    lib.render(tex, el, { displayMode: el.classList.contains("display"), throwOnError: false, trust: false, maxExpand: 500, output: "htmlAndMathml" });
  } catch {
    el.textContent = tex; // shown as written
  }
}

let pdfjs = null;

// The text of a PDF (an ArrayBuffer), page after page. PDF.js parses it in a worker
// from the page's own origin, with eval off; nothing of the PDF is drawn.
export async function pdfText(data) {
  if (!pdfjs) {
    pdfjs = import("../vendor/pdfjs/pdf.min.mjs").then((lib) => {
      lib.GlobalWorkerOptions.workerSrc = "/playground/vendor/pdfjs/pdf.worker.min.mjs";
      return lib;
    });
  }
  const lib = await pdfjs;
  const task = lib.getDocument({ data, isEvalSupported: false, disableFontFace: true, stopAtErrors: false, verbosity: 0 });
  try {
    const doc = await task.promise;
    const pages = [];
    for (let n = 1; n <= doc.numPages; n++) {
      const page = await doc.getPage(n);
      const content = await page.getTextContent();
      pages.push(content.items.map((item) => (item.str || "") + (item.hasEOL ? "\n" : "")).join("").trim());
    }
    return pages.join("\n\n");
  } finally {
    task.destroy();
  }
}
