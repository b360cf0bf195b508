"""The encoders themselves: an embedding model in OpenVINO GenAI's TextEmbeddingPipeline
and a cross-encoder in its TextRerankPipeline, with the tokenizer that counts and checks
their inputs. Everything here blocks: it runs in the model's worker thread (worker.py).

Measured on openvino-genai 2026.4 and the reasons for what is done here:

- the pipeline pools with the first token unless told otherwise; the pooling comes
  from the model's own config (kinds.pooling_of);
- inputs are not truncated unless `Config.max_length` is set, and an over-long input
  then gives a wrong vector with no error: the limit is set, and inputs over it are
  refused (or cut, when the request asks for it) before they reach the pipeline;
- an empty list of texts still returns one vector, and a fixed `batch_size` needs
  exactly that many texts: the batch size is left unset and lists are never empty;
- one pipeline cannot run in two threads at once, but it releases the GIL while it
  computes: one thread per model, and the event loop runs meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ovtrio.embedding.kinds import max_input_tokens, normalizes, pooling_of
from ovtrio.embedding.pairs import safe_groups
from ovtrio.engine.errors import client_reason
from ovtrio.errors import FieldError
from ovtrio.model.source import ModelLoadError

log = logging.getLogger("ovtrio")

# What one input of an embeddings request is: a text, or the model's token ids for one.
EmbeddingInput = str | list[int]


class InputError(FieldError):
    """One input of a request cannot be used; the message says which and why."""


@dataclass(frozen=True)
class EncoderOptions:
    device: str
    properties: dict[str, Any]
    max_batch: int
    max_documents: int  # most documents in one rerank request
    max_request_tokens: int = 65536  # most tokens one request may have computed


def _check_budget(tokens: int, limit: int, param: str) -> None:
    """An InputError when one request's `tokens` are more than the server computes for one."""
    if tokens > limit:
        raise InputError(
            f"Invalid value for '{param}': it has {tokens} tokens in all, more than this server computes for one"
            f" request ({limit}); send it in smaller requests.",
            param,
        )


