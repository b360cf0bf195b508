"""A model's files are read only when they are regular files, and JSON files only up to a
bound (ovtrio/files/regular_files.py): a FIFO is not waited on, a link to /dev/zero not
read without end. In process; each read runs in a thread the test gives up on after a
cap, so a read that blocks fails the test instead of hanging it."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from ovtrio.files.json_files import check_json_file, read_json_object
from ovtrio.files.regular_files import MAX_JSON_BYTES, UnsafeFile, open_regular
from ovtrio.gguf.header import read_gguf_header


def within_cap(read: Any, *args: Any) -> Any:
    """read(*args) in a daemon thread; fails if it has not returned within a generous cap."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(read(*args))
        except BaseException as exc:  # noqa: BLE001 (handed to the test)
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    assert outcome, f"{read.__name__} blocked"
    return outcome[0]


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    os.mkfifo(path)
    return path


@pytest.fixture
def zeros(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.symlink_to("/dev/zero")
    return path


def test_a_fifo_is_not_waited_on(fifo: Path) -> None:
    assert within_cap(read_json_object, fifo) == {}
    assert "a FIFO" in (check_json_file(fifo) or "")
    assert isinstance(within_cap(open_regular, fifo), UnsafeFile)
    assert isinstance(within_cap(read_gguf_header, fifo), UnsafeFile)


def test_a_link_to_a_device_is_not_read(zeros: Path) -> None:
    assert within_cap(read_json_object, zeros) == {}
    assert "a character device" in (check_json_file(zeros) or "")
    assert isinstance(within_cap(read_gguf_header, zeros), UnsafeFile)


def test_a_json_file_past_the_bound_is_not_read(tmp_path: Path) -> None:
    large = tmp_path / "config.json"
    with open(large, "wb") as file:  # sparse: no disk used
        file.write(b'{"a": 1}')
        file.truncate(MAX_JSON_BYTES + 1)
    assert read_json_object(large) == {}
    assert "larger than" in (check_json_file(large) or "")


def test_regular_files_and_links_to_them_read_as_before(tmp_path: Path) -> None:
    config = tmp_path / "real.json"
    config.write_text('{"model_type": "llama"}')
    link = tmp_path / "config.json"
    link.symlink_to(config)
    assert read_json_object(link) == {"model_type": "llama"}
    assert check_json_file(link) is None and check_json_file(tmp_path / "missing.json") is None
