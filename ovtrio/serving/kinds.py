"""The kinds of model the server serves, in one table: per kind, the routes that serve
it, what its model card lists as its input, how its files are checked at start, and how
its resident is built. Which kind a file or folder holds is read by
ovtrio/embedding/kinds.py (`detect_kind`, the IR's outputs); everything that then
depends on the kind (the app's encoders, the registry's folder models and checks, the
cards, the error that names a model of another kind) reads it here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from typing_extensions import TypeIs

from ovtrio.audio.service import TranscriptionService, check_transcription_folder
from ovtrio.embedding.kinds import ModelKind
from ovtrio.embedding.service import EncoderService, check_encoder_folder
from ovtrio.embedding.worker import EncoderObserver
from ovtrio.serving.service import ModelService
from ovtrio.settings.server import Settings
from ovtrio.speech.service import SpeechService, check_speech_folder

__all__ = [
    "KINDS",
    "Encoder",
    "EncoderObserverFactory",
    "Kind",
    "build_encoder",
    "check_encoder",
    "is_generation",
    "is_speaker",
    "is_text_encoder",
    "is_transcriber",
]

Encoder = EncoderService | TranscriptionService | SpeechService
EncoderObserverFactory = Callable[[str, ModelKind], EncoderObserver]


@dataclass(frozen=True)
class Kind:
    name: ModelKind
    routes: tuple[str, ...]  # the endpoints a model of this kind serves
    input_modalities: tuple[str, ...]
    # How a folder of this kind is checked at start (a missing or unusable one stops it
    # with one line), and how its resident is built; None for generation models, which
    # the registry's ModelService checks and runs.
    check: Callable[[str, Path | None], None] | None = None
    build: Callable[[str, Settings, Path | None, EncoderObserverFactory | None], Encoder] | None = None


def _check_whisper(name: str, folder: Path | None) -> None:
    assert folder is not None, "a Whisper model is always a folder"
    check_transcription_folder(folder)


def _whisper(name: str, settings: Settings, folder: Path | None, observer: EncoderObserverFactory | None) -> Encoder:
    assert folder is not None, "a Whisper model is always a folder"
    return TranscriptionService(name, settings, folder, observer=observer)


def _check_speecht5(name: str, folder: Path | None) -> None:
    assert folder is not None, "a text-to-speech model is always a folder"
    check_speech_folder(folder)


def _speecht5(name: str, settings: Settings, folder: Path | None, observer: EncoderObserverFactory | None) -> Encoder:
    assert folder is not None, "a text-to-speech model is always a folder"
    return SpeechService(name, settings, folder, observer=observer)


def _text_encoder(kind: ModelKind) -> Callable[[str, Settings, Path | None, EncoderObserverFactory | None], Encoder]:
    def build(name: str, settings: Settings, folder: Path | None, observer: EncoderObserverFactory | None) -> Encoder:
        return EncoderService(name, kind, settings, folder, observer=observer)

    return build


KINDS: dict[ModelKind, Kind] = {
    "generation": Kind(
        "generation",
        ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/api/chat", "/api/generate"),
        ("text",),
    ),
    "embedding": Kind(
        "embedding",
        ("/v1/embeddings", "/api/embed", "/api/embeddings"),
        ("text",),
        check_encoder_folder,
        _text_encoder("embedding"),
    ),
    "rerank": Kind("rerank", ("/v1/rerank",), ("text",), check_encoder_folder, _text_encoder("rerank")),
    "transcription": Kind(
        "transcription", ("/v1/audio/transcriptions", "/v1/audio/translations"), ("audio",), _check_whisper, _whisper
    ),
    "speech": Kind("speech", ("/v1/audio/speech",), ("text",), _check_speecht5, _speecht5),
}


def build_encoder(
    name: str, kind: ModelKind, settings: Settings, folder: Path | None, observer: EncoderObserverFactory | None
) -> Encoder:
    """The resident of an encoder of `kind` (any kind but generation)."""
    build = KINDS[kind].build
    assert build is not None, f"a {kind} model is not an encoder"
    return build(name, settings, folder, observer)


def check_encoder(encoder: Encoder) -> None:
    """Check `encoder`'s files as its kind does (raises ModelLoadError, one line)."""
    check = KINDS[encoder.kind].check
    if check is not None:
        check(encoder.name, encoder.folder)


def is_generation(model: object) -> TypeIs[ModelService]:
    """Whether `model` is a generation (or vision) model, served by a ModelService."""
    return isinstance(model, ModelService)


def is_transcriber(model: object) -> TypeIs[TranscriptionService]:
    return isinstance(model, TranscriptionService)


def is_speaker(model: object) -> TypeIs[SpeechService]:
    """Whether `model` is a text-to-speech model."""
    return isinstance(model, SpeechService)


def is_text_encoder(model: object) -> TypeIs[EncoderService]:
    """Whether `model` is an embedding or rerank model."""
    return isinstance(model, EncoderService)
