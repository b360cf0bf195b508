"""The models of a models_dir: each GGUF file and OpenVINO IR folder directly in it is a
model served on demand, named after the file (without .gguf) or the folder, as
llama-server's router names the files of its --models-dir.

The folder is read again whenever a request names a model the server does not know,
whenever the model list or /metrics is asked for, and (at most once a second) for a
request whose body is over the limit (ovtrio/server/body_limit.py), so a file copied in
later is served without a restart. Reading it is a directory listing, a GGUF header per
new file and an IR's XML outputs per new folder, of files anyone may have put there: it
runs in a worker thread (ModelRegistry.rescan), and reads only regular files
(ovtrio/files/regular_files.py; `is_file` and `is_dir` follow links and check what they
lead to).

A folder may hold any kind of model: a generation model (GGUF or IR, vision-language
included), an embedding model, a reranker (told apart by their IR's outputs,
ovtrio/embedding/kinds.py) or a Whisper model. Each is served as its kind, under its
folder's name, by the same rules (loaded on demand, unloaded when idle or by hand).

A model's name is its id, which clients send and /metrics puts in labels: it must be
text. An entry whose name is not UTF-8 is not served, and the log says so once.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path

from ovtrio.embedding.kinds import ModelKind, detect_kind
from ovtrio.model.source import is_text, printable_name
from ovtrio.model.vision import is_vision_folder
from ovtrio.settings.server import Settings

log = logging.getLogger("ovtrio")


@dataclass(frozen=True)
class FolderModel:
    name: str
    path: Path
    kind: ModelKind = "generation"


def folder_models(folder: Path) -> list[FolderModel]:
    """The models directly in `folder`, by name; hidden entries, and folders holding no
    model the server knows, skipped."""
    try:
        entries = sorted(folder.iterdir())
    except OSError as exc:
        log.warning("cannot read the models folder %s (%s)", folder, exc.strerror)
        return []
    found = []
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if not is_text(entry.name):
            _warn_not_text(entry)
            continue
        try:
            model = _model_of(entry)
        except Exception:  # an entry that cannot be read leaves the others listed
            log.exception("cannot read '%s' of the models folder", printable_name(entry.name))
            continue
        if model is not None:
            found.append(model)
    return found


def _model_of(entry: Path) -> FolderModel | None:
    """The model `entry` of the folder holds, if any."""
    if entry.is_file() and entry.suffix.lower() == ".gguf":
        return FolderModel(entry.name[: -len(".gguf")], entry)
    if entry.is_dir():
        kind = _kind_of(entry, _stamp(entry))
        if kind != "generation" or is_model_folder(entry):
            return FolderModel(entry.name, entry, kind)
    return None


@functools.lru_cache(maxsize=1024)
def _warn_not_text(entry: Path) -> None:
    """Say once (the folder is read again at every model listing) why `entry` is not served."""
    log.warning(
        "not serving '%s' of the models folder: its name is not UTF-8 text, and a model's name is the id"
        " clients send; rename it",
        printable_name(entry.name),
    )


@functools.lru_cache(maxsize=1024)
def _kind_of(folder: Path, stamp: tuple[int, ...]) -> ModelKind:
    """detect_kind, read once per version of the folder: it parses the IR's XML (megabytes
    for a large model), and the folder is read again at every model listing. A folder of
    encoder and decoder IRs whose config does not say Whisper or SpeechT5 (unreadable, or
    cut short) is taken for one all the same (SpeechT5 when it has a vocoder): served, or
    listed failed with what it lacks, rather than skipped without a word."""
    kind = detect_kind(folder)
    encoder_decoder = ("openvino_encoder_model.xml", "openvino_decoder_model.xml")
    without_single_ir = not (folder / "openvino_model.xml").is_file()
    if kind == "generation" and without_single_ir and all((folder / name).is_file() for name in encoder_decoder):
        return "speech" if (folder / "openvino_vocoder.xml").is_file() else "transcription"
    return kind


def _stamp(folder: Path) -> tuple[int, ...]:
    """What changes when the files that tell a folder's kind do (added, removed, rewritten)."""
    stamp: list[int] = []
    for path in (folder, folder / "openvino_model.xml", folder / "config.json"):
        try:
            status = path.stat()
        except OSError:
            stamp += [-1, -1]
        else:
            stamp += [status.st_mtime_ns, status.st_size]
    return tuple(stamp)


def is_model_folder(entry: Path) -> bool:
    return entry.is_dir() and ((entry / "openvino_model.xml").is_file() or is_vision_folder(entry))


def settings_for(model: FolderModel, defaults: Settings) -> Settings:
    """A folder model's settings: the server's, with its path and name."""
    return defaults.model_copy(update={"model": str(model.path), "served_model_name": model.name, "config": None})
