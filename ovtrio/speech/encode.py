"""Samples written as the response formats of OpenAI's speech API, a piece at a time:
wav and pcm by hand, flac, mp3, opus (in Ogg) and aac (in ADTS) with PyAV (FFmpeg's
libraries, which decode uploads in ovtrio/audio/decode.py).

pcm is what OpenAI sends: 16-bit signed little-endian mono samples, no header, at the
model's rate; a sample x in [-1, 1] is round(x * 32767). wav is the same samples after a
RIFF header; streamed (more than one piece), the header cannot know the length and says
0xFFFFFFFF, as OpenAI's streamed wav does and players read to the end.

The FFmpeg encoders keep a few milliseconds back (their frames have a fixed size): a
piece's bytes are most of its audio, the rest come with the next piece or the end. The
muxer writes each packet out at once (`flush_packets`), to an output that cannot seek, so
nothing is rewritten after it was sent.

Encoding takes milliseconds a second of audio: the caller runs it in a worker thread.
An Encoder is used by one request, from one thread at a time.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
MEDIA_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/opus",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
# format -> (FFmpeg muxer, encoder)
_FFMPEG = {"mp3": ("mp3", "libmp3lame"), "opus": ("ogg", "libopus"), "aac": ("adts", "aac"), "flac": ("flac", "flac")}
# Every packet written out at once; the same samples make the same bytes (`bitexact`:
# no random Ogg serial number, no encoder version tag). Ogg pages are written a page at a
# time, of up to a second by default: 100 ms pages let a piece's audio out with it.
_MUXER_OPTIONS = {"flush_packets": "1", "fflags": "+bitexact"}
_OGG_OPTIONS = {**_MUXER_OPTIONS, "page_duration": "100000"}
_OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
_UNKNOWN = 0xFFFFFFFF


def pcm16(samples: np.ndarray) -> bytes:
    """float samples in [-1, 1] as 16-bit little-endian integers: round(x * 32767)."""
    return np.round(np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def wav_header(sample_rate: int, data_bytes: int | None) -> bytes:
    """A 44-byte RIFF/WAVE header for 16-bit mono; `data_bytes` None: unknown (streamed)."""
    data = _UNKNOWN if data_bytes is None else data_bytes
    riff = _UNKNOWN if data_bytes is None else 36 + data_bytes
    return (
        b"RIFF"
        + struct.pack("<I", riff)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", data)
    )


class Encoder:
    """Writes one response's audio: `add` each piece's samples, then `finish`."""

    def __init__(self, response_format: str, sample_rate: int) -> None:
        if response_format not in FORMATS:
            raise ValueError(response_format)
        self.format = response_format
        self.sample_rate = sample_rate
        self._started = False
        self._ffmpeg: _FFmpegWriter | None = None
        if response_format in _FFMPEG:
            self._ffmpeg = _FFmpegWriter(response_format, sample_rate)

    def add(self, samples: np.ndarray, last: bool = False) -> bytes:
        """The bytes of `samples` (float32 mono at the sample rate); `last`: no more
        pieces follow (a wav of one piece then says its length)."""
        first, self._started = not self._started, True
        if self._ffmpeg is not None:
            out = self._ffmpeg.write(samples)
            return out + self._ffmpeg.close() if last else out
        data = pcm16(samples)
        if self.format == "wav" and first:
            return wav_header(self.sample_rate, len(data) if last else None) + data
        return data

    def finish(self) -> bytes:
        """What is left to send after the last `add` (the encoder's last frames)."""
        if self._ffmpeg is not None:
            return self._ffmpeg.close()
        if self.format == "wav" and not self._started:
            return wav_header(self.sample_rate, 0)
        return b""


class _Sink:
    """What the muxer writes, kept until taken; it cannot seek (so FFmpeg never goes
    back over bytes already sent)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: Any) -> int:
        self.data += data
        return len(data)

    def take(self) -> bytes:
        out, self.data = bytes(self.data), bytearray()
        return out


class _FFmpegWriter:
    def __init__(self, response_format: str, sample_rate: int) -> None:
        import av

        muxer, codec = _FFMPEG[response_format]
        rate = sample_rate
        if response_format == "opus" and rate not in _OPUS_RATES:
            rate = 48000
        self._sink = _Sink()
        options = _OGG_OPTIONS if muxer == "ogg" else _MUXER_OPTIONS
        self._container = av.open(self._sink, mode="w", format=muxer, options=options)
        self._stream: Any = self._container.add_stream(codec, rate=rate, layout="mono")
        self._rate = sample_rate
        self._closed = False
        self._pts = 0

    def write(self, samples: np.ndarray) -> bytes:
        import av

        if len(samples):
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(samples, dtype=np.float32).reshape(1, -1), format="flt", layout="mono"
            )
            frame.sample_rate = self._rate
            frame.pts = self._pts
            self._pts += len(samples)
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
        return self._sink.take()

    def close(self) -> bytes:
        if self._closed:
            return b""
        self._closed = True
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        return self._sink.take()
