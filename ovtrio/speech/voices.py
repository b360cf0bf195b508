"""The voices a text-to-speech model speaks in: speaker embeddings (SpeechT5's are
512-number x-vectors), named by their files.

`default` is the model's own voice: the folder's `speaker_embedding.bin` (or `.npy`)
when it has one, else the x-vector OpenVINO GenAI's pipeline is built with. More voices
are files in the voices folder (`--speech-voices DIR`, else the model folder's
`voices/`): `NAME.bin` (raw little-endian float32, as OpenVINO GenAI's samples write
them) or `NAME.npy` (a NumPy array), each of the model's embedding size. OpenAI's voice
names (alloy, ash, ...), which clients send by default, speak in the default voice
unless a file of that name says otherwise.

A file that is not an embedding of the right size is left out with a warning: the
voices served are those that can be spoken.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger("ovtrio")

DEFAULT = "default"
OPENAI_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "coral",
    "echo",
    "fable",
    "nova",
    "onyx",
    "sage",
    "shimmer",
    "verse",
    "marin",
    "cedar",
)
_MAX_FILE_BYTES = 1 << 20  # an x-vector is 2 KB; anything this large is not one
SUFFIXES = (".bin", ".npy")


@dataclass(frozen=True)
class Voices:
    """The voices by name; None is the pipeline's built-in default voice."""

    embeddings: dict[str, np.ndarray | None]

    @property
    def names(self) -> list[str]:
        return sorted(self.embeddings, key=lambda name: (name != DEFAULT, name))

    def named(self, name: str) -> np.ndarray | None:
        """The embedding of `name`; KeyError when there is no such voice."""
        if name in self.embeddings:
            return self.embeddings[name]
        if name in OPENAI_VOICES:
            return self.embeddings[DEFAULT]
        raise KeyError(name)

    def knows(self, name: str) -> bool:
        return name in self.embeddings or name in OPENAI_VOICES


def read_embedding(path: Path, size: int) -> np.ndarray:
    """The embedding in `path` as float32 [1, size]; ValueError saying why it is none."""
    if path.stat().st_size > _MAX_FILE_BYTES:
        raise ValueError(f"{path.stat().st_size} bytes, not an embedding of {size} numbers")
    if path.suffix == ".npy":
        array = np.load(path, allow_pickle=False)
        if not np.issubdtype(array.dtype, np.floating):
            raise ValueError(f"an array of {array.dtype}, not of floats")
    else:
        data = path.read_bytes()
        if len(data) != 4 * size:
            raise ValueError(f"{len(data)} bytes, not {size} float32 numbers ({4 * size} bytes)")
        array = np.frombuffer(data, dtype="<f4")
    if array.size != size:
        raise ValueError(f"{array.size} numbers, not {size}")
    vector = array.astype(np.float32).reshape(1, size)
    if not np.isfinite(vector).all():
        raise ValueError("numbers that are not finite")
    return vector


def read_voices(folder: Path, voices_dir: Path | None, size: int) -> Voices:
    """The voices of the model at `folder` (see above), embeddings of `size` numbers."""
    embeddings: dict[str, np.ndarray | None] = {DEFAULT: None}
    candidates = [folder / f"speaker_embedding{suffix}" for suffix in SUFFIXES]
    own = next((path for path in candidates if path.is_file()), None)
    if own is not None:
        embeddings[DEFAULT] = _read_or_warn(own, size)
    directory = voices_dir if voices_dir is not None else folder / "voices"
    if directory.is_dir():
        for path in sorted(directory.iterdir()):
            if path.suffix not in SUFFIXES or not path.is_file() or not path.stem or path.stem in embeddings:
                continue
            vector = _read_or_warn(path, size)
            if vector is not None:
                embeddings[path.stem] = vector
    return Voices(embeddings)


def _read_or_warn(path: Path, size: int) -> np.ndarray | None:
    try:
        return read_embedding(path, size)
    except (OSError, ValueError) as exc:
        log.warning("not serving the voice %s: %s", path.name, exc)
        return None
