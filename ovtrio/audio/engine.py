"""A Whisper model on OpenVINO GenAI's WhisperPipeline, one 30 s window at a time.

The pipeline takes audio of any length and walks it in 30 s windows itself, but in one
call: nothing else runs on the model meanwhile and nothing stops it but its streamer.
Here each call is one window (WINDOW_SAMPLES, what the encoder takes), so the worker
(ovtrio/audio/service.py) can run another request's window between two of a long file's,
and a request whose client left ends at its current window (or sooner: the streamer
stops a window without timestamps at its next token). Windows follow each other the way
the pipeline's own long-form loop does: a window that ends inside a segment keeps what
came before it, and the next window starts at the end of its last complete segment
(ovtrio/audio/windows.py).

The pipeline holds its tokenizer and computes in its own threads; a `Transcriber` is used
from one thread at a time (the worker's).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ovtrio.audio.decode import SAMPLE_RATE, Audio
from ovtrio.audio.windows import WindowOutput, in_order, stitch
from ovtrio.audio.word_bounds import bounded_words
from ovtrio.files.json_files import read_json_object
from ovtrio.model.source import ModelLoadError

log = logging.getLogger("ovtrio")

WINDOW_SECONDS = 30
WINDOW_SAMPLES = WINDOW_SECONDS * SAMPLE_RATE
_SHORTEST_SAMPLES = 401  # the feature extractor takes more than n_fft / 2 (200) samples

Task = Literal["transcribe", "translate"]
_UNSET = 2**63  # GenerationConfig's "no limit" is SIZE_MAX


@dataclass(frozen=True)
class Options:
    task: Task
    language: str | None  # an ISO code the model knows ("en"); None: detected
    prompt: str | None
    temperature: float
    segments: bool  # segment timestamps
    words: bool  # word timestamps


@dataclass(frozen=True)
class Segment:
    start: float
    end: float
    text: str
    tokens: list[int]
    seek: int  # where its window starts, in 10 ms frames (as Whisper's `seek`)


@dataclass(frozen=True)
class Word:
    word: str
    start: float
    end: float


@dataclass
class Transcript:
    """What the windows so far made of a request's audio."""

    text: str = ""
    language: str | None = None
    segments: list[Segment] = field(default_factory=list)
    words: list[Word] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    windows: int = 0


def model_languages(folder: Path) -> tuple[bool, list[str]]:
    """Whether the model at `folder` is multilingual, and the ISO codes of the languages
    its generation_config.json lists (`lang_to_id`: "<|en|>" -> id)."""
    config = read_json_object(folder / "generation_config.json")
    languages = config.get("lang_to_id")
    codes = [key.strip("<|>") for key in languages if isinstance(key, str)] if isinstance(languages, dict) else []
    return bool(config.get("is_multilingual")), codes


def word_timestamps_available(folder: Path) -> bool:
    """Word timings need the cross-attention heads that align text with audio
    (`alignment_heads`), which optimum writes for the openai/whisper-* models."""
    return bool(read_json_object(folder / "generation_config.json").get("alignment_heads"))


