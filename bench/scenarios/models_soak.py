"""Models on demand under minutes of mixed traffic: do the answers, /v1/models, /metrics
and the server's memory stay what the docs say?

    python -m bench models_soak [--minutes 5] [--launcher serve|hypercorn] [--clients 6]
                                [--models 4] [--models-max 2] [--idle-unload 6]

Starts a server on a --models-dir holding the embedded GGUF under `--models` names
(links, one model cache entry for all), with `--models-max`, a short
`--model-idle-unload` and a small KV cache: `ovtrio serve`, or with `--launcher
hypercorn` `hypercorn -k trio ovtrio.app:app` configured by the environment. Each
model is loaded and unloaded once first (what a first load brings for good is not what
an unload should return), then `--clients` clients send, one request after another, a mix over the models
with skew (weights 8:4:2:1...): chat completions, completions and Responses, streamed
and not; streams left after their first token; requests for an unloaded model left
after up to 1.5 s (while it loads); POST /models/load and /models/unload (with and
without drain) by hand; requests with a `keep_alive`; requests for an unknown model
(to generate, load or unload); GET /v1/models/{id}; bad bodies. Each request has a
deadline (`--deadline`).

Invariants, checked and counted (the run's violations; the goal: none):

- every answer is a 200, a documented 4xx in OpenAI's error shape (400 for a bad body
  naming its parameter, 404 `model_not_found`, 409 `model_busy` for an unload that may
  not wait, 429 with Retry-After), or a 503 with Retry-After; a stream ends with its
  end event and no error event; no 500, no request past its deadline;
- no traceback in the server's log;
- every `--poll` seconds: at most `--models-max` models are loaded; the server's RSS
  is recorded;
- every `--quiet-every` seconds, and at the end, the clients pause; once nothing runs
  or loads, for each model: `ovtrio_model_loaded` and `ovtrio_model_state` say what
  /v1/models says, and `ovtrio_model_loads_total` minus every
  `ovtrio_model_unloads_total` is 1 when it is loaded, else 0; then every model is
  unloaded by hand, the RSS read (the slope of these reads over the run is reported),
  and the check made again;
- RSS after the last unload is within `--rss-bound` MB of RSS after each model's
  first load and unload.

Meanwhile /health is asked every 0.25 s: its latency while a load is under way (per the
last /v1/models read) is reported apart. tests/test_models_soak.py runs a short version.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio

from bench.driver import server as servers
from bench.driver.results import Outcome
from bench.driver.stats import percentile

NAMES = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")
TOKENS = 12
# Statuses every request may meet on a busy server: 429 (admission) and 503 (no room
# for a load, an unload ended the request), each with Retry-After.
RETRY = {429, 503}
# An error in a stream: chat and completions send `data: {"error": ...}`, the Responses
# API an `error` event (or a `response.failed` one).
STATES = ("unloaded", "loading", "loaded", "unloading", "failed")
ERROR_EVENT = re.compile(r'^data: \{"error"|^event: (error|response\.failed)', re.M)


@dataclass(frozen=True)
class Options:
    models: tuple[str, ...]
    models_max: int
    clients: int = 6
    seconds: float = 300.0
    deadline: float = 180.0
    quiet_every: float = 60.0
    poll: float = 1.0
    seed: int = 0
    # The traffic goes on past `seconds` until the run has seen this much (a test's goal,
    # so a slow machine runs longer instead of checking less), up to `cap` seconds.
    at_least: Goal | None = None
    cap: float = 1800.0


@dataclass(frozen=True)
class Goal:
    requests: int = 0
    answered: int = 0  # of them answered 200
    quiet_checks: int = 0
    models_loaded: int = 0


@dataclass
class Findings:
    """What the run saw: answers by kind and outcome, violations with one example each,
    the checks at quiet moments and the series read meanwhile."""

    answers: Counter[str] = field(default_factory=Counter)
    violations: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, list[float]] = field(default_factory=dict)
    quiet_checks: list[dict[str, Any]] = field(default_factory=list)
    rss: list[tuple[float, float]] = field(default_factory=list)  # (seconds into the run, MB)
    rss_none_loaded: list[tuple[float, float]] = field(default_factory=list)  # after each quiet moment's unloads
    states: list[tuple[float, dict[str, str]]] = field(default_factory=list)
    health_ms: list[tuple[float, float, bool]] = field(default_factory=list)  # (t, ms, a load under way)

    def violation(self, key: str, example: str) -> None:
        self.violations[key] += 1
        self.examples.setdefault(key, example[:500])

    @property
    def requests(self) -> int:
        return sum(self.answers.values())

    @property
    def answered(self) -> int:
        return sum(count for key, count in self.answers.items() if key.endswith(": 200"))

    @property
    def models_loaded(self) -> set[str]:
        """The models seen loaded at least once."""
        return {name for _, statuses in self.states for name, status in statuses.items() if status == "loaded"}

    def reached(self, goal: Goal, quiet_to_come: int) -> bool:
        return (
            self.requests >= goal.requests
            and self.answered >= goal.answered
            and len(self.quiet_checks) + quiet_to_come >= goal.quiet_checks
            and len(self.models_loaded) >= goal.models_loaded
        )


def metric_samples(exposition: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name.startswith("ovtrio_model_")
    }


def lifecycle(samples: dict, name: str) -> dict[str, float]:
    """One model's loaded gauge, state gauges, loads and unloads from /metrics samples."""
    view: dict[str, float] = {"loads": 0.0, "unloads": 0.0}
    for (metric, labels), value in samples.items():
        label = dict(labels)
        if label.get("model_name") != name:
            continue
        if metric == "ovtrio_model_loaded":
            view["loaded"] = value
        elif metric == "ovtrio_model_state":
            view[f"state {label['state']}"] = value
        elif metric == "ovtrio_model_loads_total":
            view["loads"] += value
        elif metric == "ovtrio_model_unloads_total":
            view["unloads"] += value
    return view


