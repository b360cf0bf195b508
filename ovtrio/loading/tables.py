"""The Python work of a model's load, run beside the engine's compile: the
compiled-grammar bound, the byte-level vocabulary and the plain-text tokenizer. The
engine compiles on the loading thread without the GIL, so this work, on a second thread,
comes off the load's critical path (why: docs/benchmarks.md#loading-a-model).

Both threads then read engine data as numpy arrays (the vocabulary check's token ids
on the loading thread, the tokenizer IR's constants beside it), which the binding
cannot take from two threads at its first use (ovtrio/engine/binding.py): `start` builds its lazy
tables before the second thread exists.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ovtrio.constraints import cache as grammar_cache
from ovtrio.engine.binding import prepare_binding
from ovtrio.text.plain_text import PlainText, plain_text_of_ir, plain_text_without_ir
from ovtrio.text.vocabulary import Vocabulary, checked_vocabulary, read_vocabulary


@dataclass(frozen=True)
class Tables:
    vocabulary: Vocabulary | None
    plain_text: PlainText


class LoadTables:
    """What a load reads from the model's files beside the engine: begun by `start`,
    told each IR folder the engine is about to load (`on_folder`), ended by `finish`
    once the engine's tokenizer exists. Use as a context manager (its thread ends with
    the block)."""

    def __init__(self, model_path: Path, kind: str, grammar_cache_bytes: int) -> None:
        prepare_binding()  # on this thread, before the second one starts
        self._beside = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ovtrio-load-beside")
        # Before any pipeline can compile a grammar (its first structured request).
        self._bounded = self._beside.submit(grammar_cache.install, grammar_cache_bytes)
        self._table = self._beside.submit(read_vocabulary, model_path, kind)
        self._plain_of_ir: dict[Path, Future[PlainText | None]] = {}

    def __enter__(self) -> LoadTables:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._beside.shutdown(wait=True)

    def on_folder(self, folder: Path) -> None:
        """The engine is about to load the IR in `folder`: its tokenizer IR is read meanwhile."""
        self._plain_of_ir[folder] = self._beside.submit(plain_text_of_ir, folder)

    def finish(self, tokenizer: Any, tokenizer_folder: Path | None) -> Tables:
        """The vocabulary checked against `tokenizer`, and the plain-text tokenizer made
        from the tokenizer IR in `tokenizer_folder` (read now if no `on_folder` named it).
        Waits for the second thread's work; what it raised, this raises."""
        vocabulary = checked_vocabulary(self._table.result(), tokenizer)
        made = self._plain_of_ir.get(tokenizer_folder) if tokenizer_folder is not None else None
        plain = made.result() if made is not None else plain_text_of_ir(tokenizer_folder)
        plain_text = plain or plain_text_without_ir(tokenizer, _special_texts(vocabulary))
        self._bounded.result()
        return Tables(vocabulary, plain_text)


def _special_texts(vocabulary: Vocabulary | None) -> list[str]:
    if vocabulary is None or not vocabulary.pieces:
        return []
    return [vocabulary.pieces[i] for i in vocabulary.special_ids if i < len(vocabulary.pieces)]