class Transcriber:
    def __init__(self, folder: Path, device: str, properties: dict[str, Any]) -> None:
        started = time.monotonic()
        self.folder = folder
        self.words_available = word_timestamps_available(folder)
        try:
            self.pipeline = self._pipeline(device, properties)
        except RuntimeError as exc:
            raise ModelLoadError(f"cannot load Whisper model {folder}: {str(exc).splitlines()[0]}") from None
        self.config = self.pipeline.get_generation_config()
        self.tokenizer = self.pipeline.get_tokenizer()
        self.multilingual = bool(self.config.is_multilingual)
        model = read_json_object(folder / "config.json")
        self.max_target_positions = int(model.get("max_target_positions") or 448)
        # Whisper keeps at most half its context for the previous text (the prompt).
        self.max_prompt_tokens = self.max_target_positions // 2 - 1
        _language_names()  # read now, in the loading thread: transformers takes a while to import
        self.load_seconds = time.monotonic() - started

    def _pipeline(self, device: str, properties: dict[str, Any]) -> Any:
        """The pipeline, set up for word timestamps when the model has alignment heads
        (its cross-attention is then computed in parts that expose the scores); a model
        whose graph does not allow it is served without them."""
        import openvino_genai

        folder = str(self.folder)
        if self.words_available:
            try:
                pipeline = openvino_genai.WhisperPipeline(folder, device, word_timestamps=True, **properties)
                # The scores are found in the graph by name: a first window (a second of
                # silence, a few tokens) shows whether they were.
                pipeline.generate([0.0] * SAMPLE_RATE, max_new_tokens=3, word_timestamps=True)
                return pipeline
            except RuntimeError as exc:
                log.warning("serving %s without word timestamps: %s", folder, str(exc).splitlines()[0])
                self.words_available = False
        return openvino_genai.WhisperPipeline(folder, device, **properties)

    def prompt_tokens(self, prompt: str | None) -> tuple[str | None, int]:
        """The prompt the model is given: the last max_prompt_tokens tokens of `prompt`
        (Whisper keeps the end of a longer one), and their count."""
        if not prompt:
            return None, 0
        ids = self.tokenizer.encode(" " + prompt, add_special_tokens=False).input_ids.data.reshape(-1).tolist()
        if len(ids) <= self.max_prompt_tokens:
            return prompt, len(ids)
        kept = ids[-self.max_prompt_tokens :]
        return self.tokenizer.decode(kept).strip(), len(kept)

    def window(
        self,
        audio: Audio,
        start: int,
        options: Options,
        prompt: tuple[str | None, int],
        stream: Callable[[str], bool],
        last_speech: float = 0.0,
    ) -> tuple[int, Transcript]:
        """Transcribe the window of `audio` from sample `start`; returns where the next
        window starts and what this one made. `stream(text)` gets the text as it is
        written (windows without timestamps) and returns True to stop. `last_speech`:
        where the segments before this window ended, in seconds (word timings after a
        pause are bounded, ovtrio/audio/word_bounds.py)."""
        samples = audio.window(start, WINDOW_SAMPLES)
        heard = len(samples)
        if heard < _SHORTEST_SAMPLES:
            # The pipeline refuses fewer samples than its STFT pads with (the last few
            # milliseconds of a file just over a window): silence after them.
            samples += [0.0] * (_SHORTEST_SAMPLES - heard)
        long_form = len(audio.samples) > WINDOW_SAMPLES
        timestamps = options.segments or options.words or long_form
        config = self._config(options, prompt, timestamps)
        if timestamps:
            result, passes = self._generate(samples, config, lambda: _passes(stream))
        else:
            result, _ = self._generate(samples, config, lambda: _streamer(stream))
        offset = start / SAMPLE_RATE
        seek = start * 100 // SAMPLE_RATE
        part = Transcript(language=getattr(result, "language", None) or options.language, windows=1)
        part.output_tokens = int(result.perf_metrics.get_num_generated_tokens())
        part.text = result.texts[0]
        next_start = start + heard
        if not timestamps:
            return next_start, part
        first = passes.first or []
        kept = stitch(
            WindowOutput(
                chunks=list(result.chunks or []),
                words=list(result.words or []) if options.words else [],
                # Its text tells which segments the first pass wrote, when there was a
                # second (the detokenizer holds the GIL: not asked otherwise).
                first_text=self.tokenizer.decode(first) if first and passes.went_on else "",
                first_tokens=len(first),
                went_on=passes.went_on,
            ),
            seconds=heard / SAMPLE_RATE,
            full=next_start < len(audio.samples),
        )
        if kept.advance < heard / SAMPLE_RATE:
            # Cut: the next window starts on the 10 ms grid of the pipeline's own seek.
            next_start = start + round(kept.advance * 100) * SAMPLE_RATE // 100
        if not kept.whole:
            part.text = "".join(segment.text for segment in kept.segments)
        part.segments = [
            Segment(offset + s.start, offset + s.end, s.text, self._tokens(s.text), seek) for s in kept.segments
        ]
        words = in_order(bounded_words(kept.segments, kept.words, last_speech - offset), kept.advance)
        part.words = [Word(w.text, offset + w.start, offset + w.end) for w in words]
        if part.text:
            stream(part.text)  # the window's text, as one piece
        return next_start, part

    def _generate(self, samples: list[float], config: Any, streamer: Callable[[], Any]) -> tuple[Any, Any]:
        """The window's result, and the streamer (made by `streamer`) of the pass it came
        from. Word timings are computed from a first pass's text: the pipeline's word
        splitting (openvino-genai 2026.4) crashes the process on text that is not valid
        UTF-8 (a model writing stray bytes), so the words are asked for, in a second pass
        that writes the same greedy text, only when the first pass's text is clean;
        otherwise the window has no words."""
        if not config.word_timestamps:
            first = streamer()
            return self.pipeline.generate(samples, config, first), first
        config.word_timestamps = False
        first = streamer()
        result = self.pipeline.generate(samples, config, first)
        text = result.texts[0]
        if "\ufffd" in text or any(ord(ch) < 32 and ch not in "\t\n\r" for ch in text):
            log.warning("no word timestamps for a window whose text is not clean UTF-8")
            return result, first
        config.word_timestamps = True
        second = streamer()
        return self.pipeline.generate(samples, config, second), second

    def _tokens(self, text: str) -> list[int]:
        if not text:
            return []
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False).input_ids.data.reshape(-1)]

    def _config(self, options: Options, prompt: tuple[str | None, int], timestamps: bool) -> Any:
        config = self.pipeline.get_generation_config()  # a copy: the model's own settings
        text, count = prompt
        if self.multilingual:
            config.task = options.task
            if options.language is not None:
                config.language = f"<|{options.language}|>"
        config.return_timestamps = timestamps
        config.word_timestamps = options.words
        if text:
            config.initial_prompt = text
        # The decoder's positions hold the start tokens (at most 4), the prompt and what
        # it writes: a prompt shortens what it may write. Without one the model's own
        # bound stands (max_length in generation_config.json, 448 for openai's models),
        # so that the text is the pipeline's own; a model that sets none gets this one.
        bound = max(1, self.max_target_positions - count - 5)
        own = config.max_new_tokens if config.max_new_tokens < _UNSET else config.max_length
        if count or own >= _UNSET:
            config.max_new_tokens = min(own, bound)
        config.do_sample = options.temperature > 0
        if options.temperature > 0:
            config.temperature = options.temperature
        return config