def disagreements(samples: dict, statuses: dict[str, str], names: tuple[str, ...]) -> list[str]:
    """Where /metrics says otherwise than /v1/models, for each model of `names`."""
    found = []
    for name in names:
        status = statuses.get(name)
        view = lifecycle(samples, name)
        loaded = 1.0 if status == "loaded" else 0.0
        if view.get("loaded") != loaded:
            found.append(f"{name}: /v1/models says {status}, ovtrio_model_loaded {view.get('loaded')}")
        states = {key[6:] for key, value in view.items() if key.startswith("state ") and value == 1}
        if states != {status}:
            found.append(f"{name}: /v1/models says {status}, ovtrio_model_state {sorted(states)}")
        if view["loads"] - view["unloads"] != loaded:
            found.append(f"{name}: {status}, but {view['loads']:g} loads and {view['unloads']:g} unloads")
    return found


class Soak:
    """Mixed traffic against a server of `options.models` (a --models-dir of them) on
    `base_url`, whose serving process is `pid`; run() fills `findings`."""

    def __init__(self, base_url: str, pid: int, options: Options) -> None:
        self.base_url = base_url
        self.pid = pid
        self.options = options
        self.findings = Findings()
        self.random = random.Random(options.seed)
        self.weights = [2 ** (len(options.models) - 1 - i) for i in range(len(options.models))]
        self.statuses: dict[str, str] = {}  # the last /v1/models read
        self.running = 0  # requests in flight
        self.gate = trio.Event()  # set: clients may send
        self.gate.set()
        self.began = 0.0
        self.rss_first_cycle = float("nan")
        self.rss_fresh = float("nan")
        self.rss_end = float("nan")
        self.http: httpx.AsyncClient

    # ---- reading the server ------------------------------------------------------------

    async def models(self) -> dict[str, str]:
        reply = await self.http.get("/v1/models", timeout=30)
        reply.raise_for_status()
        return {
            card["id"]: card["status"]["value"] for card in reply.json()["data"] if card["id"] in self.options.models
        }

    async def metrics(self) -> dict:
        reply = await self.http.get("/metrics", timeout=30)
        reply.raise_for_status()
        return metric_samples(reply.text)

    def rss(self) -> float:
        return servers.rss_mb(self.pid)

    def now(self) -> float:
        return time.monotonic() - self.began

    # ---- requests --------------------------------------------------------------------------

    def pick(self) -> str:
        return self.random.choices(self.options.models, self.weights)[0]

    def judge(self, kind: str, reply: httpx.Response, body: bytes, allowed: dict[int, str | None]) -> str:
        """The outcome of an answer, counted; a violation when it is none the docs promise.
        `allowed`: the 4xx this kind may get, with the error code each carries (None: any)."""
        status = reply.status_code
        if status == 200:
            return "200"
        try:
            error = json.loads(body)["error"]
            shaped = {"message", "type", "param", "code"} <= set(error)
        except (ValueError, KeyError, TypeError):
            error, shaped = {}, False
        code = error.get("code") if isinstance(error, dict) else None
        outcome = f"{status} {code}"
        if status in RETRY:
            if "retry-after" not in reply.headers:
                self.findings.violation(f"{kind}: {status} without Retry-After ({code})", body.decode(errors="replace"))
            return outcome
        if status in allowed and shaped and (allowed[status] is None or allowed[status] == code):
            return outcome
        self.findings.violation(f"{kind}: {outcome}", body.decode(errors="replace"))
        return outcome

    async def send(self, kind: str, action: Callable[[], Awaitable[str]]) -> None:
        """Run one request under its deadline and count its outcome."""
        began = time.monotonic()
        outcome = "hang"
        self.running += 1
        try:
            with trio.move_on_after(self.options.deadline):
                try:
                    outcome = await action()
                except (httpx.HTTPError, ValueError) as exc:  # a dropped connection, a reply that is no JSON
                    outcome = f"{type(exc).__name__}"
                    self.findings.violation(f"{kind}: {outcome}", repr(exc))
            if outcome == "hang":
                self.findings.violation(f"{kind}: no answer within {self.options.deadline:g} s", kind)
        finally:
            self.running -= 1
        self.findings.answers[f"{kind}: {outcome}"] += 1
        self.findings.seconds.setdefault(kind, []).append(time.monotonic() - began)

    async def post(self, kind: str, path: str, body: Any, allowed: dict[int, str | None] | None = None) -> str:
        reply = await self.http.post(path, json=body)
        if reply.status_code == 200 and not self.whole(path, reply.json()):
            self.findings.violation(f"{kind}: 200 without its reply", reply.text)
        return self.judge(kind, reply, reply.content, allowed or {})

    @staticmethod
    def whole(path: str, reply: dict) -> bool:
        if path.endswith("/responses"):
            return reply.get("status") in ("completed", "incomplete")
        if path.endswith(("/completions",)):
            return bool(reply.get("choices")) and reply["choices"][0].get("finish_reason") in ("stop", "length")
        return bool(reply.get("success"))

    async def stream(self, kind: str, path: str, body: dict, leave_after_first: bool = False) -> str:
        """A streamed request read to its end (or to its first token, and left)."""
        async with self.http.stream(
            "POST", path, content=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        ) as reply:
            if reply.status_code != 200:
                return self.judge(kind, reply, await reply.aread(), {})
            text = ""
            async for chunk in reply.aiter_text():
                text += chunk
                if leave_after_first and ('"delta":' in text or '"text":' in text):
                    return "left mid-stream"
        if ERROR_EVENT.search(text):
            self.findings.violation(f"{kind}: error event", text[-500:])
            return "error event"
        ended = (
            "data: [DONE]" in text
            if not path.endswith("/responses")
            else ("response.completed" in text or "response.incomplete" in text)
        )
        if not ended:
            self.findings.violation(f"{kind}: stream without its end", text[-500:])
            return "cut"
        return "200"

    def chat_body(self, model: str, **extra: Any) -> dict:
        content = f"Tell me about {self.random.choice(['the sea', 'a fox', 'a comet', 'a violin'])}."
        return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": TOKENS, **extra}

    def completion_body(self, model: str, **extra: Any) -> dict:
        return {"model": model, "prompt": "Once upon a time", "max_tokens": TOKENS, **extra}

    def responses_body(self, model: str, **extra: Any) -> dict:
        return {"model": model, "input": "Say something.", "max_output_tokens": TOKENS, "store": False, **extra}

    async def leave_while_loading(self) -> str:
        unloaded = [name for name, status in self.statuses.items() if status == "unloaded"]
        model = self.random.choice(unloaded) if unloaded else self.pick()
        with trio.move_on_after(self.random.uniform(0.2, 1.5)):
            return await self.post("leave_loading", "/v1/chat/completions", self.chat_body(model))
        return "left while waiting"

    async def bad_body(self) -> str:
        model = self.pick()
        cases: list[tuple[str, bytes, str | None]] = [
            ("/v1/chat/completions", b'{"model": "' + model.encode() + b'", "messages": [', None),
            ("/v1/chat/completions", json.dumps({"model": model}).encode(), "messages"),
            ("/v1/chat/completions", json.dumps(self.chat_body(model, max_tokens=-1)).encode(), "max_tokens"),
            ("/v1/chat/completions", json.dumps(self.chat_body(model, keep_alive="soon")).encode(), "keep_alive"),
            ("/v1/completions", json.dumps(self.completion_body(model, temperature="hot")).encode(), "temperature"),
            ("/models/load", b"{}", "model"),
            ("/models/unload", json.dumps({"model": 7}).encode(), "model"),
        ]
        path, raw, param = self.random.choice(cases)
        reply = await self.http.post(path, content=raw, headers={"Content-Type": "application/json"})
        outcome = self.judge("bad_body", reply, reply.content, {400: None})
        if reply.status_code == 400 and param is not None and reply.json()["error"].get("param") != param:
            self.findings.violation(
                f"bad_body: 400 naming {reply.json()['error'].get('param')}, not {param}", reply.text
            )
        return outcome

    def kinds(self) -> list[tuple[str, int, Callable[[], Awaitable[str]]]]:
        """Each kind of request: name, weight, and the call that sends one."""
        chat, completion, responses = "/v1/chat/completions", "/v1/completions", "/v1/responses"
        alive = self.random.choice
        return [
            ("chat", 6, lambda: self.post("chat", chat, self.chat_body(self.pick()))),
            ("chat_stream", 6, lambda: self.stream("chat_stream", chat, self.chat_body(self.pick(), stream=True))),
            ("completion", 3, lambda: self.post("completion", completion, self.completion_body(self.pick()))),
            (
                "completion_stream",
                3,
                lambda: self.stream("completion_stream", completion, self.completion_body(self.pick(), stream=True)),
            ),
            ("responses", 3, lambda: self.post("responses", responses, self.responses_body(self.pick()))),
            (
                "responses_stream",
                3,
                lambda: self.stream("responses_stream", responses, self.responses_body(self.pick(), stream=True)),
            ),
            (
                "leave_stream",
                2,
                lambda: self.stream("leave_stream", chat, self.chat_body(self.pick(), stream=True), True),
            ),
            ("leave_loading", 2, self.leave_while_loading),
            (
                "keep_alive",
                2,
                lambda: self.post(
                    "keep_alive", chat, self.chat_body(self.pick(), keep_alive=alive([0, "2s", "1m", -1]))
                ),
            ),
            ("load", 1, lambda: self.post("load", "/models/load", {"model": self.pick()})),
            (
                "unload",
                1,
                lambda: self.post(
                    "unload",
                    "/models/unload",
                    {"model": self.pick(), "drain": alive([True, False])},
                    {409: "model_busy"},
                ),
            ),
            ("unknown_model", 1, self.unknown_model),
            ("model_card", 1, self.model_card),
            ("bad_body", 1, self.bad_body),
        ]

    async def unknown_model(self) -> str:
        """A model the server does not have, named to a generation route or to load or unload."""
        path, body = self.random.choice(
            [
                ("/v1/chat/completions", self.chat_body("no-such-model")),
                ("/v1/responses", self.responses_body("no-such-model", stream=True)),
                ("/models/load", {"model": "no-such-model"}),
                ("/models/unload", {"model": "no-such-model"}),
            ]
        )
        return await self.post("unknown_model", path, body, {404: "model_not_found"})

    async def model_card(self) -> str:
        """GET /v1/models/{id}: the model's card, with its state."""
        model = self.pick()
        reply = await self.http.get(f"/v1/models/{model}")
        if reply.status_code == 200 and reply.json()["status"]["value"] not in STATES:
            self.findings.violation("model_card: no state", reply.text)
        return self.judge("model_card", reply, reply.content, {})

    def traffic_done(self, until: float) -> bool:
        """Past `until`, with the goal reached (the quiet moment at the end counting
        among its quiet checks), or past the cap."""
        now, goal = time.monotonic(), self.options.at_least
        if now >= self.began + self.options.cap:
            return True
        return now >= until and (goal is None or self.findings.reached(goal, quiet_to_come=1))

    async def client(self, until: float) -> None:
        kinds = self.kinds()
        weights = [weight for _, weight, _ in kinds]
        while not self.traffic_done(until):
            await self.gate.wait()
            if self.traffic_done(until):
                return
            name, _, action = self.random.choices(kinds, weights)[0]
            await self.send(name, action)

    # ---- watching -------------------------------------------------------------------------

    async def poll(self) -> None:
        """/v1/models and RSS every `poll` seconds; at most models_max models hold an engine."""
        while True:
            try:
                self.statuses = await self.models()
            except (httpx.HTTPError, ValueError) as exc:
                self.findings.violation("GET /v1/models failed", repr(exc))
            else:
                self.findings.states.append((round(self.now(), 2), dict(self.statuses)))
                # (An unloading model may hold an engine or not: one unloaded while its
                # load waited for its turn never had one. The loaded ones surely do.)
                loaded = [name for name, status in self.statuses.items() if status == "loaded"]
                if len(loaded) > self.options.models_max:
                    self.findings.violation(
                        f"more than --models-max {self.options.models_max} loaded", str(self.statuses)
                    )
            self.findings.rss.append((round(self.now(), 2), round(self.rss(), 1)))
            await trio.sleep(self.options.poll)

    async def probe_health(self) -> None:
        while True:
            loading = any(status == "loading" for status in self.statuses.values())
            began = time.perf_counter()
            with trio.move_on_after(10) as scope:
                try:
                    reply = await self.http.get("/health", timeout=10)
                    if reply.status_code != 200:
                        self.findings.violation(f"/health {reply.status_code}", reply.text)
                except httpx.HTTPError as exc:
                    self.findings.violation("/health failed", repr(exc))
            if scope.cancelled_caught:
                self.findings.violation("/health: no answer within 10 s", "")
            self.findings.health_ms.append((round(self.now(), 2), (time.perf_counter() - began) * 1e3, loading))
            await trio.sleep(0.25)

    async def settle(self, within: float = 120) -> dict[str, str]:
        """Once no request of ours runs and no model loads or unloads: /v1/models."""
        deadline = time.monotonic() + within
        while self.running and time.monotonic() < deadline:
            await trio.sleep(0.05)
        while True:
            statuses = await self.models()
            if not any(status in ("loading", "unloading") for status in statuses.values()):
                return statuses
            if time.monotonic() > deadline:
                self.findings.violation("a model still loading or unloading at a quiet moment", str(statuses))
                return statuses
            await trio.sleep(0.1)

    @asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """The clients send nothing new meanwhile."""
        self.gate = trio.Event()
        try:
            yield
        finally:
            self.gate.set()

    async def quiet_moment(self) -> None:
        """With the clients paused and nothing running: the quiet check, then every model
        unloaded by hand and the RSS read, then the check again."""
        async with self.paused():
            await self.quiet_check()
            await self.unload_every_model()
            await self.quiet_check()

    async def quiet_check(self) -> None:
        """Once nothing runs: /metrics agrees with /v1/models (read between two /metrics
        reads that agree, since an idle unload may come at any moment)."""
        await self.settle()
        found: list[str] = []
        for _ in range(10):
            before = await self.metrics()
            statuses = await self.models()
            after = await self.metrics()
            views = [lifecycle(before, name) for name in self.options.models]
            if views != [lifecycle(after, name) for name in self.options.models] or any(
                status in ("loading", "unloading") for status in statuses.values()
            ):
                await trio.sleep(0.2)
                continue
            found = disagreements(after, statuses, self.options.models)
            self.findings.quiet_checks.append({"t": round(self.now(), 1), "statuses": statuses, "disagreements": found})
            break
        else:
            self.findings.violation("no quiet moment to compare /metrics and /v1/models", "")
        for each in found:
            self.findings.violation("/metrics disagrees with /v1/models at a quiet moment", each)

    async def quiet_checks(self, until: float) -> None:
        while True:
            before_end = until - time.monotonic() - 1
            await trio.sleep(min(self.options.quiet_every, before_end) if before_end > 0 else self.options.quiet_every)
            if self.traffic_done(until - 2):
                return
            await self.quiet_moment()

    # ---- the run ----------------------------------------------------------------------

    async def first_cycle(self) -> None:
        """Each model loaded and unloaded once: what a first load brings for good
        (modules, libraries, the model's series in /metrics) stays; the RSS after it is
        what later unloads should come back to."""
        self.rss_fresh = self.rss()
        for model in self.options.models:
            for path in ("/models/load", "/models/unload"):
                reply = await self.http.post(path, json={"model": model}, timeout=300)
                reply.raise_for_status()
        await trio.sleep(2)
        self.rss_first_cycle = self.rss()

    async def unload_every_model(self) -> None:
        """Unload every model by hand, then read the RSS (the server returns what the
        engines held at once)."""
        await self.settle()
        for model in self.options.models:
            reply = await self.http.post("/models/unload", json={"model": model}, timeout=300)
            if reply.status_code != 200:
                self.findings.violation(f"unloading every model: {reply.status_code}", reply.text)
        await trio.sleep(2)
        self.rss_end = self.rss()
        self.findings.rss_none_loaded.append((round(self.now(), 2), round(self.rss_end, 1)))

    async def run(self) -> Findings:
        # Idle connections are dropped after a second, before the server's keep-alive
        # timeout (2 s for the tests' hypercorn servers) closes them: a request sent on a
        # connection the server is closing at that moment meets a reset, a race of the
        # client's pool and no answer of the server's.
        limits = httpx.Limits(max_connections=4 * self.options.clients + 8, keepalive_expiry=1.0)
        async with httpx.AsyncClient(base_url=self.base_url, timeout=self.options.deadline, limits=limits) as http:
            self.http = http
            self.began = time.monotonic()
            await self.first_cycle()
            until = time.monotonic() + self.options.seconds
            async with trio.open_nursery() as watchers:
                watchers.start_soon(self.poll)
                watchers.start_soon(self.probe_health)
                async with trio.open_nursery() as nursery:
                    for _ in range(self.options.clients):
                        nursery.start_soon(self.client, until)
                    nursery.start_soon(self.quiet_checks, until)
                await self.quiet_moment()
                watchers.cancel_scope.cancel()
        return self.findings