class _Tokens:
    """Counting, checking and cutting inputs with the model's own tokenizer."""

    def __init__(self, folder: Path, limit: int) -> None:
        import openvino_genai

        self.tokenizer = openvino_genai.Tokenizer(str(folder))
        self.limit = limit
        self.vocab_size = self._vocab_size(folder)
        # Tokens the tokenizer adds around every text ([CLS] and [SEP] for BERT).
        self.special = self.count("")

    @staticmethod
    def _vocab_size(folder: Path) -> int | None:
        import json

        try:
            size = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("vocab_size")
        except (OSError, ValueError):
            return None
        return size if isinstance(size, int) else None

    def ids(self, text: str, special: bool = True) -> list[int]:
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=special).input_ids.data[0]]

    def count(self, text: str) -> int:
        return int(self.tokenizer.encode(text).input_ids.data.shape[1])

    def counts(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        mask = self.tokenizer.encode(list(texts)).attention_mask.data
        return [int(row.sum()) for row in mask]

    def text_of(self, ids: list[int], param: str) -> str:
        """The text whose tokens are exactly `ids` (without the special tokens); an
        InputError when there is none, since the pipeline takes text only."""
        if self.vocab_size is not None and any(not 0 <= i < self.vocab_size for i in ids):
            raise InputError(f"Invalid value for '{param}': token ids must be in [0, {self.vocab_size}).", param)
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        if self.ids(text, special=False) != ids:
            raise InputError(
                f"Invalid value for '{param}': these token ids are not what the model's tokenizer makes of their text"
                " (the model takes text; send the text, or ids from its own tokenizer without special tokens).",
                param,
            )
        return text

    def cut(self, text: str, tokens: int) -> str:
        """The start of `text` that makes at most `tokens` tokens, special ones included."""
        keep = max(0, tokens - self.special)
        content = self.ids(text, special=False)
        while True:
            cut = self.tokenizer.decode(content[:keep], skip_special_tokens=True)
            if self.count(cut) <= tokens or keep == 0:
                return cut
            keep -= 1


def _engine_error(what: str, folder: Path, options: EncoderOptions, exc: Exception) -> ModelLoadError:
    return ModelLoadError(f"cannot load {what} {folder} on {options.device}: {client_reason(exc)}")


class Embedder:
    """A TextEmbeddingPipeline with the checks its inputs need."""

    kind = "embedding"

    def __init__(self, folder: Path, options: EncoderOptions) -> None:
        import openvino_genai

        started = time.perf_counter()
        self.limit = max_input_tokens(folder)
        self.pooling = pooling_of(folder)
        self.max_batch = options.max_batch
        self.max_request_tokens = options.max_request_tokens
        config = openvino_genai.TextEmbeddingPipeline.Config()
        config.pooling_type = getattr(openvino_genai.TextEmbeddingPipeline.PoolingType, self.pooling)
        config.normalize = normalizes(folder)
        config.max_length = self.limit
        try:
            self.tokens = _Tokens(folder, self.limit)
            self.pipeline = openvino_genai.TextEmbeddingPipeline(
                str(folder), options.device, config, **options.properties
            )
            vectors = np.asarray(self.pipeline.embed_documents(["warm up"]), dtype=np.float32)
        except RuntimeError as exc:
            raise _engine_error("embedding model", folder, options, exc) from None
        self.dimensions = int(vectors.shape[1])
        self.load_seconds = time.perf_counter() - started

    def texts_of(self, inputs: Sequence[EmbeddingInput], names: Sequence[str]) -> list[str]:
        """The text of each input: token ids become the text they are the tokens of."""
        return [item if isinstance(item, str) else self.tokens.text_of(item, name) for item, name in zip(inputs, names)]

    def counts(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text, special ones included, in one call of the tokenizer (one
        call a text costs about as much as a call for 32 texts)."""
        return self.tokens.counts(texts)

    def fit(
        self, texts: Sequence[str], counts: Sequence[int], truncate: int | None, names: Sequence[str]
    ) -> tuple[list[str], int]:
        """The texts to embed and their tokens in all: cut to `truncate` tokens when it
        is set (-1: the model's limit). Raises InputError naming the first input over the
        limit."""
        if truncate == -1:
            truncate = self.limit
        fitted = []
        total = 0
        for text, count, param in zip(texts, counts, names):
            if truncate is not None and count > truncate:
                text = self.tokens.cut(text, truncate)
                count = self.tokens.count(text)
            if count > self.limit:
                raise InputError(
                    f"Invalid value for '{param}': it has {count} tokens, more than this model's limit of"
                    f" {self.limit}; shorten it, or set truncate_prompt_tokens to cut it.",
                    param,
                )
            fitted.append(text)
            total += count
        return fitted, total

    def check_limits(self, counts: Sequence[int], truncate: int | None, names: Sequence[str]) -> None:
        """Before any input is cut (which takes time too): an InputError naming the first
        input over the model's limit even once cut to `truncate` (-1: the limit), or naming
        `input` when the inputs together, each counted at most what it is cut to, have
        more tokens than the server computes for one request."""
        cut_to = self.limit if truncate == -1 else truncate
        for count, param in zip(counts, names):
            if min(count, cut_to or count) > self.limit:
                raise InputError(
                    f"Invalid value for '{param}': it has {min(count, cut_to or count)} tokens, more than this model's"
                    f" limit of {self.limit}; shorten it, or set truncate_prompt_tokens to cut it.",
                    param,
                )
        most = self.limit if cut_to is None else min(cut_to, self.limit)
        _check_budget(sum(min(count, most) for count in counts), self.max_request_tokens, "input")

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One unit vector per text (float32 [texts, dimensions]), `max_batch` at a time."""
        parts = [
            np.asarray(self.pipeline.embed_documents(list(texts[start : start + self.max_batch])), dtype=np.float32)
            for start in range(0, len(texts), self.max_batch)
        ]
        return np.concatenate(parts) if parts else np.zeros((0, self.dimensions), dtype=np.float32)


class Reranker:
    """A TextRerankPipeline: scores documents against a query with a cross-encoder.

    Each pair is cut to the model's limit by the pipeline (Config.max_length), as
    rerank APIs do with long documents. The documents of a request go to the pipeline
    in groups that keep clear of a memory corruption in its tokenizer (pairs.py)."""

    kind = "rerank"

    def __init__(self, folder: Path, options: EncoderOptions) -> None:
        import openvino_genai

        started = time.perf_counter()
        self.limit = max_input_tokens(folder)
        self.max_batch = options.max_batch
        self.max_request_tokens = options.max_request_tokens
        config = openvino_genai.TextRerankPipeline.Config()
        config.top_n = options.max_documents
        config.max_length = self.limit
        try:
            self.tokens = _Tokens(folder, self.limit)
            self.pipeline = openvino_genai.TextRerankPipeline(str(folder), options.device, config, **options.properties)
            self.pipeline.rerank("warm up", ["warm up"])
        except RuntimeError as exc:
            raise _engine_error("rerank model", folder, options, exc) from None
        self.load_seconds = time.perf_counter() - started

    def plan(self, query: str, documents: Sequence[str]) -> RerankPlan:
        """The request's documents in the calls that score them, its tokens counted and
        checked against the request's limit (an InputError naming `documents` beyond it)."""
        query_tokens, *document_tokens = self.tokens.counts([query, *documents])
        # A pair is [CLS] query [SEP] document [SEP]: one special token fewer than the two
        # texts alone have.
        pair_special = self.tokens.special + self.tokens.special // 2
        tokens = sum(min(self.limit, query_tokens + count - self.tokens.special // 2) for count in document_tokens)
        _check_budget(tokens, self.max_request_tokens, "documents")
        content = [count - self.tokens.special for count in document_tokens]
        calls: list[list[list[int]]] = []  # per part (a batch of documents), its calls
        for start in range(0, len(documents), self.max_batch):
            part = content[start : start + self.max_batch]
            groups = safe_groups(query_tokens - self.tokens.special, part, self.limit - pair_special)
            calls.append([[start + index for index in group] for group in groups])
        return RerankPlan(self, query, list(documents), calls, tokens)

    def score(self, query: str, documents: Sequence[str]) -> list[float]:
        """The score of each of `documents`, in their order, in one call of the pipeline
        (pairs.py says which calls are safe)."""
        scores = [0.0] * len(documents)
        for index, score in self.pipeline.rerank(query, list(documents)):
            scores[int(index)] = float(score)
        return scores

    def rerank(self, query: str, documents: Sequence[str]) -> tuple[list[tuple[int, float]], int]:
        """(index, score) of every document, best first, and the tokens of the pairs."""
        plan = self.plan(query, documents)
        while plan.left:
            plan.score_next()
        return plan.ranked(), plan.tokens


class RerankPlan:
    """One request's documents, scored a part (a batch of documents) per `score_next()`."""

    def __init__(
        self, reranker: Reranker, query: str, documents: list[str], calls: list[list[list[int]]], tokens: int
    ) -> None:
        self._reranker = reranker
        self._query = query
        self._documents = documents
        self._calls = calls
        self._next = 0
        self._scores: dict[int, float] = {}
        self.tokens = tokens

    @property
    def left(self) -> int:
        return len(self._documents) - len(self._scores)

    def score_next(self) -> None:
        for group in self._calls[self._next]:
            scores = self._reranker.score(self._query, [self._documents[index] for index in group])
            self._scores.update(zip(group, scores))
        self._next += 1

    def ranked(self) -> list[tuple[int, float]]:
        """(index, score) of every document, best first (the lower index first on a tie)."""
        return sorted(self._scores.items(), key=lambda pair: (-pair[1], pair[0]))
