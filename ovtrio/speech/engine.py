"""A text-to-speech model on OpenVINO GenAI's Text2SpeechPipeline, one piece of text
(a sentence, ovtrio/speech/pieces.py) at a time.

The pipeline speaks a text in one call that nothing stops; called a sentence at a time,
the worker (ovtrio/speech/service.py) hands each sentence's samples to the response as
soon as they are made, runs another request's sentence between two of a long text's,
and stops a request whose client left at its next sentence. The pipeline releases the
GIL while it computes. A `Speaker` is used from one thread at a time (the worker's).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ovtrio.engine.errors import client_reason
from ovtrio.files.json_files import read_json_object
from ovtrio.model.source import ModelLoadError

# HiFi-GAN's samples per mel frame (microsoft/speecht5_hifigan's upsampling): how many
# samples one decoder step makes is this times the model's reduction factor.
VOCODER_HOP = 256
DEFAULT_SAMPLE_RATE = 16000


@dataclass(frozen=True)
class Spoken:
    """One piece of text, spoken: float32 samples in [-1, 1], mono."""

    samples: np.ndarray
    sample_rate: int
    input_tokens: int
    output_steps: int  # the decoder's steps (each makes reduction_factor mel frames)


def reduction_factor(folder: Path) -> int:
    value = read_json_object(folder / "config.json").get("reduction_factor")
    return value if isinstance(value, int) and value > 0 else 2


def max_steps(folder: Path) -> int:
    """The most decoder steps a piece may take: the decoder's positions (SpeechT5's
    max_speech_positions, 1876) hold the frames so far, one a step and the first."""
    value = read_json_object(folder / "config.json").get("max_speech_positions")
    return (value if isinstance(value, int) and value > 2 else 1876) - 2


def embedding_size(folder: Path) -> int:
    """The speaker embedding's length the model takes (SpeechT5's x-vectors: 512)."""
    value = read_json_object(folder / "config.json").get("speaker_embedding_dim")
    return value if isinstance(value, int) and value > 0 else 512


class Speaker:
    def __init__(self, folder: Path, device: str, properties: dict[str, Any]) -> None:
        import openvino_genai

        started = time.monotonic()
        self.folder = folder
        try:
            self.pipeline = openvino_genai.Text2SpeechPipeline(str(folder), device, **properties)
            self.tokenizer = openvino_genai.Tokenizer(str(folder))
            # A first sentence shows that the model runs, and its sample rate.
            self.sample_rate = int(self.pipeline.generate(".").output_sample_rate) or DEFAULT_SAMPLE_RATE
        except RuntimeError as exc:
            raise ModelLoadError(f"cannot load text-to-speech model {folder}: {client_reason(exc)}") from None
        self.embedding_shape = tuple(int(size) for size in self.pipeline.get_speaker_embedding_shape())
        self.reduction = reduction_factor(folder)
        self.samples_per_step = self.reduction * VOCODER_HOP
        self.max_steps = max_steps(folder)
        self.maxlenratio = float(self.pipeline.get_generation_config().maxlenratio)
        self.load_seconds = time.monotonic() - started

    def speak(self, text: str, embedding: np.ndarray | None) -> Spoken:
        """`text` spoken in the voice of `embedding` (None: the model's default voice)."""
        import openvino as ov

        speaker = None if embedding is None else ov.Tensor(embedding.reshape(self.embedding_shape))
        tokens = int(self.tokenizer.encode(text).input_ids.get_size())
        # The pipeline stops its decoder at maxlenratio steps a token over the reduction
        # factor, whether the model said stop or not; bounded here by the decoder's
        # positions too, so a text that keeps the model from stopping ends there.
        ratio = min(self.maxlenratio, self.reduction * self.max_steps / max(tokens, 1))
        result = self.pipeline.generate(text, speaker, maxlenratio=ratio)
        # A copy: the tensor is the pipeline's output buffer, which its next call rewrites.
        samples = np.array(result.speeches[0].data, dtype=np.float32).reshape(-1)
        return Spoken(samples, self.sample_rate, tokens, -(-len(samples) // self.samples_per_step))
