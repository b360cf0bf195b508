"""Regenerate the benchmark tables in docs/benchmarks.md and the README's speed figures
from the result files in bench/results/ (and docs/peer.png, with matplotlib).

Each scenario's section in docs/benchmarks.md holds a table between two markers:

    <!-- bench report: serving -->
    ...
    <!-- end bench report -->

with a column for the latest result of the scenario on each machine (and variant: another
model, a narrowed instruction set), and the README's speed paragraph sits between the
same markers named `speed`. Everything between the markers is generated: edit the
results or this module, never the text. docs/peer.png names the result it was drawn
from in its Source field. tests/test_bench_report.py fails when the pages differ from
what this writes, or the drawing from the newest peer result.
"""

from __future__ import annotations

import argparse
import io
import re
from pathlib import Path
from typing import Any

from bench.driver.results import RESULTS, ROOT, latest, load_all, streams

DOCS = ROOT / "docs" / "benchmarks.md"
README = ROOT / "README.md"
PLOT = ROOT / "docs" / "peer.png"
START = "<!-- bench report: {name} -->"
END = "<!-- end bench report -->"
SECTION = re.compile(r"<!-- bench report: (?P<name>[\w-]+) -->\n.*?<!-- end bench report -->", re.S)

Results = dict[str, dict[str, dict[str, Any]]]


def number(value: Any) -> str:
    """A figure as the tables print it: three significant digits or so, no more than the
    machines' drift (up to 15%) lets mean anything."""
    if value is None:
        return "-"
    if isinstance(value, bool | str):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def provenance(result: dict[str, Any]) -> str:
    imported = result.get("source", "measured") != "measured"
    when = result["time"][:10]
    conditions = result.get("conditions") or "conditions not recorded"
    origin = ", imported from before results were files" if imported else ""
    return f"{when}, {result['commit']}, {conditions}{origin}"


