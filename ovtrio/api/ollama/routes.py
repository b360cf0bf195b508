"""Ollama's routes: POST /api/chat, /api/generate, /api/embed, /api/embeddings and
/api/show; GET /api/tags, /api/ps and /api/version; `/` as Ollama answers a client that
probes it; and the model management routes (pull, push, create, copy, delete, blobs),
refused: models come from the models folder here."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from quart import Blueprint, Response

from ovtrio.api.context import generation_model, model_registry, model_service
from ovtrio.api.embeddings import NO_EMBEDDER
from ovtrio.api.encoders import encoder_for, json_reply, run
from ovtrio.api.errors import REQUEST_ERRORS, APIError, invalid
from ovtrio.api.generation import parse_body
from ovtrio.api.ollama import catalog, names
from ovtrio.api.ollama.prepare import Prepared, chat_body, chat_messages, ollama_names, prepare, prompt_messages
from ovtrio.api.ollama.protocol import (
    ChatRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
    GenerationBody,
    ShowRequest,
)
from ovtrio.api.ollama.stream import line, ndjson_response, record_stream, unary_reply
from ovtrio.api.ollama.writer import Clock, OllamaWriter, done_record
from ovtrio.embedding.service import EmbeddingWork
from ovtrio.serving.service import ServingModel

blueprint = Blueprint("ollama", __name__)

RUNNING = "Ollama is running"


def probe_answer() -> Response:
    """What Ollama answers on `/`, which its clients and apps probe to find it."""
    return Response(RUNNING, mimetype="text/plain")


@blueprint.route("/", methods=["GET", "HEAD"])
async def root() -> Response:
    # With the playground on, its page (registered first) answers `/`: a browser gets
    # the page, any other client this same answer (playground/routes.py).
    return probe_answer()


async def _model(model_id: str, body: GenerationBody, clock: Clock) -> ServingModel:
    """The ready model (waited for: the load_duration), with room for the request."""
    since = time.monotonic()
    model = await _thinking_model(model_id, body)
    clock.model_ready(since)
    model.scheduler.check_capacity()
    return model


async def _thinking_model(model_id: str, body: GenerationBody) -> ServingModel:
    """The ready model; one asked to think that does not is refused, as Ollama refuses
    it (its CLI preloads a model with `think` set to learn this before the chat)."""
    model = await generation_model(model_id, body.keep_alive)
    if body.think not in (None, False) and not model.reasoning:
        raise invalid(
            f"Invalid value for 'think': the model '{model.name}' does not think (its chat template opens no"
            " reasoning); leave 'think' out or false.",
            "think",
            "unsupported_parameter",
        )
    return model


async def _load_or_unload(body: GenerationBody, model_id: str, chat: bool) -> Any:
    """A request with nothing to generate: loads the model, or with keep_alive 0 unloads it."""
    if body.keep_alive == 0:
        service = await model_service(model_id)
        await model_registry().residency.unload(service, "request")
        record = done_record(body.model, chat, "unload")
    else:
        await _thinking_model(model_id, body)
        record = done_record(body.model, chat, "load")
    return ndjson_response(line(record)) if body.stream else record


async def _answer(model: ServingModel, body: GenerationBody, ready: Prepared, chat: bool, clock: Clock) -> Any:
    writer = OllamaWriter(body.model, chat, clock)
    try:
        if body.stream:
            return await record_stream(model.scheduler, ready, writer)
        return await unary_reply(model.scheduler, ready, writer)
    except REQUEST_ERRORS as exc:  # the engine's refusal as the request is added, named as the client sent it
        raise ollama_names(exc, "messages" if chat else "prompt") from None


@blueprint.post("/api/chat")
async def chat() -> Any:
    clock = Clock()
    body = await parse_body(ChatRequest)
    model_id = await names.model_id(body.model)
    if not body.messages:
        return await _load_or_unload(body, model_id, chat=True)
    model = await _model(model_id, body, clock)
    try:
        request_body = chat_body(body, model_id, chat_messages(body.messages))
        ready = await prepare(model, request_body, request_body.messages)
    except REQUEST_ERRORS as exc:
        raise ollama_names(exc) from None
    return await _answer(model, body, ready, True, clock)


@blueprint.post("/api/generate")
async def generate() -> Any:
    clock = Clock()
    body = await parse_body(GenerateRequest)
    model_id = await names.model_id(body.model)
    if not body.prompt and not body.images:
        return await _load_or_unload(body, model_id, chat=False)
    model = await _model(model_id, body, clock)
    try:
        request_body = chat_body(body, model_id, prompt_messages(body))
        ready = await prepare(model, request_body, request_body.messages, raw=body.raw)
    except REQUEST_ERRORS as exc:
        raise ollama_names(exc, "prompt") from None
    return await _answer(model, body, ready, False, clock)


# ---- embeddings ------------------------------------------------------------------------


async def _embedded(model_name: str, texts: list[str], truncate: bool, keep_alive: float | None) -> tuple[Any, int]:
    """The vectors of `texts` and the tokens they took (none for no texts, once the
    model is found: an unknown one is a 404 all the same)."""
    encoder = await encoder_for(await names.model_id(model_name), "embedding", NO_EMBEDDER)
    encoder.keep_alive = keep_alive  # as a generation model takes each request's (None: the server's rule)
    if not texts:
        return np.zeros((0, 0), dtype=np.float32), 0
    if len(texts) > encoder.settings.max_inputs_per_request:
        raise invalid(
            f"Invalid value for 'input': this server takes at most {encoder.settings.max_inputs_per_request} inputs"
            f" in one request, not {len(texts)}.",
            "input",
        )
    for index, text in enumerate(texts):
        if not text:
            param = "input" if len(texts) == 1 else f"input[{index}]"
            raise invalid(f"Invalid value for '{param}': it must not be empty.", param)
    params = ["input"] if len(texts) == 1 else [f"input[{index}]" for index in range(len(texts))]
    job = await run(encoder, EmbeddingWork(list(texts), -1 if truncate else None, params), len(texts))
    return job.result, job.tokens


@blueprint.post("/api/embed")
async def embed() -> Any:
    began = time.monotonic()
    body = await parse_body(EmbedRequest)
    if body.dimensions is not None:
        raise invalid(
            "Invalid value for 'dimensions': this server's embedding models give vectors of one size only (they"
            " were not trained to be cut shorter); leave 'dimensions' out.",
            "dimensions",
            "unsupported_parameter",
        )
    texts = [body.input] if isinstance(body.input, str) else list(body.input)
    vectors, tokens = await _embedded(body.model, texts, body.truncate, body.keep_alive)
    if not texts:
        return {"model": body.model, "embeddings": []}  # as Ollama answers an empty list
    # Ollama's /api/embed gives unit vectors.
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = (vectors / np.where(norms == 0, 1, norms)).astype(np.float32)

    def reply() -> dict[str, Any]:
        return {
            "model": body.model,
            "embeddings": list(unit),
            "total_duration": round((time.monotonic() - began) * 1e9),
            "prompt_eval_count": tokens,
        }

    return await json_reply(reply, unit.size)


@blueprint.post("/api/embeddings")
async def embeddings() -> Any:
    body = await parse_body(EmbeddingsRequest)
    vectors, _ = await _embedded(body.model, [body.prompt] if body.prompt else [], True, body.keep_alive)
    if not body.prompt:
        return {"embedding": []}  # as Ollama answers an empty prompt
    return await json_reply(lambda: {"embedding": vectors[0]}, vectors.size)


# ---- the catalog -----------------------------------------------------------------------


@blueprint.get("/api/tags")
async def tags() -> Any:
    return await catalog.tags()


@blueprint.get("/api/ps")
async def processes() -> Any:
    return catalog.processes()


@blueprint.post("/api/show")
async def show() -> Any:
    body = await parse_body(ShowRequest)
    return await catalog.show(await names.model_id(body.named()))


@blueprint.get("/api/version")
async def version() -> Any:
    return catalog.version()


# ---- model management: not here --------------------------------------------------------

FROM_THE_FOLDER = (
    "This server does not {what} models: it serves the models of its models folder (--models-dir) and those"
    " it was started with. Copy a model's files into the folder (GET /api/tags lists it then)."
)


def _refused(what: str) -> APIError:
    return APIError(400, FROM_THE_FOLDER.format(what=what), code="unsupported_operation")


@blueprint.post("/api/pull")
async def pull() -> Any:
    raise _refused("pull")


@blueprint.post("/api/push")
async def push() -> Any:
    raise _refused("push")


@blueprint.post("/api/create")
async def create() -> Any:
    raise _refused("create")


@blueprint.post("/api/copy")
async def copy() -> Any:
    raise _refused("copy")


@blueprint.delete("/api/delete")
async def delete() -> Any:
    raise _refused("delete")


@blueprint.route("/api/blobs/<path:digest>", methods=["HEAD", "POST"])
async def blobs(digest: str) -> Any:
    raise _refused("take blobs of")
