"""A text-to-speech model the server serves, loaded on its first request and unloaded
when idle (as the Whisper model is, ovtrio/audio/service.py), with the encoders' worker
(ovtrio/embedding/worker.py): a bounded queue (one request over it gets a 429), one
thread on the model, the metrics (a request's inputs are its pieces), and the close that
fails what waits when the server stops. At most `speech_max_requests` requests are
taken at once, each until its last sentence is spoken (or its client left).

A request is spoken a piece (a sentence, ovtrio/speech/pieces.py) at a time: after each
piece its samples go to the response at once and the request goes back to the end of
the queue, so the first audio leaves before the rest of the text is spoken, a request
that comes meanwhile waits for one sentence, not for a whole long text, and one whose
client left stops before its next piece.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import trio

from ovtrio.embedding.kinds import ModelKind
from ovtrio.embedding.on_demand import OnDemandEncoder, encoder_hints
from ovtrio.embedding.worker import EncoderObserver, EncoderWorker, Job
from ovtrio.model.source import ModelLoadError
from ovtrio.settings.server import Settings
from ovtrio.speech.engine import Speaker, Spoken, embedding_size
from ovtrio.speech.voices import Voices, read_voices

log = logging.getLogger("ovtrio")

# What a SpeechT5 folder exported by optimum (with --model-kwargs '{"vocoder": ...}')
# holds, and what Text2SpeechPipeline reads.
REQUIRED_FILES = (
    "openvino_encoder_model.xml",
    "openvino_decoder_model.xml",
    "openvino_postnet.xml",
    "openvino_vocoder.xml",
    "openvino_tokenizer.xml",
    "config.json",
)
EXPORT_HINT = (
    "export one with `optimum-cli export openvino --model microsoft/speecht5_tts --model-kwargs"
    ' \'{"vocoder": "microsoft/speecht5_hifigan"}\' FOLDER`'
)
ENCODES = 2  # pieces encoded at once (each in a worker thread), over all requests


@dataclass(frozen=True)
class SpeechWork:
    pieces: Sequence[str]
    embedding: np.ndarray | None  # None: the model's default voice
    # Called in the worker thread with each piece as it is spoken.
    on_piece: Callable[[Spoken], None]


@dataclass
class SpeechTotals:
    """What a request's pieces took and made."""

    pieces: int = 0  # spoken so far
    input_tokens: int = 0
    output_steps: int = 0
    samples: int = 0


def _speak_part(model: Speaker, jobs: Sequence[Job]) -> None:
    """One piece of each job (the worker gives one job a turn)."""
    for job in jobs:
        work: SpeechWork = job.payload
        if job.progress is None:
            job.progress = SpeechTotals()
        totals: SpeechTotals = job.progress
        done = len(work.pieces) - (job.left if job.left >= 0 else len(work.pieces))
        if not job.abandoned:
            spoken = model.speak(work.pieces[done], work.embedding)
            totals.input_tokens += spoken.input_tokens
            totals.output_steps += spoken.output_steps
            totals.samples += len(spoken.samples)
            totals.pieces += 1
            job.tokens += spoken.input_tokens
            work.on_piece(spoken)
            done += 1
        remaining = len(work.pieces) - done
        if remaining > 0 and not job.abandoned:
            job.more = True
            job.left = remaining
        else:
            job.left = 0
            job.result = totals


class SpeechService(OnDemandEncoder[Speaker]):
    kind: ModelKind = "speech"

    def __init__(
        self,
        name: str,
        settings: Settings,
        folder: Path,
        observer: Callable[[str, ModelKind], EncoderObserver] | None = None,
    ) -> None:
        # Told of each request's first audio too (the metrics).
        self.observer = observer(name, self.kind) if observer else EncoderObserver()
        worker: EncoderWorker[Speaker] = EncoderWorker(
            _speak_part,
            max_batch=1,
            max_queued=settings.speech_max_requests,
            observer=self.observer,
            batch_jobs=False,
        )
        super().__init__(name, settings, folder, worker)
        self.folder: Path = folder
        # Read from the folder's files, so that requests are checked before the model loads.
        self.voices = self.read_voices()
        self.encodes = trio.CapacityLimiter(ENCODES)
        # The requests taken and not yet spoken to their end: each holds a place of
        # speech_max_requests (a request between two sentences holds no place of the
        # worker's queue, which would let any number of them be spoken at once).
        self._taken: list[Job] = []

    def read_voices(self) -> Voices:
        voices_dir = Path(self.settings.speech_voices).expanduser() if self.settings.speech_voices else None
        return read_voices(self.folder, voices_dir, embedding_size(self.folder))

    def enqueue(self, work: SpeechWork) -> Job:
        """Queue `work`, loading the model first if it is not yet. Raises Overloaded when
        speech_max_requests requests are taken and not yet spoken, EncoderUnavailable
        when the model cannot serve."""
        self.want()
        # A request whose client left is gone too: it stops at its current sentence, and
        # the worker drops it from its queue without ending it.
        self._taken = [job for job in self._taken if not job.done.is_set() and not job.abandoned]
        if len(self._taken) >= self.settings.speech_max_requests:
            raise self.worker.refusal(len(self._taken))
        job = self.worker.enqueue(Job(work, len(work.pieces)))
        self._taken.append(job)
        return job

    async def result(self, job: Job) -> SpeechTotals:
        """`job`'s totals, once every piece is spoken; cancelled (the client left), it
        stops before its next piece."""
        try:
            await self.worker.wait(job)
        finally:
            self.last_used = trio.current_time()
        return job.result

    def _load(self) -> Speaker:
        check_speech_folder(self.folder)  # a folder of --models-dir may have changed since
        settings = self.settings
        return Speaker(self.folder, settings.encoder_device or settings.device, encoder_hints(settings))

    def _serving_now(self, model: Speaker) -> None:
        self.voices = self.read_voices()

    def _limits(self, model: Speaker) -> str:
        return f", {model.sample_rate} Hz, voices {', '.join(self.voices.names)}"


def check_speech_folder(folder: Path) -> None:
    """A missing or unusable folder stops startup with one line, as a generation model's does."""
    if not folder.is_dir():
        raise ModelLoadError(f"cannot load text-to-speech model {folder}: no such folder")
    for name in REQUIRED_FILES:
        if not (folder / name).is_file():
            raise ModelLoadError(f"cannot load text-to-speech model {folder}: folder has no {name} ({EXPORT_HINT})")


def speech_models_to_serve(
    settings: Settings, configured: Sequence[tuple[Settings, ModelKind]]
) -> list[tuple[str, Settings, Path]]:
    """(name, settings, folder) of every text-to-speech model: those of the config file
    and the flags' --speech-model."""
    found: list[tuple[str, Settings, Path]] = []
    for model_settings, kind in configured:
        if kind == "speech" and model_settings.model is not None:
            folder = Path(model_settings.model).expanduser()
            found.append((model_settings.served_model_name or folder.name, model_settings, folder))
    if settings.speech_model:
        folder = Path(settings.speech_model).expanduser()
        found.append((folder.name, settings, folder))
    return found
