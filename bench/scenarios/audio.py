"""Speech to text: what a minute of audio costs on a Whisper model, alone and through HTTP.

    python -m bench audio [--model FOLDER | --shape base] [--minutes 1] [--clients 4] [--rounds 2]
        [--health-only]

Without --model it builds a random-weight Whisper with whisper-base's sizes
(tests/tiny_whisper.py, `--shape base`: 74 M parameters, its 51,865-token vocabulary,
the fixture's scripted output of a few dozen tokens a window) or the test fixture
(`--shape tiny`); give --model an exported Whisper folder (`optimum-cli export openvino
--model openai/whisper-base FOLDER`) to measure that model instead. The audio is a
minute of tones (a random model writes as many tokens for a tone as for speech).

Measured in one run:
- decoding: seconds to decode the minute from each file format (ovtrio.audio.decode);
- the pipeline alone (WhisperPipeline, in this process while the server idles): seconds
  for the minute, a 30 s window a call, as text, with segment timestamps, with words;
- the server (`ovtrio serve --transcription-model`): the minute sent as WAV, seconds to
  the answer for json and verbose_json (segments, words), the medians of `--rounds`;
- /health latency (p50/p99/max, probed every 20 ms) while `--clients` transcriptions of
  the minute run at once.

`--health-only`, another model or the tiny shape are variants of their own, so such a
run does not hide the full one.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

# The test fixtures (tiny_whisper, audio_files) are imported by module name.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from bench.driver.results import ROOT, Figure, Outcome
from bench.driver.server import serving
from bench.driver.stats import median, percentile

# Each format's name in the table, with the codec tests/audio_files.py writes it in.
FORMATS = {
    "wav": "wav",
    "flac": "flac",
    "mp3": "mp3",
    "ogg": "ogg (opus)",
    "m4a": "m4a (aac)",
    "webm": "webm (opus)",
}
# The pipeline's modes and the server's response formats, as the table names them.
MODES = {"text": "text", "segments": "segment timestamps", "words": "word timestamps"}
KINDS = {"json": "json", "verbose_json": "verbose_json", "verbose_json_words": "verbose_json with words"}


def _minute(minutes: float) -> np.ndarray:
    from audio_files import tone

    return tone(60.0 * minutes, hertz=300)


def _model_folder(args: argparse.Namespace, scratch: Path) -> Path:
    if args.model:
        return Path(args.model)
    import tiny_whisper

    shape = tiny_whisper.BASE if args.shape == "base" else tiny_whisper.TINY
    return tiny_whisper.build(scratch / f"whisper-{args.shape}", shape=shape)


def decode_seconds(samples: np.ndarray) -> dict[str, float]:
    """Seconds to decode the audio from each format."""
    from audio_files import encoded, wav
    from ovtrio.audio.decode import decode

    files = {"wav": wav(samples)}
    files |= {extension: encoded(samples, extension) for extension in ("flac", "mp3", "ogg", "m4a", "webm")}
    timings = {}
    for name, data in files.items():
        started = time.perf_counter()
        decode(data, 3600)
        timings[name] = round(time.perf_counter() - started, 4)
    return timings


def pipeline_seconds(folder: Path, samples: np.ndarray, rounds: int) -> dict[str, float]:
    """Seconds the pipeline alone takes for the audio, a 30 s window a call."""
    import openvino_genai

    from ovtrio.audio.decode import Audio
    from ovtrio.audio.engine import WINDOW_SAMPLES, word_timestamps_available

    words = word_timestamps_available(folder)
    pipeline = openvino_genai.WhisperPipeline(str(folder), "CPU", word_timestamps=words)
    audio = Audio(samples, "wav")
    windows = [audio.window(start, WINDOW_SAMPLES) for start in range(0, len(samples), WINDOW_SAMPLES)]
    pipeline.generate(windows[0], max_new_tokens=4, word_timestamps=False)  # warm up
    modes = {
        "text": {"word_timestamps": False},
        "segments": {"return_timestamps": True, "word_timestamps": False},
    }
    if words:
        modes["words"] = {"return_timestamps": True, "word_timestamps": True}
    figures: dict[str, float] = {}
    for name, config in modes.items():
        times = []
        tokens = 0
        for _ in range(rounds):
            started = time.perf_counter()
            tokens = 0
            for window in windows:
                result = pipeline.generate(window, **config)
                tokens += result.perf_metrics.get_num_generated_tokens()
            times.append(time.perf_counter() - started)
        figures[name] = round(median(times), 3)
        figures[f"{name}_tokens"] = tokens
    del pipeline
    return figures


def _transcribe(base: str, model: str, data: bytes, **fields: Any) -> httpx.Response:
    form: dict[str, Any] = {"model": model, **fields}
    response = httpx.post(
        base + "/v1/audio/transcriptions", data=form, files={"file": ("minute.wav", data)}, timeout=3600
    )
    response.raise_for_status()
    return response


def server_seconds(base: str, model: str, data: bytes, warm_up: bytes, rounds: int, words: bool) -> dict[str, float]:
    _transcribe(base, model, warm_up)
    kinds: dict[str, dict[str, Any]] = {
        "json": {},
        "verbose_json": {"response_format": "verbose_json"},
    }
    if words:
        granularities = ["word", "segment"]
        kinds["verbose_json_words"] = {"response_format": "verbose_json", "timestamp_granularities[]": granularities}
    figures = {}
    for name, fields in kinds.items():
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            _transcribe(base, model, data, **fields)
            times.append(time.perf_counter() - started)
        figures[name] = round(median(times), 3)
    return figures


def health_beside(base: str, model: str, data: bytes, clients: int) -> dict[str, float]:
    """/health latency while `clients` transcriptions of the audio run at once."""
    threads = [threading.Thread(target=_transcribe, args=(base, model, data)) for _ in range(clients)]
    for thread in threads:
        thread.start()
    latencies = []
    with httpx.Client(base_url=base, timeout=30) as probe:
        while any(thread.is_alive() for thread in threads):
            started = time.perf_counter()
            probe.get("/health")
            latencies.append(1000 * (time.perf_counter() - started))
            time.sleep(0.02)
    for thread in threads:
        thread.join()
    return {
        "p50_ms": round(median(latencies), 1),
        "p99_ms": round(percentile(latencies, 99), 1),
        "max_ms": round(max(latencies), 1),
        "probes": len(latencies),
    }


def summary(samples: dict[str, Any]) -> dict[str, Figure]:
    """The docs' table: each figure named with what it is and its unit."""
    found: dict[str, Figure] = {"audio s": samples["audio_seconds"]}
    for name, seconds in samples.get("decode_seconds", {}).items():
        found[f"decoding {FORMATS[name]} s"] = seconds
    for name, value in samples.get("pipeline_seconds", {}).items():
        mode, _, tokens = name.partition("_")
        found[f"pipeline, {MODES[mode]} {tokens or 's'}"] = value
    for name, seconds in samples.get("server_seconds", {}).items():
        found[f"server, {KINDS[name]} s"] = seconds
    if "server_over_pipeline" in samples:
        found["server json / pipeline text"] = samples["server_over_pipeline"]
    health = samples["health_beside_transcriptions"]
    clients = f"{health['clients']} transcriptions"
    for figure in ("p50", "p99", "max"):
        found[f"/health {figure} ms beside {clients}"] = health[f"{figure}_ms"]
    found["/health probes"] = health["probes"]
    return found


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="an exported Whisper folder (default: random weights of --shape)")
    parser.add_argument("--shape", choices=["base", "tiny"], default="base", help="the random model's sizes")
    parser.add_argument("--minutes", type=float, default=1.0, help="length of the audio")
    parser.add_argument("--clients", type=int, default=4, help="transcriptions at once while /health is probed")
    parser.add_argument("--rounds", type=int, default=2, help="turns of each timing; their medians are kept")
    parser.add_argument("--health-only", action="store_true", help="measure /health beside the transcriptions only")