def slope_mb_per_minute(samples: list[tuple[float, float]]) -> float:
    """The least-squares slope of RSS against time, MB a minute (nan under 3 samples)."""
    if len(samples) < 3:
        return float("nan")
    return statistics.linear_regression([t / 60 for t, _ in samples], [mb for _, mb in samples]).slope


def serving_pid(process: subprocess.Popen) -> int:
    """The process that serves: `ovtrio serve` itself, or hypercorn's worker (the
    largest of its children)."""
    pid = process.pid
    children = [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return max([pid, *children], key=servers.rss_mb)


def tracebacks(log: str) -> list[str]:
    """The tracebacks in a server's log, each from its line to the next blank-less end."""
    found = []
    lines = log.splitlines()
    for at, line in enumerate(lines):
        if line.startswith("Traceback"):
            end = at + 1
            while end < len(lines) and (lines[end].startswith((" ", "\t")) or not lines[end][:1].isalnum()):
                end += 1
            found.append("\n".join(lines[max(0, at - 2) : end + 1]))
    return found


def prepare(folder: Path, count: int) -> tuple[str, ...]:
    from ovtrio.model import embedded_model_path

    models = folder / "models"
    models.mkdir()
    names = NAMES[:count]
    for name in names:
        (models / f"{name}.gguf").symlink_to(embedded_model_path())
    return names


def launch(options: argparse.Namespace, folder: Path, log: Any) -> servers.Server:
    settings = {
        "models_dir": str(folder / "models"),
        "models_max": str(options.models_max),
        "model_idle_unload": f"{options.idle_unload:g}",
        "num_kv_blocks": str(options.num_kv_blocks),
        "embeddings": "false",
    }
    if options.launcher == "serve":
        flags = []
        for key, value in settings.items():
            flags += ["--no-embeddings"] if key == "embeddings" else [f"--{key.replace('_', '-')}", value]
        return servers.start([*flags, *options.server_arg], log=log)
    env = {f"OVTRIO_{key.upper()}": value for key, value in settings.items()}
    return servers.start_hypercorn(env=env, log=log)


def report(findings: Findings, soak: Soak, log_tracebacks: list[str]) -> dict[str, Any]:
    outcomes: Counter[str] = Counter()
    for key, count in findings.answers.items():
        outcome = key.split(": ", 1)[1]
        group = (
            "200"
            if outcome in ("200", "left mid-stream", "left while waiting")
            else "503 with Retry-After"
            if outcome.startswith("503")
            else "4xx"
            if outcome[:1] == "4"
            else "other"
        )
        outcomes[group] += count
    during = [ms for _, ms, loading in findings.health_ms if loading]
    others = [ms for _, ms, loading in findings.health_ms if not loading]
    checks = findings.quiet_checks
    return {
        "requests": findings.requests,
        "answered 200 (or left)": outcomes["200"],
        "documented 4xx": outcomes["4xx"],
        "503 with Retry-After": outcomes["503 with Retry-After"],
        "violations": sum(findings.violations.values()),
        "tracebacks in the log": len(log_tracebacks),
        "quiet checks agreeing": f"{sum(not check['disagreements'] for check in checks)} of {len(checks)}",
        "RSS fresh MB": round(soak.rss_fresh),
        "RSS after each model's first load and unload MB": round(soak.rss_first_cycle),
        "RSS at most MB": round(max(mb for _, mb in findings.rss)),
        "RSS after the last unload MB": round(soak.rss_end),
        "RSS with no model loaded, slope MB/min": slope_mb_per_minute(findings.rss_none_loaded),
        "/health p50 ms during loads": percentile(during, 50),
        "/health p99 ms during loads": percentile(during, 99),
        "/health max ms during loads": max(during, default=float("nan")),
        "/health p99 ms otherwise": percentile(others, 99),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=5)
    parser.add_argument("--launcher", choices=("serve", "hypercorn"), default="serve")
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--models", type=int, default=4, choices=range(2, len(NAMES) + 1), metavar="N")
    parser.add_argument("--models-max", type=int, default=2)
    parser.add_argument("--idle-unload", type=float, default=6.0, help="--model-idle-unload seconds")
    parser.add_argument("--num-kv-blocks", type=int, default=64)
    parser.add_argument("--deadline", type=float, default=180.0, help="seconds a request may take")
    parser.add_argument("--quiet-every", type=float, default=60.0, help="seconds between quiet checks")
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between /v1/models and RSS reads")
    parser.add_argument("--rss-bound", type=float, default=50.0, help="MB the last unload may leave above the first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-arg", action="append", default=[], help="extra `ovtrio serve` flag (repeatable)")


def run(args: argparse.Namespace) -> Outcome:
    folder = Path(tempfile.mkdtemp(prefix="bench-models-soak-"))
    names = prepare(folder, args.models)
    log_path = folder / "server.log"
    options = Options(
        names, args.models_max, args.clients, args.minutes * 60, args.deadline, args.quiet_every, args.poll, args.seed
    )
    load = [round(os.getloadavg()[0], 2)]
    with open(log_path, "w") as log:
        server = launch(args, folder, log)
        try:
            servers.ready_by_http(server.port, lambda: server.process.poll() is None)
            soak = Soak(server.base_url, serving_pid(server.process), options)
            findings = trio.run(soak.run)
            load.append(round(os.getloadavg()[0], 2))
            alive = server.process.poll() is None
        finally:
            servers.stop(server.process)
    found = tracebacks(log_path.read_text(errors="replace"))
    summary: dict[str, Any] = {"minutes": args.minutes, "launcher": args.launcher, **report(findings, soak, found)}
    grew = soak.rss_end - soak.rss_first_cycle
    if not alive:
        findings.violation("the server exited", "")
    if grew > args.rss_bound:
        findings.violation(f"RSS after the last unload {grew:+.0f} MB (bound {args.rss_bound:g})", "")
    summary["violations"] = sum(findings.violations.values()) + len(found)
    summary["load average at the start, end"] = ", ".join(f"{value:g}" for value in load)

    print(
        f"models_soak: {args.minutes:g} min, {args.launcher}, {args.clients} clients, {len(names)} models,"
        f" --models-max {args.models_max}, --model-idle-unload {args.idle_unload:g}; load average {load}"
    )
    for key, count in sorted(findings.answers.items()):
        print(f"  {count:>6}  {key}")
    for key, value in summary.items():
        print(f"{key}: {value}")
    for key, count in findings.violations.most_common():
        print(f"VIOLATION {count} x {key}: {findings.examples[key]}")
    for text in found[:3]:
        print("TRACEBACK in the server log:\n" + text)
    print(f"server log: {log_path}")
    samples = {
        "answers": dict(findings.answers),
        "violations": dict(findings.violations),
        "examples": findings.examples,
        "tracebacks": found[:5],
        "quiet_checks": findings.quiet_checks,
        "latency_s": {
            kind: {"p50": percentile(s, 50), "p99": percentile(s, 99)} for kind, s in findings.seconds.items()
        },
        "rss_mb": findings.rss,
        "rss_mb_none_loaded": findings.rss_none_loaded,
        "states": findings.states,
        "health_ms": findings.health_ms,
        "load_average": load,
    }
    return Outcome(summary, samples, variant="" if args.launcher == "serve" else "hypercorn")
