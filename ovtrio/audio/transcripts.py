"""A transcript in OpenAI's response formats: json, text, srt, vtt and verbose_json.

What Whisper does not give through OpenVINO GenAI is computed the way OpenAI's Whisper
does where it can be: a segment's `tokens` are its text's tokens, `compression_ratio`
is its text's length over its zlib-compressed length. The pipeline gives no token
probabilities: `avg_logprob` and `no_speech_prob` are 0 (not computed).
"""

from __future__ import annotations

import zlib
from typing import Any

from ovtrio.audio.engine import Segment, Transcript, Word

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")


def _clock(seconds: float, separator: str) -> str:
    milliseconds = max(0, round(seconds * 1000))
    hours, rest = divmod(milliseconds, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole, millis = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{whole:02d}{separator}{millis:03d}"


def srt(segments: list[Segment]) -> str:
    """SubRip: numbered cues, `HH:MM:SS,mmm --> HH:MM:SS,mmm`."""
    cues = [
        f"{index}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text.strip()}\n"
        for index, s in enumerate(segments, start=1)
    ]
    return "\n".join(cues) + ("\n" if cues else "")


def vtt(segments: list[Segment]) -> str:
    """WebVTT: a header, then `HH:MM:SS.mmm --> HH:MM:SS.mmm` cues."""
    cues = [f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text.strip()}\n" for s in segments]
    return "WEBVTT\n\n" + "\n".join(cues) + ("\n" if cues else "")


def compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def _segment(index: int, segment: Segment, temperature: float) -> dict[str, Any]:
    return {
        "id": index,
        "seek": segment.seek,
        "start": round(segment.start, 3),
        "end": round(segment.end, 3),
        "text": segment.text,
        "tokens": segment.tokens,
        "temperature": temperature,
        "avg_logprob": 0.0,
        "compression_ratio": compression_ratio(segment.text),
        "no_speech_prob": 0.0,
    }


def _word(word: Word) -> dict[str, Any]:
    return {"word": word.word.strip(), "start": round(word.start, 3), "end": round(word.end, 3)}


def verbose_json(
    transcript: Transcript,
    *,
    task: str,
    language: str,
    duration: float,
    temperature: float,
    segments: bool,
    words: bool,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "task": task,
        "language": language,
        "duration": round(duration, 3),
        "text": transcript.text,
    }
    if segments:
        body["segments"] = [_segment(index, s, temperature) for index, s in enumerate(transcript.segments)]
    if words:
        body["words"] = [_word(word) for word in transcript.words]
    body["usage"] = duration_usage(duration)
    return body


def duration_usage(duration: float) -> dict[str, Any]:
    return {"type": "duration", "seconds": round(duration, 3)}


def token_usage(transcript: Transcript, audio_tokens: int) -> dict[str, Any]:
    """The done event's usage: the encoder's positions as audio tokens, the prompt's as
    text tokens, what the decoder wrote as output."""
    inputs = audio_tokens + transcript.prompt_tokens
    return {
        "type": "tokens",
        "input_tokens": inputs,
        "input_token_details": {"text_tokens": transcript.prompt_tokens, "audio_tokens": audio_tokens},
        "output_tokens": transcript.output_tokens,
        "total_tokens": inputs + transcript.output_tokens,
    }