def _streamer(stream: Callable[[str], bool]) -> Callable[[str], Any]:
    import openvino_genai

    def write(text: str) -> Any:
        return openvino_genai.StreamingStatus.CANCEL if stream(text) else openvino_genai.StreamingStatus.RUNNING

    return write


def _passes(stream: Callable[[str], bool]) -> Any:
    """The streamer of a window with timestamps. The pipeline calls it once a pass is
    done, with that pass's text tokens (not token by token): the first call's tokens are
    the first pass's complete segments; a second call means the first pass ended inside
    a segment and the pipeline went on from its last complete one, over the window's end
    (ovtrio/audio/windows.py): that pass is not wanted, and the pipeline stops there
    (its segments are reported, its words are not computed). `stream("")` says whether
    to stop after the first."""
    return _passes_class()(stream)


@functools.cache
def _passes_class() -> type:
    import openvino_genai

    class Passes(openvino_genai.StreamerBase):
        def __init__(self, stream: Callable[[str], bool]) -> None:
            super().__init__()
            self.stream = stream
            self.first: list[int] | None = None
            self.went_on = False

        def write(self, tokens: int | list[int]) -> Any:
            if self.first is None:
                self.first = [tokens] if isinstance(tokens, int) else list(tokens)
                stop = self.stream("")
                return openvino_genai.StreamingStatus.CANCEL if stop else openvino_genai.StreamingStatus.RUNNING
            self.went_on = True
            return openvino_genai.StreamingStatus.CANCEL

        def end(self) -> None:
            pass

    return Passes


def language_name(code: str | None) -> str:
    """The language's English name, as OpenAI's verbose_json gives it ("english")."""
    if code is None:
        return "english"
    return _language_names().get(code, code)


@functools.cache
def _language_names() -> dict[str, str]:
    """ISO code -> English name, from transformers' Whisper tables."""
    try:
        from transformers.models.whisper.tokenization_whisper import LANGUAGES
    except ImportError:  # pragma: no cover - transformers is a dependency
        return {}
    return dict(LANGUAGES)


def windows_of(audio: Audio) -> int:
    """How many windows `audio` takes at least (a cut window may add one)."""
    return max(1, -(-len(audio.samples) // WINDOW_SAMPLES))


def joined(parts: Sequence[Transcript]) -> Transcript:
    whole = Transcript()
    for part in parts:
        whole.text += part.text
        whole.language = whole.language or part.language
        whole.segments += part.segments
        whole.words += part.words
        whole.output_tokens += part.output_tokens
        whole.windows += part.windows
    return whole
