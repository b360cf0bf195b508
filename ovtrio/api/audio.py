"""POST /v1/audio/transcriptions and /v1/audio/translations (and /v3): OpenAI's audio API
on a served Whisper model (ovtrio/audio/).

The request is a multipart form, as OpenAI's SDK sends it: `file` (flac, m4a, mp3, mp4,
mpeg, mpga, oga, ogg, wav or webm), `model`, `language` (an ISO code the model knows;
transcriptions only), `prompt`, `temperature` (0 to 1), `response_format` (json, text,
srt, vtt, verbose_json), `timestamp_granularities[]` (segment, word; with verbose_json)
and `stream` (OpenAI's `transcript.text.delta` and `transcript.text.done` events, with
json or text). A place in the model's queue is taken before the body is read
(ovtrio/api/audio_admission.py): a full queue is a 429 that reads nothing of the file.
Everything is checked, the file decoded (in a worker thread) and the request queued
before the response starts: what is wrong with it is a 400 naming the field.
"""

from __future__ import annotations

import math
from typing import Any

import orjson
import trio
from quart import Blueprint, Response, request
from werkzeug.datastructures import MultiDict

from ovtrio.api import audio_form as forms
from ovtrio.api.audio_admission import Place
from ovtrio.api.audio_stream import streamed, unavailable
from ovtrio.api.context import model_registry, upload_admission
from ovtrio.api.encoders import served_model_of_kind
from ovtrio.api.errors import APIError, invalid
from ovtrio.audio import transcripts
from ovtrio.audio.decode import Audio, decode
from ovtrio.audio.engine import Options, Task, Transcript, language_name
from ovtrio.audio.service import TranscriptionService, TranscriptionWork
from ovtrio.embedding.worker import EncoderUnavailable, Job
from ovtrio.serving.kinds import is_transcriber

blueprint = Blueprint("audio", __name__)

NO_MODEL = (
    "No transcription model is served. Start the server with --transcription-model FOLDER, a Whisper model"
    " exported with `optimum-cli export openvino --model openai/whisper-base FOLDER`."
)
MAX_PROMPT_CHARACTERS = 4096

_TRANSCRIPTION_FIELDS = {
    "model",
    "language",
    "prompt",
    "temperature",
    "response_format",
    "timestamp_granularities",
    "timestamp_granularities[]",
    "stream",
    "include",
    "include[]",
    "chunking_strategy",
}
_TRANSLATION_FIELDS = {"model", "prompt", "temperature", "response_format"}


@blueprint.post("/v1/audio/transcriptions")
@blueprint.post("/v3/audio/transcriptions")
async def transcriptions() -> Any:
    return await _serve("transcribe")


@blueprint.post("/v1/audio/translations")
@blueprint.post("/v3/audio/translations")
async def translations() -> Any:
    return await _serve("translate")


async def _serve(task: Task) -> Response:
    boundary = _boundary()
    registry = model_registry()
    served = [encoder for encoder in registry.encoders if is_transcriber(encoder)]
    if not served:  # none known yet (a models_dir may hold one): nothing to hold a place in
        return await _serve_form(task, boundary, None)
    with upload_admission().admitted(served) as place:  # before the body is read (audio_admission.py)
        return await _serve_form(task, boundary, place)


async def _serve_form(task: Task, boundary: bytes, place: Place | None) -> Response:
    body = await request.get_data(as_text=False)
    assert isinstance(body, (bytes, bytearray))
    try:
        form = await trio.to_thread.run_sync(forms.parse, body, boundary)
    except forms.FormError as exc:
        raise invalid(str(exc), exc.param) from None
    fields = form.fields
    _check_names(fields, _TRANSCRIPTION_FIELDS if task == "transcribe" else _TRANSLATION_FIELDS)
    service = await served_model_of_kind(_one(fields, "model"), "transcription", NO_MODEL)
    assert is_transcriber(service)
    response_format = _one(fields, "response_format") or "json"
    if response_format not in transcripts.FORMATS:
        raise invalid(
            f"Invalid value for 'response_format': '{response_format}'; it must be one of"
            f" {', '.join(transcripts.FORMATS)}.",
            "response_format",
        )
    stream = _flag(fields, "stream")
    if stream and response_format not in ("json", "text"):
        raise invalid(
            f"Streaming ('stream': true) gives text events: it takes response_format json or text, not"
            f" '{response_format}'.",
            "stream",
        )
    options = _options(service, fields, task, response_format)
    upload = form.upload
    if upload is None or upload.name != "file":
        raise invalid("Missing required parameter: 'file' (the audio file, as a form upload).", "file")
    limit = service.settings.audio_max_bytes
    if len(upload.data) > limit:
        raise APIError(
            413,
            f"The file is {len(upload.data)} bytes, larger than the {limit} bytes this server takes"
            " (--audio-max-bytes).",
            param="file",
            code="request_too_large",
        )
    audio = await _decoded(service, upload.data)

    def enqueued(service: TranscriptionService, work: TranscriptionWork) -> Job:
        try:
            return _enqueued(service, work)
        finally:
            if place is not None:
                place.queued()

    if stream:
        return streamed(service, audio, options, enqueued)
    transcript = await _run(service, enqueued(service, TranscriptionWork(audio, options)))
    return _reply(service, transcript, audio, options, response_format)


def _boundary() -> bytes:
    try:
        return forms.boundary_of(request.headers.get("Content-Type"))
    except forms.FormError as exc:
        raise invalid(str(exc), exc.param) from None


def _check_names(fields: MultiDict[str, str], known: set[str]) -> None:
    for name in fields:
        if name not in known:
            raise invalid(f"Unrecognized request argument supplied: {name}", name, "unknown_parameter")


