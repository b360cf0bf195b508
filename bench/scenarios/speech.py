"""Text to speech: what a sentence costs on a SpeechT5 model, alone and through HTTP.

    python -m bench speech [--model FOLDER | --shape speecht5] [--rounds 9] [--clients 4]

Without --model it builds a random-weight model with SpeechT5's and HiFi-GAN's sizes
(tests/tiny_speecht5.py, `--shape speecht5`: a 768-wide encoder of 12 layers and decoder
of 6, a 5-layer postnet, a 512-channel vocoder upsampling 256 times; its length set by
its text alone, one decoder step a character, about half the steps a real voice takes
for the same text) or the test fixture (`--shape tiny`, which measures the server's own
cost around the pipeline: HTTP, the sentence split, the queue, encoding); give --model
an exported SpeechT5 folder (`optimum-cli export openvino --model
microsoft/speecht5_tts --model-kwargs '{"vocoder": "microsoft/speecht5_hifigan"}'
FOLDER`) to measure that model.

Measured in one run, in turns (one pipeline call, then one server request, `--rounds`
times; the medians are kept):
- the pipeline alone (Text2SpeechPipeline in this process while the server idles):
  seconds for one sentence, and the audio's seconds per second of compute;
- the server (`ovtrio serve --speech-model`): seconds to the whole pcm answer for the
  same sentence, the ratio to the pipeline's, and for a three-sentence text in mp3 the
  seconds to its first byte beside the seconds to its last;
- /health latency (p50/p99/max, probed every 20 ms) while `--clients` syntheses of a
  long text run at once.

Another model or the tiny shape are variants of their own, so such a run does not hide
the full one.
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

# The test fixture (tiny_speecht5) is imported by module name.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from bench.driver.results import ROOT, Figure, Outcome
from bench.driver.server import serving
from bench.driver.stats import median, percentile

SENTENCE = "The quick brown fox jumps over the lazy dog."
THREE = "Good morning. The weather today is mild and dry. Expect a light breeze in the afternoon."
LONG = " ".join(f"This is sentence number {index} of a long text." for index in range(40))


def _model_folder(args: argparse.Namespace, scratch: Path) -> Path:
    if args.model:
        return Path(args.model)
    import tiny_speecht5

    shape = tiny_speecht5.SPEECHT5 if args.shape == "speecht5" else tiny_speecht5.TINY
    return tiny_speecht5.build(scratch / "speecht5", shape=shape)


def _speak(client: httpx.Client, model: str, text: str, response_format: str = "pcm") -> httpx.Response:
    body = {"model": model, "input": text, "voice": "alloy", "response_format": response_format}
    response = client.post("/v1/audio/speech", json=body)
    response.raise_for_status()
    return response


def _first_and_last_byte(client: httpx.Client, model: str, text: str) -> tuple[float, float]:
    body = {"model": model, "input": text, "voice": "alloy", "response_format": "mp3"}
    started = time.perf_counter()
    first = None
    with client.stream("POST", "/v1/audio/speech", json=body) as response:
        response.raise_for_status()
        for chunk in response.iter_raw():
            if chunk and first is None:
                first = time.perf_counter() - started
    assert first is not None, "no audio"
    return first, time.perf_counter() - started


def interleaved(folder: Path, base: str, rounds: int) -> dict[str, Any]:
    import numpy as np
    import openvino_genai

    pipeline = openvino_genai.Text2SpeechPipeline(str(folder), "CPU")
    alone, served, firsts, lasts = [], [], [], []
    samples = 0
    rate = 16000
    with httpx.Client(base_url=base, timeout=600) as client:
        _speak(client, folder.name, SENTENCE)  # the model loads
        pipeline.generate(SENTENCE)
        for _ in range(rounds):
            started = time.perf_counter()
            result = pipeline.generate(SENTENCE)
            alone.append(time.perf_counter() - started)
            samples = int(np.asarray(result.speeches[0].data).size)
            rate = int(result.output_sample_rate)
            started = time.perf_counter()
            _speak(client, folder.name, SENTENCE)
            served.append(time.perf_counter() - started)
            first, last = _first_and_last_byte(client, folder.name, THREE)
            firsts.append(first)
            lasts.append(last)
    pipeline_s = median(alone)
    return {
        "audio_seconds": round(samples / rate, 3),
        "pipeline_seconds": round(pipeline_s, 4),
        "pipeline_realtime": round(samples / rate / pipeline_s, 1),
        "server_seconds": round(median(served), 4),
        "server_over_pipeline": round(median(served) / pipeline_s, 3),
        "three_first_byte_seconds": round(median(firsts), 4),
        "three_last_byte_seconds": round(median(lasts), 4),
    }


def health_beside(base: str, model: str, clients: int) -> dict[str, float]:
    """/health latency while `clients` syntheses of a long text run at once."""

    def one() -> None:
        with httpx.Client(base_url=base, timeout=600) as client:
            _speak(client, model, LONG, "mp3")

    threads = [threading.Thread(target=one) for _ in range(clients)]
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
        "clients": clients,
        "p50_ms": round(median(latencies), 1),
        "p99_ms": round(percentile(latencies, 99), 1),
        "max_ms": round(max(latencies), 1),
        "probes": len(latencies),
    }


def summary(figures: dict[str, Any]) -> dict[str, Figure]:
    found: dict[str, Figure] = {
        "sentence's audio s": figures["audio_seconds"],
        "pipeline, a sentence ms": round(1000 * figures["pipeline_seconds"], 1),
        "pipeline, audio s per compute s": figures["pipeline_realtime"],
        "server, a sentence as pcm ms": round(1000 * figures["server_seconds"], 1),
        "server / pipeline": figures["server_over_pipeline"],
        "three sentences, first byte ms": round(1000 * figures["three_first_byte_seconds"], 1),
        "three sentences, last byte ms": round(1000 * figures["three_last_byte_seconds"], 1),
    }
    health = figures["health_beside_syntheses"]
    for figure in ("p50", "p99", "max"):
        found[f"/health {figure} ms beside {health['clients']} syntheses"] = health[f"{figure}_ms"]
    found["/health probes"] = health["probes"]
    return found


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="an exported SpeechT5 folder (default: random weights of --shape)")
    parser.add_argument("--shape", choices=["speecht5", "tiny"], default="speecht5", help="the random model's sizes")
    parser.add_argument("--rounds", type=int, default=9, help="turns of each timing; their medians are kept")
    parser.add_argument("--clients", type=int, default=4, help="syntheses at once while /health is probed")


def run(args: argparse.Namespace) -> Outcome:
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        folder = _model_folder(args, scratch)
        figures: dict[str, Any] = {"model": args.model or f"random weights, {args.shape} shape"}
        flags = ["--no-embeddings", "--speech-model", str(folder), "--speech-max-requests", "16"]
        with (
            open(scratch / "server.log", "w") as log,
            serving(flags, log=log, ready_timeout=600, env={"PYTHONPATH": str(ROOT)}) as server,
        ):
            figures |= interleaved(folder, server.base_url, args.rounds)
            figures["health_beside_syntheses"] = health_beside(server.base_url, folder.name, args.clients)
    print(json.dumps(figures, indent=1), flush=True)
    variant = Path(args.model).name if args.model else ("" if args.shape == "speecht5" else f"{args.shape} shape")
    return Outcome(summary(figures), figures, variant)
