"""An uploaded audio file decoded to what Whisper hears: 16 kHz mono samples.

PyAV (FFmpeg's libraries, shipped in its wheels) decodes every format OpenAI's audio API
takes and resamples with libswresample. The format is named from the file's first bytes
and given to FFmpeg, never guessed by it: FFmpeg's probe would also accept playlists
(HLS, concat) whose entries it would go and open, so a file that is none of the formats
below is refused before FFmpeg reads it.

Nothing is allocated from what the file declares: a header that claims hours of audio
is refused when the claim is over the limit, and the decoded samples are counted as
they come, so a small file that decodes to more than the limit stops there. Samples
are kept as int16 (half of float32's memory for a request that waits its turn).

Runs in a worker thread (ovtrio/audio/service.py bounds how many at once): a file is
decoded in milliseconds to a few hundred, which the event loop must not wait for.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from ovtrio.errors import FieldError

SAMPLE_RATE = 16000

# First bytes -> FFmpeg demuxer. mp4/m4a/mov share one demuxer, as do webm and mkv.
_MAGIC: tuple[tuple[int, bytes, str], ...] = (
    (0, b"RIFF", "wav"),
    (0, b"RF64", "wav"),
    (0, b"BW64", "wav"),
    (0, b"fLaC", "flac"),
    (0, b"OggS", "ogg"),
    (0, b"ID3", "mp3"),
    (4, b"ftyp", "mov"),
    (0, b"\x1a\x45\xdf\xa3", "matroska"),
)


class AudioError(FieldError):
    """The file cannot be used; the message says why, for the client."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "file", "invalid_audio")


@dataclass(frozen=True)
class Audio:
    samples: np.ndarray  # int16, mono, SAMPLE_RATE
    format: str

    @property
    def seconds(self) -> float:
        return len(self.samples) / SAMPLE_RATE

    def window(self, start: int, length: int) -> list[float]:
        """Samples in [-1, 1) from `start`, at most `length` of them, as the list of
        floats WhisperPipeline.generate takes.

        The pipeline's binding copies its argument into a C++ vector while holding the
        GIL, and converts a list of Python floats several times faster than a numpy
        array; the list is built a second at a time, each piece short enough for the
        event loop to run between (why: docs/benchmarks.md#speech-to-text)."""
        window = self.samples[start : start + length].astype(np.float32) / 32768.0
        floats: list[float] = []
        for piece in range(0, len(window), SAMPLE_RATE):
            floats += window[piece : piece + SAMPLE_RATE].tolist()
        return floats


def sniff(data: bytes | bytearray | memoryview) -> str | None:
    """The FFmpeg demuxer for a file starting with `data`, or None when it is none of
    the formats taken."""
    head = bytes(data[:12])
    for offset, magic, name in _MAGIC:
        if head[offset : offset + len(magic)] == magic:
            return name
    # MPEG audio without an ID3 tag starts with a frame sync (11 bits set); its layer
    # bits are never 00, which marks AAC in ADTS frames instead.
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:
        return "aac" if head[1] & 0x06 == 0 else "mp3"
    return None


