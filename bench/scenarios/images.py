"""Images through the server: time to first token beside the raw engine's, /health while they decode.

The server's preprocessing time, its time to first token with 0, 1 and 4 images beside
the raw engine's, and /health while large images decode.

    python -m bench images [--turns 7] [--side 1024] [--bursts 9]

Builds the tiny VLM test fixture (tests/tiny_vlm.py: random weights, 16 tokens an
image) and starts `ovtrio serve` on it. Then, in turns:

- time to first token of a streamed chat completion with 0, 1 and 4 PNG images of
  side x side noise (as base64 data URLs), beside the raw engine's time to first token
  for the same text and images (a ContinuousBatchingPipeline in this process, images
  already decoded): the server's extra is reading the data URLs, decoding, HTTP and
  scheduling;
- the server's own image preprocessing time (ovtrio_image_preprocess_seconds);
- /health every 5 ms from another process while 8 requests arrive at once, without images
  and with 4 images each, `--bursts` times each in turns: the medians of the bursts' p50
  and p99 (the goal: p99 at most 20 ms, since decoding runs off the loop).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

# The test fixtures (tiny_vlm, encoder_fixtures) are imported by module name.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import tiny_vlm
from bench.driver.hardware import cpu_name
from bench.driver.results import Outcome
from bench.driver.server import metric_value, serving
from bench.driver.stats import percentile

MODEL = "vlm"


def png(seed: int, side: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def messages(urls: list[str]) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": [{"type": "text", "text": "Describe the images."}, *parts]}]


def chat_body(urls: list[str]) -> bytes:
    """A streamed chat request with the images, encoded before the clock starts (its
    JSON encoding is the client's time, not the server's)."""
    body = {"model": MODEL, "messages": messages(urls), "max_tokens": 4, "temperature": 0, "stream": True}
    return json.dumps(body).encode()


def server_ttft(client: httpx.Client, base: str, body: bytes) -> float:
    headers = {"Content-Type": "application/json"}
    started = time.perf_counter()
    with client.stream("POST", base + "/v1/chat/completions", content=body, headers=headers) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                return time.perf_counter() - started
    raise RuntimeError("no token")


def engine_ttft(pipeline, text: str, images: list) -> float:
    import openvino_genai

    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = 4
    config.apply_chat_template = False
    started = time.perf_counter()
    handle = pipeline.add_request(0, text, images, config)
    while True:
        pipeline.step()
        if handle.can_read():
            elapsed = time.perf_counter() - started
            break
    while pipeline.has_non_finished_requests():
        pipeline.step()
    return elapsed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--turns", type=int, default=7)
    parser.add_argument("--side", type=int, default=1024, help="side of the square test images in pixels")
    parser.add_argument("--bursts", type=int, default=9, help="bursts of each kind; their p99s' median is the figure")


def run(args: argparse.Namespace) -> Outcome:
    import openvino as ov
    import openvino_genai
    from PIL import Image

    folder = Path(tempfile.mkdtemp(prefix="bench-vlm-"))
    tiny_vlm.build(folder)
    flags = ["--model", str(folder), "--served-model-name", MODEL, "--log-level", "warning"]
    with serving(flags, ready_timeout=120) as server:
        base = server.base_url
        client = httpx.Client(timeout=120)
        images = [png(seed, args.side) for seed in range(4)]
        urls = ["data:image/png;base64," + base64.b64encode(data).decode() for data in images]
        decoded = [np.asarray(Image.open(io.BytesIO(data)).convert("RGB")) for data in images]
        pipeline = openvino_genai.ContinuousBatchingPipeline(str(folder), openvino_genai.SchedulerConfig(), "CPU")
        tokenizer = pipeline.get_tokenizer()

        def engine_text(count: int) -> str:
            content = "Describe the images." + "".join(tiny_vlm_tag(i) for i in range(count))
            return tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)

        server_times: dict[int, list[float]] = {0: [], 1: [], 4: []}
        bodies = {count: chat_body(urls[:count]) for count in server_times}
        engine_times: dict[int, list[float]] = {0: [], 1: [], 4: []}
        for count in server_times:  # warm-up
            server_ttft(client, base, bodies[count])
            engine_ttft(pipeline, engine_text(count), [ov.Tensor(image) for image in decoded[:count]])
        for _ in range(args.turns):
            for count in server_times:
                server_times[count].append(server_ttft(client, base, bodies[count]))
                engine_times[count].append(
                    engine_ttft(pipeline, engine_text(count), [ov.Tensor(image) for image in decoded[:count]])
                )
        exposition = client.get(base + "/metrics").text
        preprocess_sum = metric_value(exposition, "ovtrio_image_preprocess_seconds_sum")
        preprocess_count = metric_value(exposition, "ovtrio_image_preprocess_seconds_count")

        # /health while 8 requests arrive at once: without images, then with 4 each, in
        # turns; one burst's p99 rests on its few slowest probes, so each kind runs
        # --bursts times.
        health_by_images: dict[int, list[list[float]]] = {0: [], 4: []}
        for _ in range(args.bursts):
            for count in health_by_images:
                health_by_images[count].append(burst_health(base, urls[:count]))

    cpu = cpu_name()
    print(f"images: tiny VLM fixture, {args.side}x{args.side} PNG noise ({len(images[0]) / 1e6:.1f} MB each),"
          f" {args.turns} turns, medians; {cpu}, {os.cpu_count()} cores")  # fmt: skip
    print(f"image preprocessing in the server: {1000 * preprocess_sum / max(preprocess_count, 1):.1f} ms per image"
          f" ({int(preprocess_count)} images)")  # fmt: skip
    print(f"{'images':>6} {'server TTFT ms':>15} {'engine TTFT ms':>15} {'server/engine':>14}")
    for count in server_times:
        served, raw = statistics.median(server_times[count]), statistics.median(engine_times[count])
        print(f"{count:>6} {1000 * served:>15.1f} {1000 * raw:>15.1f} {served / raw:>14.2f}")
    p99s = {}
    for count, bursts in health_by_images.items():
        each = [1000 * percentile(health, 99) for health in bursts]
        p99s[count] = statistics.median(each)
        p50 = statistics.median(1000 * statistics.median(health) for health in bursts)
        print(f"/health while 8 requests x {count} images arrive at once: p50 {p50:.1f} ms,"
              f" p99 {p99s[count]:.1f} ms (median of {len(bursts)} bursts: {', '.join(f'{p:.1f}' for p in each)};"
              f" {sum(map(len, bursts))} probes)")  # fmt: skip
    summary = {"preprocessing ms per image": 1000 * preprocess_sum / max(preprocess_count, 1)}
    for count in server_times:
        summary[f"server TTFT ms, {count} images"] = 1000 * statistics.median(server_times[count])
        summary[f"engine TTFT ms, {count} images"] = 1000 * statistics.median(engine_times[count])
    for count, p99 in p99s.items():
        summary[f"/health p99 ms, 8 requests x {count} images"] = p99
    samples = {"server_ttft_s": server_times, "engine_ttft_s": engine_times, "health_s": health_by_images}
    return Outcome(summary, samples)


def burst_health(base: str, urls: list[str]) -> list[float]:
    """/health every 5 ms while 8 requests with `urls` arrive at once.

    The probe runs in a process of its own, and the requests' bodies are encoded before
    the burst: encoding 17 MB of JSON in the probing process would hold its GIL, and the
    figure would measure the client instead of the server. That process is started
    afresh (spawned, not forked) and the burst waits until it probes: a forked child
    shares this process's hundreds of megabytes copy-on-write, and its first garbage
    collection faulted them in, a 15-25 ms probe before almost every burst."""
    encoded = chat_body(urls)
    processes = multiprocessing.get_context("spawn")
    stop, probing = processes.Event(), processes.Event()
    results = processes.Queue()
    prober = processes.Process(target=probe_health, args=(base, stop, probing, results))
    prober.start()
    probing.wait(60)
    time.sleep(0.5)
    burst = [threading.Thread(target=server_ttft, args=(httpx.Client(timeout=120), base, encoded)) for _ in range(8)]
    for thread in burst:
        thread.start()
    for thread in burst:
        thread.join()
    time.sleep(0.2)
    stop.set()
    health = results.get(timeout=30)
    prober.join()
    return health


def probe_health(base: str, stop: Any, probing: Any, results: Any) -> None:
    health: list[float] = []
    with httpx.Client(timeout=10) as prober:
        prober.get(base + "/health")
        probing.set()
        while not stop.is_set():
            started = time.perf_counter()
            prober.get(base + "/health")
            health.append(time.perf_counter() - started)
            time.sleep(0.005)
    results.put(health)


def tiny_vlm_tag(index: int) -> str:
    return f"<ov_genai_image_{index}>"
