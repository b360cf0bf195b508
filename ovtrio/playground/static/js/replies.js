// A reply's figures (time to first token, tokens/s, tokens) and how it ended, and the
// reasoning a model writes into its content.

import { h } from "./dom.js";
import { API_MODES } from "./api.js";

// A model's `<think>…</think>` (reasoning written into the content) is shown folded
// like the reasoning a server reports apart.
export function splitThinking(text) {
  const match = /^\s*<think>([\s\S]*?)(<\/think>|$)/.exec(text);
  if (!match) return { thinking: "", answer: text, open: false };
  return { thinking: match[1].trim(), answer: text.slice(match[0].length).replace(/^\s+/, ""), open: !match[2] };
}

const FINISH = {
  length: ["finish warn", "cut at the token limit (length)"],
  stopped: ["finish warn", "stopped"],
  interrupted: ["finish warn", "cut off"],
  tool_calls: ["finish info", "tool calls"],
  content_filter: ["finish warn", "content_filter"],
};

export function statsView(stats) {
  if (!stats) return h("div", { class: "stats" });
  const items = [];
  const add = (label, value) => value != null && value !== "" && items.push(h("span", { class: "stat" }, h("b", { text: value }), " " + label));
  add("to first token", stats.ttft != null ? formatMs(stats.ttft) : null);
  if (stats.whole) items.push(h("span", { class: "stat", text: "arrived whole (scored once it ended)" }));
  add("tok/s", stats.tps != null ? stats.tps.toFixed(1) : null);
  add("prompt", stats.prompt);
  add("completion", stats.completion);
  add("cached", stats.cached != null ? stats.cached : stats.prompt != null ? "–" : null);
  if (stats.mode) items.push(h("span", { class: "stat mode", text: API_MODES[stats.mode] || stats.mode }));
  if (stats.finish && stats.finish !== "stop") {
    const [cls, text] = FINISH[stats.finish] || ["finish warn", stats.finish];
    items.push(h("span", { class: "stat " + cls, title: "finish_reason: " + stats.finish, text }));
  }
  return h("div", { class: "stats" }, items);
}

function formatMs(ms) {
  return ms >= 1000 ? (ms / 1000).toFixed(2) + " s" : Math.round(ms) + " ms";
}