def decode(data: bytes | bytearray | memoryview, max_seconds: float) -> Audio:
    """The samples of the audio file `data`. Raises AudioError: not one of the formats,
    not decodable, no audio in it, or longer than `max_seconds`."""
    import av

    if not len(data):
        raise AudioError("The file is empty.")
    demuxer = sniff(data)
    if demuxer is None:
        raise AudioError(
            "The file is not in a supported audio format (flac, m4a, mp3, mp4, mpeg, mpga, oga, ogg, wav or webm)."
        )
    if demuxer == "wav":
        _check_wav_header(data, max_seconds)
    limit = int(max_seconds * SAMPLE_RATE)
    try:
        with av.open(io.BytesIO(data), mode="r", format=demuxer) as container:
            streams = container.streams.audio
            if not streams:
                raise AudioError("The file holds no audio stream.")
            stream = streams[0]
            declared = _declared_seconds(container, stream)
            if declared is not None and declared > max_seconds:
                raise AudioError(
                    f"The file declares {declared:.0f} s of audio, more than the {max_seconds:g} s this server takes."
                )
            resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
            parts: list[np.ndarray] = []
            count = 0
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    count = _keep(parts, out, count, limit, max_seconds)
            for out in resampler.resample(None):
                count = _keep(parts, out, count, limit, max_seconds)
    except AudioError:
        raise
    except (av.error.FFmpegError, ValueError, EOFError) as exc:
        name = _FORMAT_NAMES.get(demuxer, demuxer)
        raise AudioError(f"The file could not be decoded as {name}: {_reason(exc)}") from None
    if not count:
        raise AudioError("The file holds no audio samples (empty or truncated).")
    if demuxer == "flac" and declared is not None and count / SAMPLE_RATE < declared - 0.1:
        # FLAC's header counts its samples exactly: fewer decoded is a cut file.
        raise AudioError(
            f"The file is truncated: it declares {declared:.2f} s of audio and holds {count / SAMPLE_RATE:.2f} s."
        )
    return Audio(np.concatenate(parts) if len(parts) > 1 else parts[0], demuxer)


_FORMAT_NAMES = {"mov": "mp4/m4a", "matroska": "webm", "aac": "AAC"}


def _keep(parts: list[np.ndarray], frame, count: int, limit: int, max_seconds: float) -> int:
    samples = frame.to_ndarray().reshape(-1)
    count += len(samples)
    if count > limit:
        raise AudioError(f"The audio is longer than the {max_seconds:g} s this server takes.")
    parts.append(samples.astype(np.int16, copy=False))
    return count


def _check_wav_header(data: bytes | bytearray | memoryview, max_seconds: float) -> None:
    """A WAV file's data chunk says how many bytes of samples follow; FFmpeg reads only
    what is there, so a header claiming hours over a few bytes is caught here: over the
    limit, or more than the file holds (0 and 0xFFFFFFFF mean "unknown", as a recorder
    writing to a pipe leaves them)."""
    view = memoryview(data)
    if len(view) < 12 or bytes(view[8:12]) != b"WAVE":
        raise AudioError("The file is not a WAV file (RIFF without WAVE).")
    offset = 12
    byte_rate = 0
    while offset + 8 <= len(view):
        chunk = bytes(view[offset : offset + 4])
        size = int.from_bytes(view[offset + 4 : offset + 8], "little")
        if chunk == b"fmt " and offset + 16 <= len(view):
            byte_rate = int.from_bytes(view[offset + 16 : offset + 20], "little")
        if chunk == b"data":
            if size in (0, 0xFFFFFFFF) or not byte_rate:
                return
            seconds = size / byte_rate
            if seconds > max_seconds:
                raise AudioError(
                    f"The file declares {seconds:.0f} s of audio, more than the {max_seconds:g} s this server takes."
                )
            held = len(view) - offset - 8
            if size > held + byte_rate // 10:  # a tenth of a second of slack
                raise AudioError(f"The file is truncated: its header declares {size} bytes of audio and {held} follow.")
            return
        offset += 8 + size + (size & 1)


def _declared_seconds(container, stream) -> float | None:
    """How long the file says it is, when it says (container or stream header)."""
    if container.duration is not None and container.duration > 0:
        return container.duration / 1_000_000  # AV_TIME_BASE
    if stream.duration is not None and stream.duration > 0 and stream.time_base:
        return float(stream.duration * stream.time_base)
    return None


def _reason(exc: BaseException) -> str:
    """FFmpeg's message without the file name PyAV adds (a BytesIO's repr)."""
    if hasattr(exc, "strerror") and getattr(exc, "strerror", None):
        return str(exc.strerror)
    return str(exc).split(":")[0] or type(exc).__name__
