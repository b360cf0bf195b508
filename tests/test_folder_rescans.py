"""How often a request naming a model the server does not serve has the models folder
read again (in process, no engine: nothing is loaded). At once when the folder's entries
changed, so a model copied in is served from its first request; otherwise at most once
a second, so a client naming unknown models in a loop does not have the folder listed
on the event loop at each of its requests."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio

from ovtrio.model import embedded_model_path
from ovtrio.serving import folder_reading
from ovtrio.serving.registry import ModelRegistry
from ovtrio.settings.server import Settings


@pytest.mark.trio
async def test_unknown_names_read_the_folder_again_only_when_it_changed(tmp_path: Path, monkeypatch) -> None:
    listings: list[Path] = []
    list_folder = folder_reading.folder_models

    def counted(folder: Path):  # type: ignore[no-untyped-def]
        listings.append(folder)
        return list_folder(folder)

    monkeypatch.setattr(folder_reading, "folder_models", counted)
    clock = [1000.0]
    monkeypatch.setattr(folder_reading.time, "monotonic", lambda: clock[0])
    registry = ModelRegistry([], drain_timeout=1, models_dir=Settings(models_dir=str(tmp_path)))
    registry.check()  # the listing at start
    assert len(listings) == 1

    for _ in range(100):
        assert await registry.find("nobody") is None
        assert await registry.find_encoder("nobody", "embedding") is None
        await registry.rescan()  # a model listing, /metrics
    assert len(listings) == 1  # nothing changed, and no time passed

    # A model copied in is found by the first request that names it.
    (tmp_path / "added.gguf").symlink_to(embedded_model_path())
    found = await registry.find("added")
    assert found is not None and found.model_name == "added"
    assert len(listings) == 2

    # A second on, an unknown name reads the folder again (a folder still being copied).
    assert await registry.find("nobody") is None
    assert len(listings) == 2
    clock[0] += folder_reading.RESCAN_INTERVAL
    assert await registry.find("nobody") is None
    assert len(listings) == 3


@pytest.mark.trio
async def test_a_file_whose_reading_fails_unforeseen_fails_alone(tmp_path: Path, monkeypatch) -> None:
    """Whatever reading one file raises, it is listed failed with the reason, and the
    folder's other models are served: the listing itself never fails."""
    from ovtrio.model import source as source_module

    for name in ("good", "bad"):
        (tmp_path / f"{name}.gguf").symlink_to(embedded_model_path())
    read = source_module.read_gguf_header

    def failing_for_bad(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if Path(path).name == "bad.gguf":
            raise RecursionError("maximum recursion depth exceeded")
        return read(path, *args, **kwargs)

    monkeypatch.setattr(source_module, "read_gguf_header", failing_for_bad)
    registry = ModelRegistry([], drain_timeout=1, models_dir=Settings(models_dir=str(tmp_path)))
    registry.check()
    good, bad = await registry.find("good"), await registry.find("bad")
    assert good is not None and good.failure is None and good.source is not None
    assert bad is not None and bad.failed.is_set()
    assert bad.failure is not None and "RecursionError" in bad.failure and "\n" not in bad.failure


@pytest.mark.trio
async def test_readings_run_off_the_event_loop_one_at_a_time(tmp_path: Path, monkeypatch) -> None:
    """Requests that come while the folder is read wait for that reading: one reading
    for them all, in a worker thread, while the event loop goes on."""
    listings: list[str] = []
    list_folder = folder_reading.folder_models
    release = threading.Event()

    def slow(folder: Path):  # type: ignore[no-untyped-def]
        listings.append(threading.current_thread().name)
        release.wait(10)
        return list_folder(folder)

    registry = ModelRegistry([], drain_timeout=1, models_dir=Settings(models_dir=str(tmp_path)))
    monkeypatch.setattr(folder_reading, "folder_models", slow)
    loop_thread = threading.current_thread().name
    (tmp_path / "added.gguf").symlink_to(embedded_model_path())
    ticks = 0
    found: list[object] = []
    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(lambda: _append(found, registry.find("added")))
        while len(listings) < 1:
            await trio.sleep(0.01)
        for _ in range(10):  # the loop runs while the folder is read
            await trio.sleep(0.01)
            ticks += 1
        release.set()
    assert ticks == 10 and len(listings) == 1 and listings[0] != loop_thread
    assert len(found) == 5 and all(service is not None for service in found)


async def _append(found: list[object], lookup) -> None:  # type: ignore[no-untyped-def]
    found.append(await lookup)


def test_a_refused_gguf_file_is_not_read_again_until_it_changes(tmp_path: Path, monkeypatch) -> None:
    from ovtrio.model import ModelLoadError
    from ovtrio.model import source as source_module

    path = tmp_path / "broken.gguf"
    path.write_bytes(b"GGUF" + bytes(20))
    reads: list[Path] = []
    read = source_module.read_gguf_header

    def counted(file, *args, **kwargs):  # type: ignore[no-untyped-def]
        reads.append(Path(file))
        return read(file, *args, **kwargs)

    monkeypatch.setattr(source_module, "read_gguf_header", counted)
    for _ in range(5):
        with pytest.raises(ModelLoadError, match="too old"):
            source_module.check_gguf(path)
    assert len(reads) == 1
    path.write_bytes(b"GGUF" + bytes(24))  # rewritten: read again
    with pytest.raises(ModelLoadError):
        source_module.check_gguf(path)
    assert len(reads) == 2
