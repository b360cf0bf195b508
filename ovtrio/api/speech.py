"""POST /v1/audio/speech (and /v3): OpenAI's speech API on a served text-to-speech model
(ovtrio/speech/).

The body is JSON, as OpenAI's SDK sends it: `model`, `input` (at most 4096 characters),
`voice` (a voice's name, or `{"id": name}`: ovtrio/speech/voices.py), `response_format`
(mp3, the default, opus, aac, flac, wav or pcm), `speed` (0.25 to 4: each sentence
time-stretched, its pitch kept, ovtrio/speech/tempo.py),
`instructions` (taken and ignored: SpeechT5 has no way to follow them) and
`stream_format` (`audio`, the default: the file's bytes, chunked as each sentence is
spoken; `sse`: `speech.audio.delta` events of base64 audio, then `speech.audio.done`
with the usage).

The text is spoken a sentence at a time (ovtrio/speech/pieces.py): each sentence's audio
is encoded (in a worker thread) and sent as soon as it is spoken, before the next one is.
Everything is checked, the model loaded and the request queued before the response
starts, so what is wrong is a 4xx naming the field (a full queue a 429) and a model that
cannot load a 503; a client that leaves stops its request before its next sentence.
"""

from __future__ import annotations

import base64
import math
from collections.abc import AsyncGenerator
from functools import partial
from typing import Annotated, Any

import orjson
import trio
from pydantic import Field
from quart import Blueprint, Response

from ovtrio.api.audio_stream import unavailable
from ovtrio.api.encoders import served_model_of_kind
from ovtrio.api.errors import APIError, api_error, invalid
from ovtrio.api.generation import parse_body
from ovtrio.api.job_pieces import pieces_then_outcome
from ovtrio.api.protocol import Body
from ovtrio.api.sse import HEADERS
from ovtrio.embedding.worker import EncoderUnavailable, Job
from ovtrio.serving.kinds import is_speaker
from ovtrio.speech.encode import FORMATS, MEDIA_TYPES, Encoder
from ovtrio.speech.engine import Spoken
from ovtrio.speech.pieces import pieces
from ovtrio.speech.service import SpeechService, SpeechTotals, SpeechWork
from ovtrio.speech.tempo import stretched

blueprint = Blueprint("speech", __name__)

MAX_INPUT_CHARACTERS = 4096  # OpenAI's bound
NO_SPEAKER = (
    "No text-to-speech model is served. Start the server with --speech-model FOLDER, a SpeechT5 model exported"
    " with `optimum-cli export openvino --model microsoft/speecht5_tts --model-kwargs"
    ' \'{"vocoder": "microsoft/speecht5_hifigan"}\' FOLDER`.'
)
STREAM_FORMATS = ("audio", "sse")


class CustomVoice(Body):
    id: str


class SpeechRequest(Body):
    model: str | None = None
    input: str
    voice: str | CustomVoice
    instructions: Annotated[str, Field(max_length=MAX_INPUT_CHARACTERS)] | None = None
    response_format: str = "mp3"
    speed: float = 1.0
    stream_format: str = "audio"


@blueprint.post("/v1/audio/speech")
@blueprint.post("/v3/audio/speech")
async def speech() -> Any:
    body = await parse_body(SpeechRequest)
    assert isinstance(body, SpeechRequest)
    text = _pieces(body.input)
    _check_choice(body.response_format, FORMATS, "response_format")
    _check_choice(body.stream_format, STREAM_FORMATS, "stream_format")
    _check_speed(body.speed)
    service = await served_model_of_kind(body.model, "speech", NO_SPEAKER)
    assert is_speaker(service)
    embedding = _voice(service, body.voice)
    refusal = await service.settled()  # loaded now: a model that cannot load is a 503, not a cut stream
    if refusal is not None:
        raise APIError(503, str(refusal), code="model_unavailable", retry_after=refusal.retry_after)
    if service.failure is not None:
        raise APIError(503, f"The model '{service.name}' failed to load: {service.failure}", code="model_unavailable")
    send, receive = trio.open_memory_channel[Spoken](math.inf)
    token = trio.lowlevel.current_trio_token()

    def deliver(spoken: Spoken) -> None:
        try:
            send.send_nowait(spoken)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass  # the response has ended: its client left

    def on_piece(spoken: Spoken) -> None:  # in the worker thread
        try:
            token.run_sync_soon(deliver, spoken)
        except trio.RunFinishedError:
            pass

    try:
        job = service.enqueue(SpeechWork(text, embedding, on_piece))  # Overloaded: a 429
    except EncoderUnavailable as exc:
        raise unavailable(exc) from None
    sse = body.stream_format == "sse"
    audio = _Audio(service, job, body.response_format, body.speed, sse, send, receive)
    if sse:
        return Response(audio, mimetype="text/event-stream", headers=HEADERS)
    return Response(audio, mimetype=MEDIA_TYPES[body.response_format])


