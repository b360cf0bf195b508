"""A Whisper model the server serves, loaded on its first request and unloaded when idle
(as the embedder is, ovtrio/embedding/on_demand.py: a server nobody sends audio to pays
neither its load nor its memory), with the encoders' worker (ovtrio/embedding/worker.py): a bounded queue
(one request over it gets a 429), one thread on the model, the metrics, and the close
that fails what waits when the server stops.

A request is computed a 30 s window at a time (ovtrio/audio/engine.py): after each
window it goes back to the end of the queue, so a request that comes meanwhile waits
for one window, not for the whole of an hour-long file, and one whose client left stops
at the end of its current window (or at its next token, windows without timestamps).

Decoding the uploaded files runs in worker threads too, at most `audio_decodes` at once
(`decodes`): a request waits for a slot before its file is decoded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import trio

from ovtrio.audio.decode import Audio
from ovtrio.audio.engine import (
    WINDOW_SAMPLES,
    Options,
    Transcriber,
    Transcript,
    joined,
    model_languages,
    windows_of,
    word_timestamps_available,
)
from ovtrio.embedding.kinds import ModelKind
from ovtrio.embedding.on_demand import OnDemandEncoder, encoder_hints
from ovtrio.embedding.worker import EncoderObserver, EncoderWorker, Job
from ovtrio.files.json_files import read_json_object
from ovtrio.model.source import ModelLoadError
from ovtrio.settings.server import Settings

log = logging.getLogger("ovtrio")

# What a Whisper folder exported by optimum holds, and what WhisperPipeline reads.
REQUIRED_FILES = (
    "openvino_encoder_model.xml",
    "openvino_decoder_model.xml",
    "openvino_tokenizer.xml",
    "openvino_detokenizer.xml",
    "generation_config.json",
    "preprocessor_config.json",
)


@dataclass(frozen=True)
class TranscriptionWork:
    audio: Audio
    options: Options
    # Called in the worker thread with each piece of text as it is written.
    on_text: Callable[[str], None] | None = None


@dataclass
class _Progress:
    prompt: tuple[str | None, int]
    options: Options
    start: int = 0
    parts: list[Transcript] = field(default_factory=list)


def _transcribe_part(model: Transcriber, jobs: Sequence[Job]) -> None:
    """One window of each job (the worker gives one job a turn)."""
    for job in jobs:
        work: TranscriptionWork = job.payload
        if job.progress is None:
            job.progress = _Progress(model.prompt_tokens(work.options.prompt), work.options)
        progress: _Progress = job.progress

        def stream(text: str, job: Job = job, work: TranscriptionWork = work) -> bool:
            if job.abandoned:
                return True
            if text and work.on_text is not None:
                work.on_text(text)
            return False

        # The prompt goes with the first window only, as in the pipeline's own loop.
        prompt = progress.prompt if progress.start == 0 else (None, 0)
        ended = [part.segments[-1].end for part in progress.parts if part.segments]
        next_start, part = model.window(
            work.audio, progress.start, progress.options, prompt, stream, last_speech=ended[-1] if ended else 0.0
        )
        progress.parts.append(part)
        progress.start = next_start
        if progress.options.language is None and part.language:
            # The language detected in the first window holds for the rest.
            progress.options = replace(progress.options, language=part.language)
        job.tokens += part.output_tokens
        remaining = len(work.audio.samples) - next_start
        if remaining > 0 and not job.abandoned:
            job.more = True
            job.left = -(-remaining // WINDOW_SAMPLES)
        else:
            job.left = 0
            whole = joined(progress.parts)
            whole.prompt_tokens = progress.prompt[1]
            whole.language = whole.language or progress.options.language
            job.result = whole


class TranscriptionService(OnDemandEncoder[Transcriber]):
    kind: ModelKind = "transcription"

    def __init__(
        self,
        name: str,
        settings: Settings,
        folder: Path,
        observer: Callable[[str, ModelKind], EncoderObserver] | None = None,
    ) -> None:
        worker: EncoderWorker[Transcriber] = EncoderWorker(
            _transcribe_part,
            max_batch=1,
            max_queued=settings.audio_max_queued_requests,
            observer=observer(name, self.kind) if observer else None,
            batch_jobs=False,
        )
        super().__init__(name, settings, folder, worker)
        self.folder: Path = folder
        # Read from the folder's files, so that requests are checked before the model loads.
        self.multilingual, self.languages = model_languages(folder)
        self.words_available = word_timestamps_available(folder)
        # The encoder's positions for one window: what a window counts as audio tokens.
        positions = read_json_object(folder / "config.json").get("max_source_positions")
        self.audio_tokens = positions if isinstance(positions, int) and positions > 0 else 1500
        self.decodes = trio.CapacityLimiter(settings.audio_decodes)

    def enqueue(self, work: TranscriptionWork) -> Job:
        """Queue `work`, loading the model first if it is not yet. Raises Overloaded when
        the queue is full, EncoderUnavailable when the model cannot serve."""
        self.want()
        return self.worker.enqueue(Job(work, windows_of(work.audio)))

    async def result(self, job: Job) -> Transcript:
        """`job`'s transcript, once computed; cancelled (the client left), it stops at
        the end of its current window."""
        try:
            await self.worker.wait(job)
        finally:
            self.last_used = trio.current_time()
        return job.result

    def _load(self) -> Transcriber:
        check_transcription_folder(self.folder)  # a folder of --models-dir may have changed since
        settings = self.settings
        return Transcriber(self.folder, settings.encoder_device or settings.device, encoder_hints(settings))

    def _serving_now(self, model: Transcriber) -> None:
        self.words_available = model.words_available  # False if the graph did not allow them


def check_transcription_folder(folder: Path) -> None:
    """A missing or unusable folder stops startup with one line, as a generation model's does."""
    if not folder.is_dir():
        raise ModelLoadError(f"cannot load transcription model {folder}: no such folder")
    for name in REQUIRED_FILES:
        if not (folder / name).is_file():
            raise ModelLoadError(
                f"cannot load transcription model {folder}: folder has no {name} (export one with `optimum-cli"
                " export openvino --model openai/whisper-base FOLDER`)"
            )


def transcription_models_to_serve(
    settings: Settings, configured: Sequence[tuple[Settings, ModelKind]]
) -> list[tuple[str, Settings, Path]]:
    """(name, settings, folder) of every Whisper model: those of the config file and the
    flags' --transcription-model."""
    found: list[tuple[str, Settings, Path]] = []
    for model_settings, kind in configured:
        if kind == "transcription" and model_settings.model is not None:
            folder = Path(model_settings.model).expanduser()
            found.append((model_settings.served_model_name or folder.name, model_settings, folder))
    if settings.transcription_model:
        folder = Path(settings.transcription_model).expanduser()
        found.append((folder.name, settings, folder))
    return found
