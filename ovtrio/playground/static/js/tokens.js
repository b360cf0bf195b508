// The token view: each generated token coloured by its probability; pointing at one,
// tapping it or moving to it with the arrow keys shows the alternatives the server
// reported.

import { h } from "./dom.js";

const tokenOf = new WeakMap();

export function probabilityClass(logprob) {
  const p = Math.exp(logprob);
  return "tok p" + Math.min(9, Math.floor(p * 10));
}

// Whitespace made visible; a token with no text of its own (a special token, or bytes
// that complete a character only with the next token) as a small mark, so it can be
// pointed at like the others.
function visible(text) {
  if (!text) return "";
  return text.replace(/\n/g, "↵\n").replace(/\t/g, "→\t");
}

export function renderTokens(tokens, touch = false) {
  const legend = h(
    "div",
    { class: "legend", "aria-hidden": "true" },
    h("span", { class: "legend-words", text: "unlikely" }),
    h("span", { class: "legend-scale" }, [0, 2, 4, 6, 8, 9].map((k) => h("span", { class: "tok p" + k }))),
    h("span", { class: "legend-words", text: "certain" }),
    h("span", { class: "legend-words", text: touch ? "· tap a token for its alternatives" : "· point at a token for its alternatives" })
  );
  // One Tab stop for all the tokens; the arrow keys move between them.
  const wrap = h("div", { class: "tokens", role: "group", "aria-label": "Tokens: arrow keys move from one to the next and show its alternatives" });
  tokens.forEach((token, k) => {
    const span = h("span", { class: probabilityClass(token.lp), text: visible(token.t), tabindex: k === 0 ? 0 : -1 });
    if (!token.t) span.classList.add("no-text");
    tokenOf.set(span, token);
    wrap.append(span);
  });
  return h("div", null, legend, wrap);
}

function percent(logprob) {
  const p = Math.exp(logprob) * 100;
  return (p >= 10 ? p.toFixed(1) : p.toPrecision(2)) + " %";
}

function shown(text) {
  return JSON.stringify(text).slice(1, -1) || "∅";
}

function show(tip, span) {
  const token = tokenOf.get(span);
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
              h("td", { class: "bar" }, h("meter", { min: 0, max: 1, value: Math.exp(alt.lp), "aria-label": "probability" })),
              h("td", { class: "num", text: percent(alt.lp) })
            )
          )
        )
      : h("p", { class: "tip-note", text: "The server reported no alternatives for this token." })
  );
  tip.hidden = false;
  if (!tip.id) tip.id = "tip";
  span.setAttribute("aria-describedby", tip.id);
  const box = span.getBoundingClientRect();
  const width = tip.offsetWidth;
  tip.style.left = Math.max(8, Math.min(window.innerWidth - width - 8, box.left)) + "px";
  const below = box.bottom + 6;
  tip.style.top = (below + tip.offsetHeight > window.innerHeight ? box.top - tip.offsetHeight - 6 : below) + "px";
}

export function installTokenTips(root, tip) {
  const tokenAt = (target) => {
    const span = target.closest && target.closest(".tok");
    return span && tokenOf.has(span) ? span : null;
  };
  root.addEventListener("mouseover", (event) => {
    const span = tokenAt(event.target);
    if (span) show(tip, span);
  });
  root.addEventListener("mouseout", (event) => {
    if (tokenAt(event.target) && !event.target.contains(document.activeElement)) tip.hidden = true;
  });
  // A tap (no hover on a touch screen) shows it too, and a tap elsewhere hides it.
  document.addEventListener("click", (event) => {
    const span = tokenAt(event.target);
    if (span) {
      span.focus({ preventScroll: true });
      show(tip, span);
    } else tip.hidden = true;
  });
  root.addEventListener("focusin", (event) => {
    const span = tokenAt(event.target);
    if (span) show(tip, span);
  });
  root.addEventListener("focusout", (event) => {
    if (tokenAt(event.target)) tip.hidden = true;
  });
  root.addEventListener("keydown", (event) => {
    const span = tokenAt(event.target);
    if (!span) return;
    const move = { ArrowRight: "nextElementSibling", ArrowDown: "nextElementSibling", ArrowLeft: "previousElementSibling", ArrowUp: "previousElementSibling" }[event.key];
    if (event.key === "Escape") {
      tip.hidden = true;
      return;
    }
    if (!move || !span[move]) return;
    event.preventDefault();
    span.tabIndex = -1;
    span[move].tabIndex = 0;
    span[move].focus();
  });
}
