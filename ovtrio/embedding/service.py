"""An encoder the server serves (an embedding model or a reranker), loaded on its first
request unless `encoder_preload` says at start.

The embedded embedder takes time to load (more the first time, to convert it) and
memory once loaded (figures: docs/benchmarks.md#the-embedding-model): loaded lazily, a
server nobody asks for vectors pays neither, and its start is not slowed. Requests that come
while it loads wait in its queue like any other.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import trio

from ovtrio.embedding.embedded import EMBEDDED_EMBEDDER_NAME, embedded_embedder_folder
from ovtrio.embedding.engine import Embedder, EmbeddingInput, EncoderOptions, Reranker
from ovtrio.embedding.kinds import ModelKind
from ovtrio.embedding.worker import EncoderObserver, EncoderUnavailable, EncoderWorker, Job, WorkerStats
from ovtrio.model.cache import default_cache_dir
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


class EncoderService:
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
        self.name = name
        self.kind = kind
        self.settings = settings
        self.folder = folder
        self.started_at = time.time()
        self.model: Embedder | Reranker | None = None
        self.failure: str | None = None
        self.loaded = trio.Event()
        self._wanted = trio.Event()
        # When a request last came (trio's clock), and the scope its serving runs in:
        # cancelled, the model is unloaded (unload), and loads again on the next request.
        self.last_used = 0.0
        self.load_seconds: float | None = None
        self._serving = trio.CancelScope()
        self._observer = observer(name, kind) if observer else None
        self.worker: EncoderWorker[Any] = EncoderWorker(
            _embed_batch if kind == "embedding" else _rerank_batch,
            max_batch=settings.encoder_max_batch,
            max_queued=settings.encoder_max_queued_requests,
            observer=self._observer,
            batch_jobs=kind == "embedding",
        )

    @property
    def dimensions(self) -> int | None:
        return getattr(self.model, "dimensions", None)

    def stats(self) -> WorkerStats:
        return self.worker.stats()

    async def submit(self, work: EmbeddingWork | RerankWork, size: int) -> Job:
        """Compute `work` (`size` inputs); loads the model first if it is not yet."""
        self._wanted.set()
        self.last_used = trio.current_time()
        try:
            return await self.worker.submit(Job(work, size))
        finally:
            self.last_used = trio.current_time()

    @property
    def state(self) -> str:
        """unloaded, loading, loaded or failed, as a generation model's (ModelService.state)."""
        if self.failure is not None:
            return "failed"
        if self.loaded.is_set():
            return "loaded"
        return "loading" if self._wanted.is_set() else "unloaded"

    @property
    def idle(self) -> bool:
        stats = self.worker.stats()
        return self.loaded.is_set() and not stats.queued and not stats.running

    def unload(self) -> bool:
        """Unload the model if it computes nothing now (its worker then waits for the
        next load); whether it did."""
        if not self.idle:
            return False
        self._serving.cancel()
        return True

    def _load(self) -> Embedder | Reranker:
        settings = self.settings
        folder = self.folder
        if folder is None:
            cache = Path(settings.cache_dir).expanduser() if settings.cache_dir else default_cache_dir()
            folder = embedded_embedder_folder(cache if settings.model_cache else None)
        hints = dict(settings.plugin_config)
        if settings.encoder_inference_precision != "auto":
            hints["INFERENCE_PRECISION_HINT"] = settings.encoder_inference_precision
        if settings.num_threads is not None:
            hints["INFERENCE_NUM_THREADS"] = str(settings.num_threads)
        options = EncoderOptions(
            device=settings.encoder_device or settings.device,
            properties=hints,
            max_batch=settings.encoder_max_batch,
            max_documents=settings.max_inputs_per_request,
            max_request_tokens=settings.encoder_max_request_tokens,
        )
        model_class = Embedder if self.kind == "embedding" else Reranker
        return model_class(folder, options)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        if self.settings.encoder_preload:
            self._wanted.set()
        try:
            while True:
                await self._wanted.wait()
                if not await self._serve():
                    return
                # Unloaded (idle): requests that come now wait in the queue for the next load.
                self._wanted = trio.Event()
                if self.worker.stats().queued:
                    self._wanted.set()
        finally:
            self.worker.close(EncoderUnavailable("The server is shutting down; retry shortly.", "shutting_down"))
            self.model = None

    async def _serve(self) -> bool:
        """Load the model and compute requests until unloaded; False if the load failed."""
        log.info("loading %s model '%s'", self.kind, self.name)
        try:
            model = await trio.to_thread.run_sync(self._load)
        except ModelLoadError as exc:
            self.failure = str(exc)
            log.error("%s", exc)
            self.worker.close(EncoderUnavailable(f"The model '{self.name}' failed to load: {exc}", "model_unavailable"))
            return False
        self.model = model
        self.load_seconds = model.load_seconds
        self.loaded.set()
        log.info(
            "serving %s model '%s' (loaded in %.2f s, inputs of at most %d tokens)",
            self.kind,
            self.name,
            model.load_seconds,
            model.limit,
        )
        self._serving = trio.CancelScope()
        with self._serving:
            await self.worker.run(model)
        self.loaded = trio.Event()
        self.model = None
        del model
        log.info("unloaded %s model '%s'", self.kind, self.name)
        return True


def encoders_to_serve(
    settings: Settings, configured: Sequence[tuple[Settings, ModelKind]]
) -> list[tuple[str, ModelKind, Settings, Path | None]]:
    """(name, kind, settings, folder) of every encoder: those of the config file, the
    flags' embedding and rerank models, and the embedded embedder when no embedding
    model is configured and `embeddings` is on."""
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
    if settings.embeddings and not any(kind == "embedding" for _, kind, _, _ in found):
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
