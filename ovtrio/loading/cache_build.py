"""A GGUF file's model cache entry (ovtrio/gguf/cache.py), built in a process of its own.

The engine's first load of a GGUF file builds the tokenizer and detokenizer models from
the vocabulary in its header, and `openvino_genai.Tokenizer(path)`, the only call that
can save them, holds the GIL throughout, for seconds (docs/benchmarks.md#loading-a-model):
in the server's process, /health and every stream of the models already served would
stall that long. So the entry (the model, tokenizer and
detokenizer IR) is built by a child process, the way `ovtrio convert` builds it, on
the CPU with a KV cache of one block, and the server then loads the entry as any cached
model, with the pipeline's constructor, which lets go of the GIL. The child's memory is
returned whole when it ends, and a child that overstays the load's deadline is ended.

The engine compiles the model twice on a first load (in the child, then in the server):
about as long again as the compile, once per model file and engine version.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ovtrio.gguf.cache import ModelCache, engine_versions, entry_key, model_identity
from ovtrio.gguf.child_log import relay_records, send_records_to_parent

_CHILD = "from ovtrio.loading.cache_build import main; main()"


class EntryBuildError(RuntimeError):
    """The child could not build the entry; the message says why, in one line."""


def build_entry_in_child(model_path: Path, cache_root: Path, replacing: bool, timeout: float | None) -> Path:
    """Build the entry of the GGUF file at `model_path` in the cache at `cache_root` (with
    `replacing`, in place of one there); its folder. Raises OSError when the cache cannot
    keep it, EntryBuildError when the engine fails or the child overstays `timeout`
    seconds. What a failed child leaves in the cache is removed (ovtrio/gguf/cache.py)."""
    cache = ModelCache(cache_root)
    key = entry_key(model_identity(model_path), engine_versions())
    command = [sys.executable, "-c", _CHILD, str(model_path), str(cache_root), "replace" if replacing else "keep"]
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as child:
        try:
            _, stderr = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            cache.remove_builds_of(child.pid)
            raise EntryBuildError(f"the engine's conversion took longer than {timeout:g} s") from None
    lines = relay_records(stderr)
    if child.returncode != 0:
        cache.remove_builds_of(child.pid)
        reason = lines[-1] if lines else f"exit status {child.returncode}"
        if reason.startswith("OSError: "):
            raise OSError(reason.removeprefix("OSError: "))
        raise EntryBuildError(reason.removeprefix(f"{EntryBuildError.__name__}: "))
    return cache.entry(key)


def main() -> None:
    """The child of build_entry_in_child (arguments: the GGUF file, the cache's root,
    "replace" or "keep")."""
    from ovtrio.engine.errors import client_reason
    from ovtrio.loading.load import build_saving
    from ovtrio.settings.server import Settings

    send_records_to_parent()
    model_path, cache_root, replacing = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "replace"
    settings = Settings.model_validate({"device": "CPU", "backend": "continuous_batching", "num_kv_blocks": 1})
    cache = ModelCache(cache_root)
    identity = model_identity(model_path)
    try:
        with cache.building(entry_key(identity, engine_versions()), model_path, identity, replacing) as path:
            build_saving(path, settings)
    except OSError as exc:
        sys.exit(f"OSError: {exc}")
    except Exception as exc:  # noqa: BLE001 (the engine raises RuntimeError with a multi-line C++ trace)
        sys.exit(f"{EntryBuildError.__name__}: {client_reason(exc)}")
