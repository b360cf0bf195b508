"""Reading models_dir: its models (discovery.py), and the files of each model the server
does not know yet, checked (a GGUF header parsed, an IR folder's files looked at). It
reads files that anyone may have put there, so it runs in a worker thread
(ModelRegistry.rescan), or before the server serves; what one file raises fails that
model alone, with the reason, never the reading."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from ovtrio.engine.errors import client_reason
from ovtrio.lifecycle.load_retry import FilesVersion
from ovtrio.model import ModelLoadError, ModelSource
from ovtrio.serving.discovery import FolderModel, folder_models, settings_for
from ovtrio.serving.kinds import KINDS
from ovtrio.serving.service import check_model
from ovtrio.settings.server import Settings

log = logging.getLogger("ovtrio")


def entries_changed_at(folder: Path) -> int | None:
    """When an entry of `folder` was last added, removed or renamed (its mtime)."""
    try:
        return folder.stat().st_mtime_ns
    except OSError:
        return None


# Seconds between two readings of models_dir that requests start, while the folder's
# entries stay as they were (ModelRegistry.rescan).
RESCAN_INTERVAL = 1.0


class ReadingsDue:
    """Whether a request's reading of models_dir is due: at once when its entries
    changed since the last reading, else once RESCAN_INTERVAL seconds have passed (a
    folder whose files are still arriving)."""

    def __init__(self) -> None:
        # When the entries last changed, as the last reading found them, and when that
        # reading began (time.monotonic).
        self._last: tuple[int | None, float] = (None, float("-inf"))

    def due(self, folder: Path) -> bool:
        changed_at, when = self._last
        return entries_changed_at(folder) != changed_at or time.monotonic() - when >= RESCAN_INTERVAL

    def begin(self, folder: Path) -> None:
        """A reading begins now."""
        self._last = (entries_changed_at(folder), time.monotonic())


@dataclass(frozen=True)
class Reading:
    """What a reading of models_dir found, in a worker thread: its models by name, and
    for each one the server does not know yet what checking its files found (a
    generation model's source and files' version, or why it cannot serve; an encoder's
    failure, or None)."""

    models: dict[str, FolderModel]
    generation: dict[str, tuple[ModelSource, FilesVersion] | str]
    encoders: dict[str, str | None]


def read_folder(folder: Path, defaults: Settings, known: frozenset[str]) -> Reading:
    """Read models_dir and check the files of each model not in `known`. Blocking (it
    reads the files): run in a worker thread, or before the server serves."""
    models = {model.name: model for model in folder_models(folder)}
    generation: dict[str, tuple[ModelSource, FilesVersion] | str] = {}
    encoders: dict[str, str | None] = {}
    for name, model in models.items():
        if name in known:
            continue
        if model.kind == "generation":
            generation[name] = _checked(name, settings_for(model, defaults))
        else:
            encoders[name] = _encoder_failure(model)
    return Reading(models, generation, encoders)


def _checked(name: str, settings: Settings) -> tuple[ModelSource, FilesVersion] | str:
    """The model's source and files' version, or why it cannot serve (one line)."""
    try:
        return check_model(settings)
    except ModelLoadError as exc:
        log.warning("%s", exc)
        return str(exc)
    except Exception as exc:  # one file's unforeseen failure fails it alone, never the listing
        log.exception("cannot read the model '%s' of the models folder", name)
        return f"cannot read model {name}: {type(exc).__name__}: {client_reason(exc)}"


def _encoder_failure(model: FolderModel) -> str | None:
    """Why the encoder folder `model` cannot serve, or None."""
    try:
        check = KINDS[model.kind].check
        assert check is not None, "a folder's encoder is of a kind the table checks"
        check(model.name, model.path)
    except ModelLoadError as exc:
        return str(exc)
    except Exception as exc:  # as _checked
        log.exception("cannot read the model '%s' of the models folder", model.name)
        return f"cannot read model {model.name}: {type(exc).__name__}: {client_reason(exc)}"
    return None
