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


def speech_like(seconds: float, seed: int = 7, rate: int = RATE) -> np.ndarray:
    """Int16 samples shaped like someone talking: voiced syllables (a pitch of 100-180 Hz
    and its harmonics under two formants, a rising and falling envelope) in words of one
    to three, a short gap between words and a longer pause between sentences, which run
    on regardless of where a 30 s window ends. Every syllable peaks at the same level, so
    any 30 s of it is as loud as the whole."""
    rng = np.random.default_rng(seed)
    out = np.zeros(int(rate * seconds), dtype=np.float32)
    at = int(0.4 * rate)
    while at < len(out):
        for _ in range(int(rng.integers(5, 11))):  # a sentence's words
            for _ in range(int(rng.integers(1, 4))):  # a word's syllables
                length = int(rate * rng.uniform(0.12, 0.28))
                t = np.arange(length) / rate
                pitch = rng.uniform(100, 180)
                formants = rng.uniform(300, 900), rng.uniform(1000, 2500)
                voiced = sum(
                    np.sin(2 * np.pi * pitch * k * t) * sum(np.exp(-(((pitch * k - f) / 250.0) ** 2)) for f in formants)
                    for k in range(1, int(3500 // pitch))
                )
                syllable = voiced * np.sin(np.pi * t / t[-1])
                syllable = 0.35 * syllable / np.max(np.abs(syllable))
                piece = out[at : at + length]
                piece[:] = syllable[: len(piece)]
                at += length
            at += int(rate * rng.uniform(0.05, 0.12))
        at += int(rate * rng.uniform(0.5, 0.9))
    return (out * 32767).astype(np.int16)
