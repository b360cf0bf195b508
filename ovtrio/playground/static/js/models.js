// The model picker, kept in step with the server: a request loads a model, an idle or
// LRU unload removes one, a file copied into the models folder adds one, all without
// the page. /v1/models is read again when a reply ends, the picker is opened, the page
// is shown again, and every 12 s while it is shown (never while hidden). Options change
// in place: an open picker stays open, the chosen model stays chosen, and one the
// server no longer lists stays chosen, marked so, rather than another chosen silently.

import { h } from "./dom.js";

const EVERY_MS = 12000;
const GONE = "no longer served";

// A model's state when the server reports one (unloaded, loading, loaded, failed,
// unloading): a string, or an object with a `value` (llama-server's router).
export function modelStatus(card) {
  const status = card && card.status;
  if (typeof status === "string") return status;
  if (status && typeof status === "object" && typeof status.value === "string") return status.value;
  return null;
}

function label(option, id, status) {
  const text = status ? `${id} · ${status}` : id;
  if (option.value !== id) option.value = id;
  if (option.text !== text) option.text = text;
  if (status) option.dataset.status = status;
  else delete option.dataset.status;
  return option;
}

// Show `cards` in `select`. The model chosen stays chosen (`wanted` is chosen when none
// is yet); a chosen model missing from `cards` stays, marked GONE. Returns its id, or null.
export function fillPicker(select, cards, wanted) {
  const chosen = select.value || null;
  const options = new Map([...select.options].map((option) => [option.value, option]));
  const shown = cards.map((card) => label(options.get(card.id) || h("option"), card.id, modelStatus(card)));
  const gone = chosen && !cards.some((card) => card.id === chosen) ? chosen : null;
  if (gone) shown.push(label(options.get(gone), gone, GONE));
  shown.forEach((option, k) => {
    if (select.options[k] !== option) select.insertBefore(option, select.options[k] || null);
  });
  while (select.options.length > shown.length) select.options[shown.length].remove();
  // (Moving the chosen option can move the choice: it is set again.)
  const keep = chosen || (cards.some((card) => card.id === wanted) ? wanted : null);
  if (keep && select.value !== keep) select.value = keep;
  return gone;
}

// When to read the list: `look(background)` reads it (and may skip a background read,
// say while the key is refused). Reads never overlap: one asked during another runs
// after it, so it never answers with a list older than the asking.
export class ModelRefresh {
  constructor(look) {
    this.look = look;
    this.running = null; // the reads under way, as one promise
    this.queued = null; // null, or whether the read queued is a background one
  }

  // Read the list now (or right after the read under way).
  now(background = false) {
    this.queued = this.queued === null ? background : this.queued && background;
    if (!this.running) this.running = this.drain();
    return this.running;
  }

  async drain() {
    try {
      while (this.queued !== null) {
        const background = this.queued;
        this.queued = null;
        await this.look(background);
      }
    } finally {
      this.running = null;
    }
  }

  // Read it unless a read is under way (a click on the picker gives both a pointerdown
  // and a focus: one read).
  soon() {
    return this.running || this.now(true);
  }

  // The page's own triggers: the picker opened, the page shown again, the interval.
  start(select) {
    select.addEventListener("pointerdown", () => this.soon());
    select.addEventListener("focus", () => this.soon());
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) this.soon();
    });
    setInterval(() => {
      if (!document.hidden) this.soon();
    }, EVERY_MS);
  }
}