def table(by_setup: dict[str, dict[str, Any]]) -> str:
    """A scenario's latest results as one Markdown table: a column per setup, a row per
    figure (in the order the newest result gives them)."""
    setups = sorted(by_setup, key=lambda setup: by_setup[setup]["time"], reverse=True)
    figures: list[str] = []
    for setup in setups:
        figures += [name for name in by_setup[setup]["summary"] if name not in figures]
    lines = [
        "| | " + " | ".join(setups) + " |",
        "|---|" + "---:|" * len(setups),
        "| run | " + " | ".join(provenance(by_setup[setup]) for setup in setups) + " |",
    ]
    for figure in figures:
        cells = [number(by_setup[setup]["summary"].get(figure)) for setup in setups]
        lines.append(f"| {figure} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def section(name: str, results: Results) -> str:
    body = table(results[name]) if name in results else "No result yet: run it."
    return f"{START.format(name=name)}\n{body}\n{END}"


# ---- the README's speed paragraph ----------------------------------------------------------


def ratios(result: dict[str, Any], model: str, counts: tuple[int, ...] = (1, 4, 16)) -> str | None:
    summary = result["summary"]
    found = [summary.get(f"{model}: ovtrio/llama-server, {streams(c)}") for c in counts]
    if any(value is None for value in found):
        return None
    return ", ".join(f"{value:.2f}x" for value in found)


def speed(results: Results) -> str:
    """The README's speed figures: ovtrio against llama-server on each machine measured,
    and the server against the bare engine."""
    sentences = []
    for setup, result in sorted(results.get("peer", {}).items(), key=lambda item: item[1]["time"], reverse=True):
        models = [
            f"{'the embedded model' if model.startswith('SmolLM2') else model} {figures}"
            for model in dict.fromkeys(name.split(":", 1)[0] for name in result["summary"] if ":" in name)
            if (figures := ratios(result, model))
        ]
        if models:
            sentences.append(f"{setup} ({provenance(result)}): {'; '.join(models)}")
    text = (
        "ovtrio's output tokens a second over llama.cpp's `llama-server`'s on the same GGUF file, at 1, 4 and"
        " 16 concurrent streams (`python -m bench peer`; the 1B-class model is"
        " `python -m bench.make_tiny_llama /tmp/tiny-llama-q4_0.gguf`): " + ". ".join(sentences) + "."
    )
    serving = sorted(results.get("serving", {}).values(), key=lambda result: result["time"], reverse=True)
    if serving:
        newest = serving[0]
        summary = newest["summary"]
        shares = [
            f"{summary[key]:.2f} at {c}"
            for c in (1, 4, 16)
            if (key := f"server/engine, {streams(c)}") in summary and summary[key] is not None
        ]
        text += (
            "\nAgainst the bare engine on the same prompts (`python -m bench serving`), the server streams "
            + ", ".join(shares)
            + f" streams of the engine's tokens a second ({newest['machine']['label']}; {provenance(newest)})."
        )
    text += prefill_sentence(results)
    return f"{START.format(name='speed')}\n{text}\n{END}"


def prefill_sentence(results: Results) -> str:
    """The README's long-prompt figure: ovtrio's first token over llama-server's at
    2k-8k tokens on the embedded model, alone and beside decoding streams, from the
    newest prefill result that has them."""
    measured = [result for result in results.get("prefill", {}).values() if not result.get("variant")]
    if not measured:
        return ""
    newest = max(measured, key=lambda result: result["time"])
    summary = newest["summary"]
    ratios = {
        name.split("TTFT, ", 1)[1]: value  # "alone, 4096", "beside 4, 4096"
        for name, value in summary.items()
        if "ovtrio/llama-server TTFT, " in name and not name.endswith(", 512") and isinstance(value, float)
    }
    if not ratios:
        return ""
    alone = [value for part, value in ratios.items() if part.startswith("alone")]
    beside = [value for part, value in ratios.items() if part.startswith("beside")]
    return (
        f" Long prompts (`python -m bench prefill`, 2,048-8,128 tokens no cache holds): ovtrio's first token at"
        f" {min(alone):.2f}-{max(alone):.2f} of llama-server's alone and {min(beside):.2f}-{max(beside):.2f}"
        f" beside 4 decoding streams ({newest['machine']['label']}; {provenance(newest)})."
    )


# ---- the pages ---------------------------------------------------------------------------


def render(text: str, results: Results, headline: Results) -> str:
    """`text` with every generated section written afresh: the tables from `results`,
    the README's speed figures from `headline`."""

    def fill(match: re.Match[str]) -> str:
        name = match.group("name")
        return speed(headline) if name == "speed" else section(name, results)

    return SECTION.sub(fill, text)


def pages(folder: Path = RESULTS) -> dict[Path, str]:
    """What docs/benchmarks.md and the README should read, from the results in `folder`:
    the tables show the newest result of each setup, and its newest quiet one beside it;
    the README the newest measured on a quiet machine where there is one (a busy
    machine's figures say little alone)."""
    every = load_all(folder)
    results, headline = latest(every, quiet_apart=True), latest(every, quiet_first=True)
    return {page: render(page.read_text(encoding="utf-8"), results, headline) for page in (DOCS, README)}


def unplaced(folder: Path = RESULTS) -> list[str]:
    """Scenarios with results but no table in docs/benchmarks.md."""
    text = DOCS.read_text(encoding="utf-8")
    return sorted(set(latest(load_all(folder))) - set(SECTION_NAMES.findall(text)))


SECTION_NAMES = re.compile(r"<!-- bench report: ([\w-]+) -->")


def plotted(results: Results) -> dict[str, Any] | None:
    """The result docs/peer.png is drawn from: the newest peer result that has
    llama-server's figures on the machine's own instruction sets."""
    candidates = [
        result
        for result in results.get("peer", {}).values()
        if not result.get("variant") and any("llama-server tok/s" in name for name in result["summary"])
    ]
    return max(candidates, key=lambda r: r["time"]) if candidates else None


def source(result: dict[str, Any]) -> str:
    """Which result a drawing comes from, as the PNG's Source field says it."""
    return f"{result['scenario']} {result['time']} {result['machine']['label']}"


def drawn_from(path: Path = PLOT) -> str | None:
    """The Source field of the PNG at `path` (its tEXt chunks read without matplotlib)."""
    data = path.read_bytes() if path.exists() else b""
    at = 8  # the signature
    while at + 8 <= len(data):
        length, kind = int.from_bytes(data[at : at + 4], "big"), data[at + 4 : at + 8]
        if kind == b"tEXt":
            key, _, value = data[at + 8 : at + 8 + length].partition(b"\0")
            if key == b"Source":
                return value.decode("latin-1")
        at += 12 + length
    return None


def plot(results: Results, path: Path = PLOT) -> None:
    """tok/s and TTFT against concurrency for both servers, from `plotted(results)`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = plotted(results)
    if result is None:
        return
    summary = result["summary"]
    models = list(dict.fromkeys(name.split(":", 1)[0] for name in summary if ":" in name))
    concurrency = sorted({int(m.group(1)) for name in summary if (m := re.search(r", (\d+) streams?$", name))})
    figure, (speed_axes, ttft_axes) = plt.subplots(1, 2, figsize=(11, 4.2))
    for model in models:
        for server, style in (("ovtrio", "-o"), ("llama-server", "--s")):
            label = f"{server}, {model}"
            speed_axes.plot(
                concurrency,
                [summary[f"{model}: {server} tok/s, {streams(c)}"] for c in concurrency],
                style,
                label=label,
            )
            ttft_axes.plot(
                concurrency,
                [summary[f"{model}: {server} TTFT p50 ms, {streams(c)}"] for c in concurrency],
                style,
                label=label,
            )
    for axes, title, unit in ((speed_axes, "output tokens/s", "tok/s"), (ttft_axes, "time to first token, p50", "ms")):
        axes.set_xscale("log", base=2)
        axes.set_xticks(concurrency, [str(c) for c in concurrency])
        axes.set_xlabel("concurrent streams")
        axes.set_ylabel(unit)
        axes.set_title(title)
        axes.grid(alpha=0.3)
    speed_axes.legend(fontsize=8)
    figure.suptitle(f"ovtrio vs llama-server: {result['machine']['label']}, {provenance(result)}", fontsize=10)
    figure.tight_layout()
    drawn = io.BytesIO()
    figure.savefig(drawn, format="png", dpi=110, metadata={"Software": None, "Source": source(result)})
    if not path.exists() or path.read_bytes() != drawn.getvalue():
        path.write_bytes(drawn.getvalue())
        print(f"wrote {path.relative_to(ROOT)}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", type=Path, default=RESULTS, help="the result files to report")
    parser.add_argument("--no-plot", dest="plot", action="store_false", help="leave docs/peer.png as it is")
    parser.add_argument("--check", action="store_true", help="write nothing; fail if a page differs from the results")


def run(args: argparse.Namespace) -> None:
    missing = unplaced(args.results)
    if missing:
        raise SystemExit(f"no table in {DOCS.name} for: {', '.join(missing)} (add its markers)")
    stale = []
    for page, text in pages(args.results).items():
        if page.read_text(encoding="utf-8") != text:
            stale.append(page.relative_to(ROOT))
            if not args.check:
                page.write_text(text, encoding="utf-8")
                print(f"wrote {page.relative_to(ROOT)}")
    if args.check:
        newest = plotted(latest(load_all(args.results)))
        if newest is not None and drawn_from() != source(newest):
            stale.append(PLOT.relative_to(ROOT))
        if stale:
            raise SystemExit(f"differ from the results: {', '.join(map(str, stale))} (run python -m bench report)")
        return
    if args.plot:
        try:
            plot(latest(load_all(args.results)))
        except ImportError:
            print("matplotlib is not installed (pip install -e '.[bench]'): docs/peer.png left as it is")
