"""Audio benchmark: what a minute of audio costs on a Whisper model, alone and through HTTP.

    python bench/audio.py [--model FOLDER | --shape base] [--minutes 1] [--clients 4] [--rounds 2] [--health-only]

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

`run(args)` returns the figures as a dict; the command prints it as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
from serving import free_port, percentile  # noqa: E402


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
        figures[name] = round(statistics.median(times), 3)
        figures[f"{name}_tokens"] = tokens
    del pipeline
    return figures


def _start_server(folder: Path, scratch: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = open(scratch / "server.log", "w")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "ovtrio", "serve", "--port", str(port), "--no-embeddings", "--encoder-preload"]
        + ["--transcription-model", str(folder), "--audio-max-queued-requests", "16"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/health/ready", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return process, base


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
        figures[name] = round(statistics.median(times), 3)
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
        "p50_ms": round(statistics.median(latencies), 1),
        "p99_ms": round(percentile(latencies, 99), 1),
        "max_ms": round(max(latencies), 1),
        "probes": len(latencies),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
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
            "load_average": os.getloadavg()[0],
            "cpus": os.cpu_count(),
        }
        if not args.health_only:
            figures["decode_seconds"] = decode_seconds(samples)
            figures["pipeline_seconds"] = pipeline_seconds(folder, samples, args.rounds)
        process, base = _start_server(folder, scratch)
        try:
            data, warm_up = wav(samples), wav(samples[:48000])
            if not args.health_only:
                figures["server_seconds"] = server_seconds(base, folder.name, data, warm_up, args.rounds, words)
            _transcribe(base, folder.name, warm_up)
            figures["health_beside_transcriptions"] = {"clients": args.clients} | health_beside(
                base, folder.name, data, args.clients
            )
        finally:
            process.terminate()
            process.wait(timeout=60)
        figures["load_average_after"] = os.getloadavg()[0]
    if args.health_only:
        return figures
    alone = figures["pipeline_seconds"]["text"]
    figures["server_over_pipeline"] = round(figures["server_seconds"]["json"] / alone, 3)
    figures["seconds_per_audio_minute"] = {
        name: round(value * 60 / seconds, 3) for name, value in figures["server_seconds"].items()
    }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="an exported Whisper folder (default: random weights of --shape)")
    parser.add_argument("--shape", choices=["base", "tiny"], default="base", help="the random model's sizes")
    parser.add_argument("--minutes", type=float, default=1.0, help="length of the audio")
    parser.add_argument("--clients", type=int, default=4, help="transcriptions at once while /health is probed")
    parser.add_argument("--rounds", type=int, default=2, help="turns of each timing; medians are printed")
    parser.add_argument("--health-only", action="store_true", help="measure /health beside the transcriptions only")
    print(json.dumps(run(parser.parse_args()), indent=1))


if __name__ == "__main__":
    main()