def _pieces(text: str) -> list[str]:
    if len(text) > MAX_INPUT_CHARACTERS:
        raise invalid(
            f"Invalid value for 'input': {len(text)} characters, more than the {MAX_INPUT_CHARACTERS} this server"
            " speaks in one request; send the rest in another.",
            "input",
            "string_above_max_length",
        )
    found = pieces(text)
    if not found:
        raise invalid("Invalid value for 'input': it must not be empty (nothing to speak).", "input")
    return found


def _check_choice(value: str, choices: tuple[str, ...], name: str) -> None:
    if value not in choices:
        raise invalid(f"Invalid value for '{name}': '{value}'; it must be one of {', '.join(choices)}.", name)


def _check_speed(speed: float) -> None:
    if not 0.25 <= speed <= 4.0:
        raise invalid(f"Invalid value for 'speed': {speed}; it must be between 0.25 and 4.0.", "speed")


def _voice(service: SpeechService, voice: str | CustomVoice) -> Any:
    name = voice if isinstance(voice, str) else voice.id
    param = "voice" if isinstance(voice, str) else "voice.id"
    try:
        return service.voices.named(name)
    except KeyError:
        raise invalid(
            f"Invalid value for '{param}': '{name}' is not a voice of the model '{service.name}'; its voices are"
            f" {', '.join(service.voices.names)} (OpenAI's voice names speak in the default one).",
            param,
            "unknown_voice",
        ) from None


def _event(event: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\n\n"


class _Audio:
    """The response body: each piece's audio as it is spoken (the container's bytes, or
    SSE delta events), then what the encoder kept back (and the done event). Closed
    early (the client left), the job is given up: it stops before its next piece."""

    def __init__(
        self,
        service: SpeechService,
        job: Job,
        response_format: str,
        speed: float,
        sse: bool,
        send: trio.MemorySendChannel[Spoken],
        receive: trio.MemoryReceiveChannel[Spoken],
    ) -> None:
        self._job = job
        self._chunks = self._encoded(service, job, response_format, speed, sse, send, receive)

    def __aiter__(self) -> _Audio:
        return self

    async def __anext__(self) -> bytes:
        return await self._chunks.__anext__()

    async def aclose(self) -> None:
        self._job.abandoned = True
        await self._chunks.aclose()

    async def _encoded(
        self,
        service: SpeechService,
        job: Job,
        response_format: str,
        speed: float,
        sse: bool,
        send: trio.MemorySendChannel[Spoken],
        receive: trio.MemoryReceiveChannel[Spoken],
    ) -> AsyncGenerator[bytes, None]:
        encoder: Encoder | None = None
        spoken_count = 0
        first_sent = False
        items: trio.abc.ReceiveChannel[Spoken | SpeechTotals | Exception]
        async with pieces_then_outcome(partial(service.result, job), send, receive) as items:
            async for item in items:
                if isinstance(item, Spoken):
                    if encoder is None:
                        encoder = Encoder(response_format, item.sample_rate)
                    spoken_count += 1
                    last = spoken_count == job.size
                    data = await trio.to_thread.run_sync(_written, encoder, item, speed, last, limiter=service.encodes)
                    if data:
                        yield _event({"type": "speech.audio.delta", "audio": _b64(data)}) if sse else data
                        if not first_sent:
                            # Sent (the server asks for the next chunk once it has written
                            # this one): how far the model had got by then.
                            first_sent = True
                            service.observer.first_audio(job.progress.pieces)
                elif isinstance(item, SpeechTotals):
                    rest = b""
                    if encoder is not None:
                        rest = await trio.to_thread.run_sync(encoder.finish, limiter=service.encodes)
                    if sse:
                        if rest:
                            yield _event({"type": "speech.audio.delta", "audio": _b64(rest)})
                        usage = {
                            "input_tokens": item.input_tokens,
                            "output_tokens": item.output_steps,
                            "total_tokens": item.input_tokens + item.output_steps,
                        }
                        yield _event({"type": "speech.audio.done", "usage": usage})
                    elif rest:
                        yield rest
                else:
                    if not sse:
                        raise item  # the audio cannot carry an error: the response is cut
                    error = unavailable(item) if isinstance(item, EncoderUnavailable) else api_error(item)
                    yield _event(error.body())


def _written(encoder: Encoder, spoken: Spoken, speed: float, last: bool) -> bytes:
    """A piece's bytes, at `speed` (in a worker thread)."""
    return encoder.add(stretched(spoken.samples, spoken.sample_rate, speed), last)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
