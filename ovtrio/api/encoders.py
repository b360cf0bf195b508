"""What the embeddings and rerank routes share: finding the encoder a request names, and
turning what an encoder raises into OpenAI's error shape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import trio
from quart import Response

from ovtrio.api import leases
from ovtrio.api.context import model_registry
from ovtrio.api.errors import APIError, invalid, model_not_found, shutting_down
from ovtrio.embedding.service import EmbeddingWork, EncoderService, RerankWork
from ovtrio.embedding.worker import EncoderUnavailable, Job
from ovtrio.serving.kinds import Encoder, is_text_encoder

# Replies bigger than this many numbers are serialized in a worker thread: a few hundred
# vectors would hold up the event loop for milliseconds, and this many take about half of
# one (measured in docs/benchmarks.md#the-embedding-model).
_JSON_IN_THREAD = 16 * 1024


async def encoder_for(name: str | None, kind: str, missing: str) -> EncoderService:
    """The encoder of `kind` that `name` names (None: the first); `missing` is the 404's
    message when the server has none of that kind."""
    encoder = await served_model_of_kind(name, kind, missing)
    assert is_text_encoder(encoder)
    return encoder


async def served_model_of_kind(name: str | None, kind: str, missing: str) -> Encoder:
    """The model of `kind` (embedding, rerank, transcription) that `name` names (see
    encoder_for)."""
    registry = model_registry()
    if registry.shutdown.draining.is_set():
        raise shutting_down()
    encoder = await registry.find_encoder(name, kind)
    if encoder is not None:
        leases.hold(encoder.take_lease())  # in use until the response has ended
        return encoder
    if name is None:
        raise APIError(404, missing, param="model", code="model_not_found")
    if await registry.find(name) is None and not any(e.name == name for e in registry.encoders):
        raise model_not_found(name)
    served = [f"'{e.name}'" for e in registry.encoders if e.kind == kind]
    where = f"; this server's are {', '.join(served)}" if served else f". {missing}"
    raise invalid(f"The model '{name}' is not a {kind} model{where}.", "model", "model_kind_mismatch")


async def run(encoder: EncoderService, work: EmbeddingWork | RerankWork, size: int) -> Job:
    """`work` computed by `encoder`; an encoder that cannot serve as an APIError (an
    InputError, a FieldError, and Overloaded pass on: the app maps them to a 400 and a
    429)."""
    try:
        return await encoder.submit(work, size)
    except EncoderUnavailable as exc:
        if exc.code == "shutting_down":
            raise shutting_down(cut=True) from None
        raise APIError(503, str(exc), code=exc.code, retry_after=exc.retry_after) from None


async def json_reply(build: Callable[[], dict[str, Any]], numbers: int) -> Response:
    """The body `build` makes, as a JSON response; built and serialized off the event
    loop when it holds more than a few thousand numbers.

    numpy arrays in the body are written by orjson as they are, each float32 as the
    shortest decimal that reads back as the same float32: a small fraction of the time
    and about half the bytes of `json.dumps(vector.tolist())`, which writes the digits
    of the float64 each value widens to, on the event loop (measured in
    docs/benchmarks.md#embeddings)."""

    def text() -> bytes:
        return orjson.dumps(build(), option=orjson.OPT_SERIALIZE_NUMPY)

    body = await trio.to_thread.run_sync(text) if numbers > _JSON_IN_THREAD else text()
    return Response(body, status=200, mimetype="application/json")
