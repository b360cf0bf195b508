"""An encoder the server serves (an embedding model or a reranker), loaded on its first
request unless `encoder_preload` says at start, and unloaded when idle
(ovtrio/embedding/on_demand.py).

The embedded embedder takes time to load (more the first time, to convert it) and
memory once loaded (figures: docs/benchmarks.md#the-embedding-model): loaded lazily, a
server nobody asks for vectors pays neither, and its start is not slowed. Requests that come
while it loads wait in its queue like any other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import trio

from ovtrio.embedding.embedded import EMBEDDED_EMBEDDER_NAME, embedded_embedder_folder
from ovtrio.embedding.engine import Embedder, EmbeddingInput, EncoderOptions, Reranker
from ovtrio.embedding.kinds import ModelKind
from ovtrio.embedding.on_demand import OnDemandEncoder, encoder_hints
from ovtrio.embedding.worker import EncoderObserver, EncoderWorker, Job
from ovtrio.gguf.cache import default_cache_dir
from ovtrio.model.source import ModelLoadError
from ovtrio.settings.server import Settings

log = logging.getLogger("ovtrio")


@dataclass(frozen=True)
class EmbeddingWork:
    inputs: Sequence[EmbeddingInput]
    truncate: int | None
    names: Sequence[str]  # how errors name each input: "input", "input[3]"


@dataclass(frozen=True)
class RerankWork:
    query: str
    documents: Sequence[str]


@dataclass
class _Parts:
    """A job's texts (as sent, with their tokens counted), and the vectors of those
    computed so far."""

    texts: list[str]
    counts: list[int]
    vectors: list[Any]
    done: int = 0


def _embed_batch(embedder: Embedder, jobs: Sequence[Job]) -> None:
    """Up to a batch of texts of the jobs, in one list for the pipeline. A job's texts are
    counted (one call of the tokenizer for every new job) and checked against the model's
    and the request's limits on its first turn; a job with an unusable input gets its error
    and the others go on. A job with more texts than the batch took is computed on later
    turns (worker.py), its texts cut (truncate_prompt_tokens) as their turn comes."""
    new = [job for job in jobs if job.progress is None]
    converted: list[tuple[Job, list[str]]] = []
    for job in new:
        work: EmbeddingWork = job.payload
        try:
            converted.append((job, embedder.texts_of(work.inputs, work.names)))
        except Exception as exc:  # noqa: BLE001 (InputError, or the tokenizer refusing the ids: the job's own)
            job.error = exc
    counts = embedder.counts([text for _, texts in converted for text in texts])
    offset = 0
    for job, job_texts in converted:
        work = job.payload
        job_counts = counts[offset : offset + len(job_texts)]
        offset += len(job_texts)
        try:
            embedder.check_limits(job_counts, work.truncate, work.names)
        except Exception as exc:  # noqa: BLE001 (InputError: the job's own)
            job.error = exc
            continue
        job.progress = _Parts(job_texts, job_counts, [])
    texts: list[str] = []
    spans: list[tuple[Job, int, int]] = []
    for job in jobs:
        parts: _Parts | None = job.progress
        if job.error is not None or parts is None:
            continue
        work = job.payload
        end = parts.done + min(len(parts.texts) - parts.done, embedder.max_batch)  # what the worker counted it for
        try:
            part = slice(parts.done, end)
            fitted, tokens = embedder.fit(parts.texts[part], parts.counts[part], work.truncate, work.names[part])
        except Exception as exc:  # noqa: BLE001 (InputError: the job's own)
            job.error = exc
            continue
        job.tokens += tokens
        spans.append((job, len(texts), len(fitted)))
        texts.extend(fitted)
    if not texts:
        return
    vectors = embedder.embed(texts)
    for job, start, count in spans:
        parts = job.progress
        parts.vectors.append(vectors[start : start + count])
        parts.done += count
        job.left = len(parts.texts) - parts.done
        if job.left:
            job.more = True
        else:
            job.result = np.concatenate(parts.vectors)


def _rerank_batch(reranker: Reranker, jobs: Sequence[Job]) -> None:
    """A batch of a job's documents: measured (and checked against the request's limit)
    on its first turn, scored a batch of documents a turn."""
    for job in jobs:
        work: RerankWork = job.payload
        if job.progress is None:
            job.progress = reranker.plan(work.query, work.documents)
            job.tokens = job.progress.tokens
        plan = job.progress
        plan.score_next()
        job.left = plan.left
        if plan.left:
            job.more = True
        else:
            job.result = plan.ranked()


class EncoderService(OnDemandEncoder[Any]):
    def __init__(
        self,
        name: str,
        kind: ModelKind,
        settings: Settings,
        folder: Path | None,
        observer: Callable[[str, ModelKind], EncoderObserver] | None = None,
    ) -> None:
        """`folder`: the model's IR folder; None for the embedded embedder (converted
        into the model cache on first use)."""
        self.kind = kind
        self._observer = observer(name, kind) if observer else None
        worker: EncoderWorker[Any] = EncoderWorker(
            _embed_batch if kind == "embedding" else _rerank_batch,
            max_batch=settings.encoder_max_batch,
            max_queued=settings.encoder_max_queued_requests,
            observer=self._observer,
            batch_jobs=kind == "embedding",
        )
        super().__init__(name, settings, folder, worker)

    @property
    def dimensions(self) -> int | None:
        return getattr(self.model, "dimensions", None)

    async def submit(self, work: EmbeddingWork | RerankWork, size: int) -> Job:
        """Compute `work` (`size` inputs); loads the model first if it is not yet."""
        self.want()
        try:
            return await self.worker.submit(Job(work, size))
        finally:
            self.last_used = trio.current_time()

    def _load(self) -> Embedder | Reranker:
        settings = self.settings
        folder = self.folder
        if folder is None:
            cache = Path(settings.cache_dir).expanduser() if settings.cache_dir else default_cache_dir()
            folder = embedded_embedder_folder(cache if settings.model_cache else None)
        else:
            check_encoder_folder(self.name, folder)  # a folder of --models-dir may have changed since
        options = EncoderOptions(
            device=settings.encoder_device or settings.device,
            properties=encoder_hints(settings),
            max_batch=settings.encoder_max_batch,
            max_documents=settings.max_inputs_per_request,
            max_request_tokens=settings.encoder_max_request_tokens,
        )
        model_class = Embedder if self.kind == "embedding" else Reranker
        return model_class(folder, options)

    def _limits(self, model: Any) -> str:
        return f", inputs of at most {model.limit} tokens"


def encoders_to_serve(
    settings: Settings, configured: Sequence[tuple[Settings, ModelKind]], embedded: bool = True
) -> list[tuple[str, ModelKind, Settings, Path | None]]:
    """(name, kind, settings, folder) of every encoder: those of the config file, the
    flags' embedding and rerank models, and the embedded embedder when no embedding
    model is configured, `embeddings` is on and `embedded` (False: models_dir has one)."""
    found: list[tuple[str, ModelKind, Settings, Path | None]] = []
    for model_settings, kind in configured:
        assert model_settings.model is not None
        folder = Path(model_settings.model).expanduser()
        found.append((model_settings.served_model_name or folder.name, kind, model_settings, folder))
    if settings.embedding_model:
        folder = Path(settings.embedding_model).expanduser()
        found.append((folder.name, "embedding", settings, folder))
    if settings.rerank_model:
        folder = Path(settings.rerank_model).expanduser()
        found.append((folder.name, "rerank", settings, folder))
    if embedded and settings.embeddings and not any(kind == "embedding" for _, kind, _, _ in found):
        found.append((EMBEDDED_EMBEDDER_NAME, "embedding", settings, None))
    return found


def check_encoder_folder(name: str, folder: Path | None) -> None:
    """A missing or unusable folder stops startup with one line, as a generation model's does."""
    if folder is None:
        return
    if not (folder / "openvino_model.xml").is_file():
        raise ModelLoadError(
            f"cannot load model {folder}: folder has no openvino_model.xml (export one with `optimum-cli export"
            " openvino --task feature-extraction --model ID FOLDER`)"
        )
    for tokenizer in ("openvino_tokenizer.xml",):
        if not (folder / tokenizer).is_file():
            raise ModelLoadError(f"cannot load model {folder}: folder has no {tokenizer}")
