"""Models on demand under mixed traffic, a short run of `python -m bench models_soak`
under `ovtrio serve`: a folder of four models (the embedded GGUF linked under four
names), --models-max 2 and a short idle unload, and clients sending chat completions,
completions and Responses (streamed or not) over the models with skew, leaving streams
and loads midway, loading and unloading by hand, with keep_alive, for an unknown model
and with bad bodies. Every answer must be one the docs promise (200, a documented 4xx,
503 with Retry-After) within its deadline, /metrics must agree with /v1/models whenever
nothing runs, no traceback may reach the log, and the memory must come back once every
model is unloaded. bench/scenarios/models_soak.py says what each check is.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trio

from conftest import RunningServer
from server_pool import server_fixture

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scenarios.models_soak import NAMES, Goal, Options, Soak, prepare, serving_pid, tracebacks

MODELS = NAMES[:4]
# Seconds of traffic (the scenario's own runs last minutes), and what
# the traffic goes on until it has seen, however long a slow machine takes.
SECONDS = float(os.environ.get("OVTRIO_TEST_SOAK_SECONDS", "10"))
GOAL = Goal(requests=15, answered=8, quiet_checks=3, models_loaded=3)
# What the run may leave in memory after its last unload, over the first load and unload, in MB.
RSS_BOUND_MB = 50


def four_models(folder: Path) -> None:
    prepare(folder, len(MODELS))


SETTINGS = {"models_max": "2", "model_idle_unload": "4", "num_kv_blocks": "64"}
soak_serve = server_fixture(
    "soak_serve",
    "--models-dir",
    "{folder}/models",
    *(part for key, value in SETTINGS.items() for part in (f"--{key.replace('_', '-')}", value)),
    "--no-embeddings",
    prepare=four_models,
)


def test_mixed_traffic_over_a_folder_of_models_keeps_every_invariant(soak_serve: RunningServer):
    server = soak_serve
    options = Options(MODELS, 2, clients=4, seconds=SECONDS, deadline=120, quiet_every=9, poll=0.5, at_least=GOAL)
    soak = Soak(server.base_url, serving_pid(server.process), options)
    findings = trio.run(soak.run)

    assert not findings.violations, {key: findings.examples[key] for key in findings.violations}
    assert tracebacks(server.log_path.read_text(errors="replace")) == []
    # The checks ran: quiet moments compared, models loaded and unloaded many times.
    assert findings.reached(GOAL, quiet_to_come=0), (findings.answers, findings.models_loaded, findings.quiet_checks)
    assert soak.rss_end - soak.rss_first_cycle < RSS_BOUND_MB, (soak.rss_first_cycle, soak.rss_end)
