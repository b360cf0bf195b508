"""The encoders' Prometheus metrics, per model (label `model_name`) and kind (`kind`:
embedding, rerank, transcription or speech): requests served, inputs (texts, documents
to rerank, 30 s windows of audio, or sentences spoken), tokens, requests refused with
429, the number of inputs of each batch the model computed (a transcription model's is
always one window, a speech model's one sentence), and how many sentences of a speech
request were spoken when its first audio left."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from ovtrio.embedding.worker import EncoderObserver

_LABELS = ("model_name", "kind")
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


class _ModelObserver(EncoderObserver):
    def __init__(self, metrics: EncoderMetrics, labels: tuple[str, str]) -> None:
        self._requests = metrics.requests.labels(*labels)
        self._inputs = metrics.inputs.labels(*labels)
        self._tokens = metrics.tokens.labels(*labels)
        self._rejected = metrics.rejected.labels(*labels)
        self._batch = metrics.batch_size.labels(*labels)
        self._first_audio = metrics.first_audio_pieces.labels(*labels)

    def finished(self, inputs: int, tokens: int) -> None:
        self._requests.inc()
        self._inputs.inc(inputs)
        self._tokens.inc(tokens)

    def batch(self, inputs: int) -> None:
        self._batch.observe(inputs)

    def rejected(self) -> None:
        self._rejected.inc()

    def first_audio(self, pieces: int) -> None:
        self._first_audio.observe(pieces)


class EncoderMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "ovtrio_encoder_requests",
            "Embedding, rerank, transcription and speech requests served",
            _LABELS,
            registry=registry,
        )
        self.inputs = Counter(
            "ovtrio_encoder_inputs",
            "Texts embedded, documents reranked, 30 s audio windows transcribed, or sentences spoken",
            _LABELS,
            registry=registry,
        )
        self.tokens = Counter("ovtrio_encoder_tokens", "Tokens of the inputs computed", _LABELS, registry=registry)
        self.rejected = Counter(
            "ovtrio_encoder_requests_rejected",
            "Encoder requests (embedding, rerank, transcription, speech) refused with 429 because the model was full",
            _LABELS,
            registry=registry,
        )
        self.batch_size = Histogram(
            "ovtrio_encoder_batch_size",
            "Inputs computed in one batch",
            _LABELS,
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.first_audio_pieces = Histogram(
            "ovtrio_speech_first_audio_pieces",
            "Pieces (sentences) of a speech request's text spoken when its first audio was sent",
            _LABELS,
            buckets=(1, 2, 3, 4, 8),
            registry=registry,
        )
        self._observers: dict[str, _ModelObserver] = {}

    def for_model(self, name: str, kind: str) -> EncoderObserver:
        if name not in self._observers:
            self._observers[name] = _ModelObserver(self, (name, kind))
        return self._observers[name]

    def forget(self, name: str) -> None:
        """Remove the series of the model `name`, which the server no longer serves."""
        self._observers.pop(name, None)
        families = (self.requests, self.inputs, self.tokens, self.rejected, self.batch_size, self.first_audio_pieces)
        for family in families:
            family.remove_by_labels({"model_name": name})
