"""Hostile files in a models folder (--models-dir), on a real server: each is asked for
beside three innocent streams of the embedded model while /health is probed, and each
fails alone, with a one-line reason, while the server goes on serving.

A GGUF file shorter than its header says (a download not finished, a copy cut short, a
tensor placed past the end, a file cut short after the server first read it) would
crash the engine's GGUF reader, and with it the whole server: it is refused with a 503
naming what is wrong, before the engine sees it.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path
from typing import Any

import httpx
import pytest

import loopback
from conftest import RunningServer
from helpers import beside_innocent_streams, health_stays_fast
from ovtrio.model import embedded_model_path
from server_pool import server_fixture

INNOCENT = "innocent"


def models_folder(folder: Path) -> None:
    models = folder / "models"
    models.mkdir()
    (models / f"{INNOCENT}.gguf").symlink_to(embedded_model_path())


hostile_files = server_fixture(
    "hostile_files",
    "--models-dir",
    "{folder}/models",
    "--no-embeddings",
    "--num-kv-blocks",
    "64",
    prepare=models_folder,
)


@pytest.fixture
def server(hostile_files: RunningServer) -> RunningServer:
    """The server, its innocent model loaded (its first load is not what is measured)."""
    assert chat(hostile_files, INNOCENT, timeout=600).status_code == 200  # a first load may convert the file
    return hostile_files


def folder_of(server: RunningServer) -> Path:
    return server.log_path.parent / "models"


def chat(server: RunningServer, model: str, timeout: float = 120) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    return loopback.post(server.base_url + "/v1/chat/completions", json=body, timeout=timeout)


def listed(server: RunningServer) -> dict[str, dict[str, Any]]:
    models = loopback.get(server.base_url + "/v1/models", timeout=60)
    assert models.status_code == 200, models.text
    return {model["id"]: model["status"] for model in models.json()["data"]}


def asked_beside_innocent_streams(server: RunningServer, model: str, innocent: str = INNOCENT) -> httpx.Response:
    """The answer to a chat naming `model`, asked while three streams of the innocent
    model go on and /health is probed (health_stays_fast)."""
    answers: list[httpx.Response] = []
    beside_innocent_streams(
        server,
        lambda: health_stays_fast(server, lambda: answers.append(chat(server, model))),
        max_tokens=32,
        model=innocent,
    )
    assert server.process.poll() is None, "the server died"
    return answers[0]


def copy_of_embedded(path: Path, size: int | None = None) -> Path:
    """The embedded model's file, or its first `size` bytes."""
    with open(embedded_model_path(), "rb") as source, open(path, "wb") as target:
        if size is None:
            shutil.copyfileobj(source, target)
        else:
            target.write(source.read(size))
    return path


def tensor_offset_at(path: Path, name: str) -> int:
    """Where in the file the data offset of tensor `name` is written."""
    with open(path, "rb") as file:
        head = file.read(16 << 20)
    named = struct.pack("<Q", len(name)) + name.encode()
    at = head.index(named) + len(named)
    (n_dims,) = struct.unpack_from("<I", head, at)
    return at + 4 + 8 * n_dims + 4