def run(args: argparse.Namespace) -> Outcome:
    from audio_files import wav
    from ovtrio.audio.engine import word_timestamps_available

    samples = _minute(args.minutes)
    seconds = len(samples) / 16000
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        folder = _model_folder(args, scratch)
        words = word_timestamps_available(folder)
        figures: dict[str, Any] = {
            "model": args.model or f"random weights, {args.shape} shape",
            "audio_seconds": seconds,
        }
        if not args.health_only:
            figures["decode_seconds"] = decode_seconds(samples)
            figures["pipeline_seconds"] = pipeline_seconds(folder, samples, args.rounds)
        flags = ["--no-embeddings", "--encoder-preload", "--transcription-model", str(folder)]
        flags += ["--audio-max-queued-requests", "16"]
        with (
            open(scratch / "server.log", "w") as log,
            serving(flags, log=log, ready_timeout=600, env={"PYTHONPATH": str(ROOT)}) as server,
        ):
            base = server.base_url
            data, warm_up = wav(samples), wav(samples[:48000])
            if not args.health_only:
                figures["server_seconds"] = server_seconds(base, folder.name, data, warm_up, args.rounds, words)
            _transcribe(base, folder.name, warm_up)
            figures["health_beside_transcriptions"] = {"clients": args.clients} | health_beside(
                base, folder.name, data, args.clients
            )
    if not args.health_only:
        alone = figures["pipeline_seconds"]["text"]
        figures["server_over_pipeline"] = round(figures["server_seconds"]["json"] / alone, 3)
    print(json.dumps(figures, indent=1), flush=True)
    variant = [Path(args.model).name] if args.model else ([] if args.shape == "base" else [f"{args.shape} shape"])
    if args.health_only:
        variant.append("health only")
    return Outcome(summary(figures), figures, ", ".join(variant))
