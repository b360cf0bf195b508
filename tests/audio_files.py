"""Audio for the tests, made here: numpy tones, written as WAV by the standard library and
encoded to the other formats OpenAI's audio API takes with PyAV."""

from __future__ import annotations

import io
import struct
import wave

import numpy as np

RATE = 16000


def tone(seconds: float, hertz: float = 440.0, rate: int = RATE) -> np.ndarray:
    """A sine as int16 samples (a second tone at 1.5x makes it less pure)."""
    t = np.arange(int(rate * seconds)) / rate
    signal = 0.3 * np.sin(2 * np.pi * hertz * t) + 0.1 * np.sin(2 * np.pi * hertz * 1.5 * t)
    return (signal * 32767).astype(np.int16)


def as_float(samples: np.ndarray) -> np.ndarray:
    """What the server hears of 16 kHz int16 samples."""
    return samples.astype(np.float32) / 32768.0


def wav(samples: np.ndarray, rate: int = RATE, channels: int = 1) -> bytes:
    data = np.repeat(samples[:, None], channels, axis=1) if channels > 1 else samples
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as file:
        file.setnchannels(channels)
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes(np.ascontiguousarray(data).tobytes())
    return buffer.getvalue()


def wav_claiming(data_bytes: int, body: int = 256, rate: int = RATE) -> bytes:
    """A WAV header whose data chunk declares `data_bytes` bytes, followed by `body`."""
    header = bytearray(wav(np.zeros(0, dtype=np.int16), rate))
    struct.pack_into("<I", header, 4, min(data_bytes + 36, 0xFFFFFFFF))
    struct.pack_into("<I", header, 40, data_bytes)
    return bytes(header) + bytes(body)


# format name for PyAV, codec, sample rate, channels layout
ENCODINGS = {
    "mp3": ("mp3", "libmp3lame", 44100, "stereo"),
    "flac": ("flac", "flac", 16000, "mono"),
    "ogg": ("ogg", "libopus", 48000, "stereo"),
    "m4a": ("ipod", "aac", 44100, "stereo"),
    "webm": ("webm", "libopus", 48000, "mono"),
}


def encoded(samples: np.ndarray, extension: str, rate: int = RATE) -> bytes:
    """`samples` (int16 at `rate`) in the format of `extension`, resampled to the
    codec's rate."""
    import av

    container_format, codec, codec_rate, layout = ENCODINGS[extension]
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container_format) as container:
        stream = container.add_stream(codec, rate=codec_rate, layout=layout)
        resampler = av.AudioResampler(format=stream.format.name, layout=layout, rate=codec_rate)
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = rate
        frame_size = stream.codec_context.frame_size or 1024
        fifo = av.AudioFifo()
        for out in resampler.resample(frame) + resampler.resample(None):
            fifo.write(out)
        while fifo.samples:
            chunk = fifo.read(min(frame_size, fifo.samples), partial=True)
            for packet in stream.encode(chunk):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()
