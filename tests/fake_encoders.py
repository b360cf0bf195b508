"""Fake encoders for the in-process server (in_process.py): an embedder, a reranker, a
Whisper model and a text-to-speech model whose answers a test computes from what it
sent, built by an encoder loader (ovtrio/embedding/on_demand.py's EncoderLoader) in
place of the engine's.

The text encoders are the server's own classes (Embedder, Reranker) over a fake
pipeline, so the worker's batches check, cut and count inputs as with a real model. A
text's tokens are its UTF-8 bytes, with two special ones around them; its vector is
`fake_vector(text)`; a document's rerank score is `fake_score(query, document)`; a
transcript says how many samples it heard (`fake_transcript(samples)`); a text-to-speech
model says `fake_speech(piece)` of each piece. Every batch of a model waits while the
test holds its steps (FakeSteps.hold(model)), so its request stays computing, and its
lease held, while the test looks at the server.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from in_process import HOLD_CAP
from ovtrio.audio.engine import WINDOW_SAMPLES, Options, Segment, Transcriber, Transcript
from ovtrio.embedding.engine import Embedder, InputError, Reranker
from ovtrio.embedding.on_demand import load_encoder
from ovtrio.model import ModelLoadError
from ovtrio.serving.kinds import check_encoder
from ovtrio.speech.engine import Spoken

DIMENSIONS = 8
LIMIT = 512  # tokens of one input, special ones included
SPECIAL = 2  # tokens around every text ([CLS] and [SEP])
SPEECH_RATE = 16000
SAMPLES_PER_BYTE = 40


def fake_ids(text: str) -> list[int]:
    """The fake tokenizer's ids of `text`, without special tokens: its UTF-8 bytes."""
    return list(text.encode())


def fake_vector(text: str) -> list[float]:
    """The unit vector the fake embedder gives `text`: its bytes counted by their value
    modulo DIMENSIONS (an empty text: the first axis)."""
    vector = np.zeros(DIMENSIONS, dtype=np.float32)
    for byte in fake_ids(text):
        vector[byte % DIMENSIONS] += 1.0
    if not vector.any():
        vector[0] = 1.0
    return [float(value) for value in vector / np.linalg.norm(vector)]


def fake_score(query: str, document: str) -> float:
    """The fake reranker's score: the share of the query's words the document holds."""
    words = query.lower().split()
    held = set(document.lower().split())
    return sum(word in held for word in words) / len(words) if words else 0.0


def fake_transcript(samples: int) -> str:
    """What the fake Whisper model writes of a window of `samples` samples."""
    return f" heard {samples} samples"


def fake_speech(text: str) -> np.ndarray:
    """What the fake text-to-speech model says of `text`: SAMPLES_PER_BYTE samples a
    byte of it, each the byte's value over 512 (float32, in [0, 0.5))."""
    return np.repeat(np.array(fake_ids(text), dtype=np.float32) / 512, SAMPLES_PER_BYTE)


class FakeTokens:
    """The embedder's tokens (ovtrio/embedding/engine.py's _Tokens) as bytes."""

    special = SPECIAL
    limit = LIMIT

    def ids(self, text: str, special: bool = True) -> list[int]:
        return ([101] if special else []) + fake_ids(text) + ([102] if special else [])

    def count(self, text: str) -> int:
        return len(fake_ids(text)) + SPECIAL

    def counts(self, texts: Sequence[str]) -> list[int]:
        return [self.count(text) for text in texts]

    def text_of(self, ids: list[int], param: str) -> str:
        if any(not 0 <= i < 256 for i in ids):
            raise InputError(f"Invalid value for '{param}': token ids must be in [0, 256).", param)
        try:
            return bytes(ids).decode()
        except UnicodeDecodeError:
            raise InputError(f"Invalid value for '{param}': these token ids are no text.", param) from None

    def cut(self, text: str, tokens: int) -> str:
        return text.encode()[: max(0, tokens - SPECIAL)].decode(errors="ignore")


class _Held:
    """What waits while the test holds the model's steps (FakeSteps)."""

    def __init__(self, model: str, steps: Any) -> None:
        self.model = model
        self.steps = steps

    def wait(self) -> None:
        if self.steps is not None:
            self.steps.wait(self.model)


class FakeEmbeddingPipeline(_Held):
    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.wait()
        return [fake_vector(text) for text in texts]