def cut_in_half(path: Path) -> None:
    copy_of_embedded(path, embedded_model_path().stat().st_size // 2)


def still_downloading(path: Path) -> None:
    """All but its last megabyte: a download not finished."""
    copy_of_embedded(path, embedded_model_path().stat().st_size - (1 << 20))


def tensor_past_the_end(path: Path) -> None:
    copy_of_embedded(path)
    with open(path, "r+b") as file:
        file.seek(tensor_offset_at(path, "token_embd.weight"))
        file.write(struct.pack("<Q", 1 << 40))


@pytest.mark.parametrize("damage", [cut_in_half, still_downloading, tensor_past_the_end])
def test_a_gguf_shorter_than_its_header_says_fails_alone(server, damage):
    assert_short_gguf_fails_alone(server, damage)


def assert_short_gguf_fails_alone(server: RunningServer, damage: Any, innocent: str = INNOCENT) -> None:
    """A file `damage` makes in the server's folder is refused with the reason beside
    streams of `innocent`, which serves on."""
    name = f"short-{damage.__name__}"
    path = folder_of(server) / f"{name}.gguf"
    damage(path)
    try:
        refused = asked_beside_innocent_streams(server, name, innocent)
        assert refused.status_code == 503, refused.text
        message = refused.json()["error"]["message"]
        assert "shorter than its header says" in message, message
        state = listed(server)[name]
        assert state["value"] == "failed" and "shorter than its header says" in state["reason"], state
        assert "\n" not in state["reason"]
        # Clients read the model's file name; the server's log has its path.
        for reason in (message, state["reason"]):
            assert f"{name}.gguf" in reason and str(folder_of(server)) not in reason, reason
        assert str(path) in server.log_path.read_text()
    finally:
        path.unlink()
    assert chat(server, innocent).status_code == 200


def test_a_gguf_cut_short_after_it_was_found_fails_alone(server):
    """Listed whole (read at the folder's scan), then cut short in place before its first
    request: read again before the engine sees it."""
    name = "rewritten"
    path = copy_of_embedded(folder_of(server) / f"{name}.gguf")
    try:
        assert listed(server)[name]["value"] == "unloaded"
        os.truncate(path, path.stat().st_size // 3)
        refused = asked_beside_innocent_streams(server, name)
        assert refused.status_code == 503, refused.text
        assert "shorter than its header says" in refused.json()["error"]["message"], refused.text
    finally:
        path.unlink()
    assert chat(server, INNOCENT).status_code == 200


def deeply_nested(path: Path, depth: int = 100_000) -> Path:
    """A GGUF header whose one metadata value is an array of an array of ... `depth` deep."""
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 4) + b"deep" + struct.pack("<I", 9)
    path.write_bytes(head + struct.pack("<IQ", 9, 1) * depth)
    return path


def test_metadata_nested_without_end_fails_its_file_alone_and_the_listing_goes_on(server):
    name = "nested"
    path = deeply_nested(folder_of(server) / f"{name}.gguf")
    try:
        refused = asked_beside_innocent_streams(server, name)
        assert refused.status_code == 503, refused.text
        assert "nests arrays" in refused.json()["error"]["message"], refused.text
        # The model list and the metrics still answer, for every model.
        state = listed(server)
        assert state[name]["value"] == "failed" and "nests arrays" in state[name]["reason"], state[name]
        assert state[INNOCENT]["value"] == "loaded"
        metrics = loopback.get(server.base_url + "/metrics", timeout=60)
        assert metrics.status_code == 200 and f'model_name="{INNOCENT}"' in metrics.text
    finally:
        path.unlink()


# ---- what the folder holds under a model's names: read off the event loop, trusting nothing ----


def ir_folder_with_config(folder: Path, make_config: Any) -> Path:
    """A folder that looks like an OpenVINO IR, whose config.json `make_config` makes."""
    folder.mkdir()
    (folder / "openvino_model.xml").write_text("<net/>")
    make_config(folder / "config.json")
    return folder


def refused_beside_innocent_streams(server: RunningServer, name: str, *reasons: str) -> None:
    refused = asked_beside_innocent_streams(server, name)
    assert refused.status_code == 503, refused.text
    message = refused.json()["error"]["message"]
    assert all(reason in message for reason in reasons), message
    state = listed(server)
    assert state[name]["value"] == "failed" and state[INNOCENT]["value"] == "loaded", state
    assert chat(server, INNOCENT).status_code == 200


@pytest.mark.parametrize(
    ("make_config", "kind"),
    [(os.mkfifo, "a FIFO"), (lambda path: path.symlink_to("/dev/zero"), "a character device")],
    ids=["fifo", "dev_zero"],
)
def test_a_config_that_is_not_a_regular_file_fails_its_model_alone(server, make_config, kind):
    """A config.json that is a FIFO (which would hold the event loop until something
    writes to it) or a link to /dev/zero (read without end): not read, and said."""
    name = f"config-{kind.split()[-1].lower()}"
    folder = ir_folder_with_config(folder_of(server) / name, make_config)
    try:
        refused_beside_innocent_streams(server, name, "config.json is", kind)
    finally:
        shutil.rmtree(folder)


def test_a_header_claiming_more_entries_than_its_file_holds_fails_alone(server):
    """2^60 metadata entries claimed in a sparse file of zeros (which parse as that many
    empty entries): refused from the count and the file's size, before reading."""
    name = "bomb"
    path = folder_of(server) / f"{name}.gguf"
    with open(path, "wb") as file:
        file.write(b"GGUF" + struct.pack("<IQQ", 3, 0, 1 << 60))
        file.truncate(64 << 20)
    try:
        refused_beside_innocent_streams(server, name, "metadata entries", "bytes left in the file")
    finally:
        path.unlink()