def _one(fields: MultiDict[str, str], name: str) -> str | None:
    values = fields.getlist(name)
    if len(values) > 1:
        raise invalid(f"Invalid value for '{name}': it was sent {len(values)} times; send it once.", name)
    return values[0] if values else None


def _flag(fields: MultiDict[str, str], name: str) -> bool:
    value = _one(fields, name)
    if value is None or value.lower() in ("false", "0", ""):
        return False
    if value.lower() in ("true", "1"):
        return True
    raise invalid(f"Invalid value for '{name}': '{value}'; it must be true or false.", name)


def _options(service: TranscriptionService, fields: MultiDict[str, str], task: Task, response_format: str) -> Options:
    language = _language(service, _one(fields, "language"))
    if task == "translate" and not service.multilingual:
        raise invalid(
            f"The model '{service.name}' is English-only: it cannot translate; serve a multilingual Whisper model.",
            "model",
            "unsupported_task",
        )
    prompt = _one(fields, "prompt")
    if prompt is not None and len(prompt) > MAX_PROMPT_CHARACTERS:
        raise invalid(
            f"Invalid value for 'prompt': {len(prompt)} characters, more than {MAX_PROMPT_CHARACTERS} (Whisper reads"
            " only its last 223 tokens).",
            "prompt",
        )
    temperature = _temperature(_one(fields, "temperature"))
    granularities = fields.getlist("timestamp_granularities[]") + fields.getlist("timestamp_granularities")
    for value in granularities:
        if value not in ("word", "segment"):
            raise invalid(
                f"Invalid value for 'timestamp_granularities[]': '{value}'; it must be word or segment.",
                "timestamp_granularities[]",
            )
    if granularities and response_format != "verbose_json":
        raise invalid(
            "'timestamp_granularities[]' needs response_format verbose_json (the only format that carries them).",
            "timestamp_granularities[]",
        )
    words = "word" in granularities
    if words and not service.words_available:
        raise invalid(
            f"The model '{service.name}' gives no word timestamps: its generation_config.json has no alignment_heads.",
            "timestamp_granularities[]",
            "unsupported_value",
        )
    if words and temperature > 0:
        raise invalid(
            "Word timestamps are given for greedy decoding only ('temperature': 0): their text is checked before"
            " the words are computed, which a sampled second pass would not keep.",
            "temperature",
            "unsupported_value",
        )
    for name in ("include", "include[]"):
        for value in fields.getlist(name):
            raise invalid(f"Invalid value for 'include[]': '{value}' is not supported by Whisper models.", name)
    strategy = _one(fields, "chunking_strategy")
    if strategy not in (None, "auto"):
        raise invalid(
            "Invalid value for 'chunking_strategy': only 'auto' is supported (30 s windows).", "chunking_strategy"
        )
    segments = response_format in ("srt", "vtt") or (
        response_format == "verbose_json" and (not granularities or "segment" in granularities)
    )
    return Options(task, language, prompt or None, temperature, segments=segments, words=words)


def _language(service: TranscriptionService, value: str | None) -> str | None:
    if value is None or value == "":
        return None
    code = value.strip().lower().strip("<|>")
    if not service.multilingual:
        if code == "en":
            return None  # English-only models take no language token
        raise invalid(
            f"Invalid value for 'language': '{value}'; the model '{service.name}' is English-only.", "language"
        )
    if code not in service.languages:
        raise invalid(
            f"Invalid value for 'language': '{value}' is not a language the model '{service.name}' knows (ISO-639-1"
            f" codes such as {', '.join(service.languages[:5])}).",
            "language",
            "unsupported_language",
        )
    return code


def _temperature(value: str | None) -> float:
    if value is None or value == "":
        return 0.0
    try:
        temperature = float(value)
    except ValueError:
        raise invalid(f"Invalid value for 'temperature': '{value}' is not a number.", "temperature") from None
    if not 0.0 <= temperature <= 1.0 or math.isnan(temperature):
        raise invalid(f"Invalid value for 'temperature': {value}; it must be between 0 and 1.", "temperature")
    return temperature


async def _decoded(service: TranscriptionService, data: bytearray) -> Audio:
    max_seconds = service.settings.audio_max_seconds
    return await trio.to_thread.run_sync(decode, data, max_seconds, limiter=service.decodes)  # AudioError: a 400


def _enqueued(service: TranscriptionService, work: TranscriptionWork) -> Job:
    try:
        return service.enqueue(work)
    except EncoderUnavailable as exc:
        raise unavailable(exc) from None


async def _run(service: TranscriptionService, job: Job) -> Transcript:
    try:
        return await service.result(job)
    except EncoderUnavailable as exc:
        raise unavailable(exc) from None


def _reply(
    service: TranscriptionService, transcript: Transcript, audio: Audio, options: Options, response_format: str
) -> Response:
    if response_format == "text":
        return Response(transcript.text + "\n", mimetype="text/plain")
    if response_format == "srt":
        return Response(transcripts.srt(transcript.segments), mimetype="text/plain")
    if response_format == "vtt":
        return Response(transcripts.vtt(transcript.segments), mimetype="text/vtt")
    if response_format == "verbose_json":
        language = "english" if options.task == "translate" else language_name(transcript.language)
        body = transcripts.verbose_json(
            transcript,
            task=options.task,
            language=language,
            duration=audio.seconds,
            temperature=options.temperature,
            segments=options.segments,
            words=options.words,
        )
    elif options.task == "translate":
        body = {"text": transcript.text}
    else:
        body = {"text": transcript.text, "usage": transcripts.duration_usage(audio.seconds)}
    return Response(orjson.dumps(body), mimetype="application/json")