class FakeRerankPipeline(_Held):
    def rerank(self, query: str, documents: list[str]) -> list[tuple[int, float]]:
        self.wait()
        scores = [(index, fake_score(query, document)) for index, document in enumerate(documents)]
        return sorted(scores, key=lambda pair: -pair[1])


class FakeEmbedder(Embedder):
    def __init__(self, encoder: Any, steps: Any) -> None:  # Embedder's own would build the engine's pipeline
        started = time.perf_counter()
        settings = encoder.settings
        self.limit = LIMIT
        self.pooling = "CLS"
        self.max_batch = settings.encoder_max_batch
        self.max_request_tokens = settings.encoder_max_request_tokens
        self.tokens = FakeTokens()  # type: ignore[assignment]
        self.pipeline = FakeEmbeddingPipeline(encoder.name, steps)
        self.dimensions = DIMENSIONS
        self.load_seconds = time.perf_counter() - started


class FakeReranker(Reranker):
    def __init__(self, encoder: Any, steps: Any) -> None:
        started = time.perf_counter()
        settings = encoder.settings
        self.limit = LIMIT
        self.max_batch = settings.encoder_max_batch
        self.max_request_tokens = settings.encoder_max_request_tokens
        self.tokens = FakeTokens()  # type: ignore[assignment]
        self.pipeline = FakeRerankPipeline(encoder.name, steps)
        self.load_seconds = time.perf_counter() - started


class FakeTranscriber(Transcriber):
    """A Whisper model that writes fake_transcript of each 30 s window it hears."""

    def __init__(self, encoder: Any, steps: Any) -> None:
        started = time.monotonic()
        self.folder = encoder.folder
        self.words_available = False
        self.multilingual = encoder.multilingual
        self.max_prompt_tokens = 223
        self._held = _Held(encoder.name, steps)
        self.load_seconds = time.monotonic() - started

    def prompt_tokens(self, prompt: str | None) -> tuple[str | None, int]:
        return prompt, len(fake_ids(prompt or ""))

    def window(
        self,
        audio: Any,
        start: int,
        options: Options,
        prompt: tuple[str | None, int],
        stream: Callable[[str], bool],
        last_speech: float = 0.0,
    ) -> tuple[int, Transcript]:
        self._held.wait()
        heard = len(audio.window(start, WINDOW_SAMPLES))
        text = fake_transcript(heard)
        stream(text)
        part = Transcript(text=text, language=options.language or "en", windows=1, output_tokens=len(text.split()))
        if options.segments:
            part.segments = [Segment(start / 16000, (start + heard) / 16000, text, fake_ids(text), start // 160)]
        return start + heard, part


class FakeSpeaker:
    """A text-to-speech model that speaks each piece as fake_speech of its text."""

    def __init__(self, encoder: Any, steps: Any) -> None:
        started = time.monotonic()
        self.folder = encoder.folder
        self.sample_rate = SPEECH_RATE
        self._held = _Held(encoder.name, steps)
        self.load_seconds = time.monotonic() - started

    def speak(self, text: str, embedding: Any) -> Spoken:
        self._held.wait()
        samples = fake_speech(text)
        return Spoken(samples, SPEECH_RATE, len(fake_ids(text)) + SPECIAL, len(samples) // SAMPLES_PER_BYTE)


FAKES: dict[str, Callable[[Any, Any], Any]] = {
    "embedding": FakeEmbedder,
    "rerank": FakeReranker,
    "transcription": FakeTranscriber,
    "speech": FakeSpeaker,
}


def fake_encoder_loader(loads: Any, steps: Any) -> Callable[[Any], Any]:
    """An encoder loader whose loads `loads` (FakeLoads) holds, fails and counts, as the
    fake loader's of generation models; each builds the kind's fake (its batches held
    by `steps`, FakeSteps), after checking the encoder's folder as a real load does. A
    kind with no fake is built by the engine."""

    def load(encoder: Any) -> Any:
        gate, failure = loads.begin(encoder.name)
        if gate is not None:
            gate.wait(HOLD_CAP)
        if failure is not None:
            raise ModelLoadError(failure)
        fake = FAKES.get(encoder.kind)
        if fake is None:
            return load_encoder(encoder)
        check_encoder(encoder)
        return fake(encoder, steps)

    return load
