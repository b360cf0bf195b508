"""A model's load that hangs is impossible to miss: past --load-timeout it fails with the
phase it hung in named (and every thread's stack) in the log, `ovtrio serve` exits
non-zero, and under Hypercorn the model is failed with that reason. A start whose load
hangs can still be stopped by SIGTERM.

The hang is made, not raced: the chat template is a pipe nobody writes, which the load
reads first (conftest.held_loading does the same).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

import loopback
from conftest import free_port, launch_server

# Generous caps on waits for the server's own state, not deadlines: a busy machine passes.
EXIT_WITHIN = 300


def hung_template(folder: Path) -> Path:
    pipe = folder / "template.jinja"
    os.mkfifo(pipe)
    return pipe


def serve_with_hung_load(folder: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    log_path = folder / "server.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "ovtrio", "serve", "--port", str(free_port()), "--chat-template"]
            + [str(hung_template(folder)), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return process, log_path


def wait_for_line(process: subprocess.Popen, log_path: Path, text: str) -> None:
    deadline = time.monotonic() + EXIT_WITHIN
    while text not in log_path.read_text():
        assert process.poll() is None, log_path.read_text()
        assert time.monotonic() < deadline, f"no {text!r} in the log: {log_path.read_text()}"
        time.sleep(0.05)


def test_a_start_whose_load_hangs_exits_non_zero_naming_the_phase(tmp_path):
    process, log_path = serve_with_hung_load(tmp_path, "--load-timeout", "3")
    try:
        code = process.wait(timeout=EXIT_WITHIN)
    finally:
        process.kill()
    log = log_path.read_text()
    assert code == 1, log
    assert "did not load within 3 s (--load-timeout): its load hung in the chat template phase" in log
    assert "the stack of each thread follows" in log and "in _chat_template" in log  # where it hung
    assert "exiting with code 1" in log


def test_sigterm_stops_a_start_whose_load_hangs(tmp_path):
    process, log_path = serve_with_hung_load(tmp_path)
    try:
        wait_for_line(process, log_path, "ovtrio INFO: loading ")  # the load began, and is held
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=EXIT_WITHIN)
    finally:
        process.kill()
    log = log_path.read_text()
    assert code == 0, log
    assert "SIGTERM" in log and "exiting with code 0" in log


def test_under_hypercorn_a_hung_load_fails_its_model_with_the_phase(tmp_path):
    env = {"OVTRIO_CHAT_TEMPLATE": str(hung_template(tmp_path)), "OVTRIO_LOAD_TIMEOUT": "3"}
    server = launch_server(tmp_path, env=env, hypercorn=True)
    try:
        deadline = time.monotonic() + EXIT_WITHIN
        while True:
            assert time.monotonic() < deadline, server.log_path.read_text()
            try:
                ready = loopback.get(server.base_url + "/health/ready", timeout=5)
            except httpx.TransportError:
                assert server.process.poll() is None, server.log_path.read_text()
                time.sleep(0.1)
                continue
            if ready.json().get("status") == "failed":
                break
            time.sleep(0.1)
        assert ready.status_code == 503
        (model,) = ready.json()["models"]
        assert model["status"] == "failed"
        assert "its load hung in the chat template phase" in model["reason"], model
    finally:
        server.process.kill()
        server.process.wait(timeout=60)
