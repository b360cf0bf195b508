// The live server panel: /metrics read every 1.5 s, its Prometheus text parsed here.

import { ApiError } from "./api.js";

// Samples of a Prometheus text exposition: [{name, labels, value}].
export function parsePrometheus(text) {
  const samples = [];
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (!line || line.startsWith("#")) continue;
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!match) continue;
    const labels = {};
    const labelText = match[2] || "";
    const pair = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
    let found;
    while ((found = pair.exec(labelText))) labels[found[1]] = found[2].replace(/\\n/g, "\n").replace(/\\(.)/g, "$1");
    const value = match[3] === "+Inf" ? Infinity : match[3] === "-Inf" ? -Infinity : parseFloat(match[3]);
    samples.push({ name: match[1], labels, value });
  }
  return samples;
}

// The sum of a metric's samples (of one model when `model` names one that has it).
export function metricValue(samples, name, model) {
  const matching = samples.filter((s) => s.name === name);
  const ofModel = model ? matching.filter((s) => s.labels.model_name === model) : [];
  const chosen = ofModel.length ? ofModel : matching;
  if (!chosen.length) return null;
  return chosen.reduce((sum, s) => sum + s.value, 0);
}

export class ServerPanel {
  constructor(elements, getKey, getModel, intervalMs = 1500) {
    this.el = elements;
    this.getKey = getKey;
    this.getModel = getModel;
    this.intervalMs = intervalMs;
    this.timer = null;
    this.last = null;
    this.history = [];
  }

  start() {
    const tick = async () => {
      if (!document.hidden) await this.refresh();
      this.timer = setTimeout(tick, this.intervalMs);
    };
    tick();
  }

  async refresh() {
    const key = this.getKey();
    let text;
    try {
      const response = await fetch("/metrics", { headers: key ? { Authorization: "Bearer " + key } : {}, cache: "no-store" });
      if (response.status === 401) throw new ApiError(401, "The metrics need the API key.");
      if (!response.ok) throw new ApiError(response.status, `Metrics unavailable (${response.status}).`);
      text = await response.text();
    } catch (error) {
      this.show(null, error instanceof ApiError ? error.message : "The server does not answer.");
      return;
    }
    const samples = parsePrometheus(text);
    const model = this.getModel();
    const now = performance.now();
    const generated = metricValue(samples, "ovtrio_generated_tokens_total", model) ?? metricValue(samples, "vllm:generation_tokens_total", model);
    let rate = null;
    if (this.last && generated != null && this.last.generated != null && now > this.last.at) {
      rate = Math.max(0, ((generated - this.last.generated) * 1000) / (now - this.last.at));
    }
    this.last = { at: now, generated };
    this.show(
      {
        running: metricValue(samples, "ovtrio_requests_running", model) ?? metricValue(samples, "vllm:num_requests_running", model),
        queued: metricValue(samples, "ovtrio_requests_waiting", model) ?? metricValue(samples, "vllm:num_requests_waiting", model),
        kv: metricValue(samples, "ovtrio_kv_cache_usage_percent", model) ?? scale(metricValue(samples, "vllm:kv_cache_usage_perc", model)),
        rate,
      },
      null
    );
  }

  show(values, problem) {
    const { running, queued, kv, kvBar, rate, status, spark } = this.el;
    status.textContent = problem || "live";
    status.className = problem ? "panel-status bad" : "panel-status good";
    if (!values) {
      // Down: no figures rather than old ones that look current.
      for (const el of [running, queued, kv, rate]) el.textContent = "–";
      kvBar.value = 0;
      this.last = null;
      this.history = [];
      drawSpark(spark, this.history);
      return;
    }
    running.textContent = format(values.running, 0);
    queued.textContent = format(values.queued, 0);
    kv.textContent = values.kv == null ? "–" : format(values.kv, 1) + " %";
    kvBar.value = values.kv == null ? 0 : Math.min(100, values.kv);
    rate.textContent = values.rate == null ? "–" : format(values.rate, 0);
    this.history.push(values.rate || 0);
    if (this.history.length > 40) this.history.shift();
    drawSpark(spark, this.history);
  }
}

function scale(fraction) {
  return fraction == null ? null : fraction * 100;
}

function format(value, digits) {
  return value == null || !Number.isFinite(value) ? "–" : value.toFixed(digits);
}

// Generated tokens per second over the last minute, as small bars.
function drawSpark(container, values) {
  const peak = Math.max(1, ...values);
  while (container.children.length < values.length) container.append(document.createElement("i"));
  while (container.children.length > values.length) container.firstChild.remove();
  values.forEach((v, k) => {
    container.children[k].style.height = Math.max(4, Math.round((v / peak) * 100)) + "%";
  });
}
