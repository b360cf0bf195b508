"""How often a request naming a model the server does not serve has the models folder
read again (in process, no engine: nothing is loaded). At once when the folder's entries
changed, so a model copied in is served from its first request; otherwise at most once
a second, so a client naming unknown models in a loop does not have the folder listed
on the event loop at each of its requests."""

from __future__ import annotations

from pathlib import Path

from ovtrio.model import embedded_model_path
from ovtrio.serving import registry as registry_module
from ovtrio.serving.registry import ModelRegistry
from ovtrio.settings.server import Settings


def test_unknown_names_read_the_folder_again_only_when_it_changed(tmp_path: Path, monkeypatch) -> None:
    listings: list[Path] = []
    list_folder = registry_module.folder_models

    def counted(folder: Path):  # type: ignore[no-untyped-def]
        listings.append(folder)
        return list_folder(folder)

    monkeypatch.setattr(registry_module, "folder_models", counted)
    clock = [1000.0]
    monkeypatch.setattr(registry_module.time, "monotonic", lambda: clock[0])
    registry = ModelRegistry([], drain_timeout=1, models_dir=Settings(models_dir=str(tmp_path)))
    registry.rescan()  # the listing at start
    assert len(listings) == 1

    for _ in range(100):
        assert registry.find("nobody") is None
        assert registry.find_encoder("nobody", "embedding") is None
    assert len(listings) == 1  # nothing changed, and no time passed

    # A model copied in is found by the first request that names it.
    (tmp_path / "added.gguf").symlink_to(embedded_model_path())
    found = registry.find("added")
    assert found is not None and found.model_name == "added"
    assert len(listings) == 2

    # A second on, an unknown name reads the folder again (a folder still being copied).
    assert registry.find("nobody") is None
    assert len(listings) == 2
    clock[0] += registry_module.UNKNOWN_NAME_RESCAN
    assert registry.find("nobody") is None
    assert len(listings) == 3


def test_a_file_whose_reading_fails_unforeseen_fails_alone(tmp_path: Path, monkeypatch) -> None:
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
    registry.rescan()
    good, bad = registry.find("good"), registry.find("bad")
    assert good is not None and good.failure is None and good.source is not None
    assert bad is not None and bad.failed.is_set()
    assert bad.failure is not None and "RecursionError" in bad.failure and "\n" not in bad.failure
