// The token view: each generated token coloured by its probability; hovering one shows
// the alternatives the server reported.

import { h } from "./dom.js";

const tokenOf = new WeakMap();

export function probabilityClass(logprob) {
  const p = Math.exp(logprob);
  return "tok p" + Math.min(9, Math.floor(p * 10));
}

// Whitespace made visible; a token with no text of its own (a special token, or bytes
// that complete a character only with the next token) as a small mark, so it can be
// hovered like the others.
function visible(text) {
  if (!text) return "";
  return text.replace(/\n/g, "↵\n").replace(/\t/g, "→\t");
}

export function renderTokens(tokens) {
  const legend = h(
    "div",
    { class: "legend", "aria-hidden": "true" },
    "unlikely",
    [0, 2, 4, 6, 8, 9].map((k) => h("span", { class: "tok p" + k })),
    "certain · hover a token for its alternatives"
  );
  const wrap = h("div", { class: "tokens" });
  for (const token of tokens) {
    const span = h("span", { class: probabilityClass(token.lp), text: visible(token.t) });
    if (!token.t) span.classList.add("no-text");
    tokenOf.set(span, token);
    wrap.append(span);
  }
  return h("div", null, legend, wrap);
}

function percent(logprob) {
  const p = Math.exp(logprob) * 100;
  return (p >= 10 ? p.toFixed(1) : p.toPrecision(2)) + " %";
}

function shown(text) {
  return JSON.stringify(text).slice(1, -1) || "∅";
}

export function installTokenTips(root, tip) {
  root.addEventListener("mouseover", (event) => {
    const span = event.target.closest && event.target.closest(".tok");
    const token = span && tokenOf.get(span);
    if (!token) return;
    tip.replaceChildren(
      h("div", { class: "tip-head" }, h("code", { text: shown(token.t) }), h("span", { text: percent(token.lp) })),
      token.top && token.top.length
        ? h(
            "table",
            null,
            token.top.map((alt) =>
              h(
                "tr",
                { class: alt.t === token.t ? "chosen" : null },
                h("td", null, h("code", { text: shown(alt.t) })),
                h("td", { class: "bar" }, h("meter", { min: 0, max: 1, value: Math.exp(alt.lp) })),
                h("td", { class: "num", text: percent(alt.lp) })
              )
            )
          )
        : h("p", { class: "tip-note", text: "The server reported no alternatives for this token." })
    );
    tip.hidden = false;
    const box = span.getBoundingClientRect();
    const width = tip.offsetWidth;
    tip.style.left = Math.max(8, Math.min(window.innerWidth - width - 8, box.left)) + "px";
    const below = box.bottom + 6;
    tip.style.top = (below + tip.offsetHeight > window.innerHeight ? box.top - tip.offsetHeight - 6 : below) + "px";
  });
  root.addEventListener("mouseout", (event) => {
    if (event.target.closest && event.target.closest(".tok")) tip.hidden = true;
  });
}
