"""Result files: one JSON file per scenario run in bench/results/, holding what the docs'
tables are generated from (bench/report.py), so no figure is typed by hand.

A result holds the scenario, the commit it ran at, the machine's fingerprint, the
arguments, the raw samples, the summary figures the tables show, the UTC time and the
conditions ("busy machine" when other work shared it). Figures measured before results
were files are kept as results too, their source saying where they were copied from.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.driver.hardware import fingerprint

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"

Figure = float | int | str | None


@dataclass
class Outcome:
    """What a scenario's run() returns: the figures its table shows, by a name that says
    what and in which unit ("ratio at 16 streams", "TTFT p50 ms"), and everything it
    measured to reach them."""

    summary: dict[str, Figure]
    samples: Any = field(default=None)
    # What sets this run apart from the scenario's usual one on the same machine (another
    # model, a narrowed instruction set): the report keeps the latest of each apart.
    variant: str = ""


def streams(count: int) -> str:
    """The words a figure's name gives a concurrency: "1 stream", "16 streams"."""
    return f"{count} stream" + ("" if count == 1 else "s")


def commit() -> str:
    """The checkout's commit, with "-dirty" when files other than results differ from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True, cwd=ROOT
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results"],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if changed else "")


def plain(value: Any) -> Any:
    """`value` as JSON can hold it: paths as strings, tuples as lists, nan as null."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set):
        return [plain(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    if value is None or isinstance(value, bool | int | str):
        return value
    return str(value)


def record(
    scenario: str, arguments: dict[str, Any], outcome: Outcome, conditions: str, started: datetime, load: list[float]
) -> dict[str, Any]:
    return {
        "scenario": scenario,
        "source": "measured",
        "commit": commit(),
        "machine": fingerprint(),
        "variant": outcome.variant,
        "conditions": conditions,
        "load_average": [*load, round(os.getloadavg()[0], 2)],
        "time": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "seconds": round((datetime.now(UTC) - started).total_seconds(), 1),
        "arguments": plain(arguments),
        "summary": plain(outcome.summary),
        "samples": plain(outcome.samples),
    }


def write(result: dict[str, Any], folder: Path = RESULTS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    stamp = result["time"].replace("-", "").replace(":", "")
    path = folder / f"{result['scenario']}-{stamp}.json"
    path.write_text(text(result), encoding="utf-8")
    return path


def text(result: dict[str, Any]) -> str:
    """A result as its file holds it: a field a line, the summary a figure a line, the
    raw samples (long) on one line at the end."""
    head = json.dumps({key: value for key, value in result.items() if key != "samples"}, indent=1, ensure_ascii=False)
    samples = json.dumps(result.get("samples"), ensure_ascii=False)
    return head[:-2] + f',\n "samples": {samples}\n}}\n'


def load_all(folder: Path = RESULTS) -> list[dict[str, Any]]:
    return [json.loads(path.read_text(encoding="utf-8")) for path in sorted(folder.glob("*.json"))]


def setup(result: dict[str, Any]) -> str:
    """The machine a result comes from, and its variant if any: the report's columns."""
    variant = result.get("variant")
    return result["machine"]["label"] + (f"; {variant}" if variant else "")


def quiet(result: dict[str, Any]) -> bool:
    return str(result.get("conditions", "")).startswith("quiet")


def latest(
    results: list[dict[str, Any]], quiet_first: bool = False, quiet_apart: bool = False
) -> dict[str, dict[str, dict[str, Any]]]:
    """The newest result of each scenario on each machine (and variant):
    {scenario: {setup: result}}. With `quiet_first`, the newest of those measured on a
    quiet machine where there is one; with `quiet_apart`, the newest quiet one and the
    newest other one each (setup "... (quiet)") when the other came after, so a busy run
    does not hide a quiet one."""
    newest: dict[str, dict[str, dict[str, Any]]] = {}
    for result in sorted(results, key=lambda r: (quiet_first and quiet(r), r["time"])):
        by_setup = newest.setdefault(result["scenario"], {})
        if quiet_apart and quiet(result):
            by_setup.pop(setup(result), None)  # a busy run before it says nothing more
            by_setup[setup(result) + " (quiet)"] = result
        else:
            by_setup[setup(result)] = result
    return newest
