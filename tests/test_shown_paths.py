"""What clients read of a failed model names its file or folder, not the server's path
to it (ovtrio/model/shown_paths.py); the log keeps the path."""

from __future__ import annotations

from pathlib import Path

from ovtrio.model.shown_paths import without_model_path
from ovtrio.serving.service import ModelService
from ovtrio.settings.server import Settings


def test_every_spelling_of_the_path_is_shown_as_its_name(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "store" / "weights.gguf"
    target.parent.mkdir()
    target.write_bytes(b"")
    link = tmp_path / "models" / "alpha.gguf"
    link.parent.mkdir()
    link.symlink_to(target)
    monkeypatch.chdir(tmp_path)
    for spelling in (str(link), str(target), "models/alpha.gguf"):
        shown = without_model_path(f"cannot load model {spelling}: it is broken", Path("models/alpha.gguf"))
        assert shown == "cannot load model alpha.gguf: it is broken", (spelling, shown)
    assert without_model_path("no path here", None) == "no path here"


def test_a_service_failure_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "models" / "broken.gguf"
    service = ModelService(Settings(model=str(path), served_model_name="broken"))
    service.failure = f"cannot load model {path}: not a GGUF file (bad magic number)"
    assert service.failure == "cannot load model broken.gguf: not a GGUF file (bad magic number)"
    assert str(tmp_path) not in service.failure
    service.failure = None
    assert service.failure is None
