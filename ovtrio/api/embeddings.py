"""POST /v1/embeddings (and /v3/embeddings): OpenAI's embeddings API on the served
embedding model (the embedded all-MiniLM-L6-v2 unless configured otherwise).

`input` is a text, a list of texts, a list of token ids or a list of those; ids are the
model's own tokenizer's without its special tokens, and must be what it makes of their
text, since the engine takes text. Vectors come as floats or as base64 of little-endian
float32 (what the openai SDK asks for by default). An input longer than the model's limit
is refused naming it, unless `truncate_prompt_tokens` (vLLM's field; -1: the model's
limit) asks to cut it: never a silent wrong vector.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field
from quart import Blueprint

from ovtrio.api.encoders import encoder_for, json_reply, run
from ovtrio.api.errors import invalid
from ovtrio.api.generation import parse_body
from ovtrio.api.protocol import Body
from ovtrio.embedding.service import EmbeddingWork

blueprint = Blueprint("embeddings", __name__)

NO_EMBEDDER = (
    "No embedding model is served: the embedded one is off (--no-embeddings). Serve one with --embedding-model"
    " FOLDER (exported with `optimum-cli export openvino --task feature-extraction --model ID FOLDER`)."
)

TokenIds = list[Annotated[int, Field(ge=0)]]


class EmbeddingsRequest(Body):
    model: str | None = None
    input: str | list[str] | TokenIds | list[TokenIds]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None


def _inputs(body: EmbeddingsRequest, limit: int) -> list[str | list[int]]:
    raw = body.input
    if isinstance(raw, str):
        if not raw:
            raise invalid("Invalid value for 'input': it must not be an empty string.", "input")
        return [raw]
    if not raw:
        raise invalid("Invalid value for 'input': it must not be an empty list.", "input")
    if all(isinstance(item, int) for item in raw):
        return [list(raw)]  # type: ignore[arg-type]
    if len(raw) > limit:
        raise invalid(
            f"Invalid value for 'input': this server takes at most {limit} inputs in one request, not {len(raw)}.",
            "input",
        )
    for index, item in enumerate(raw):
        if not item:
            raise invalid(f"Invalid value for 'input[{index}]': it must not be empty.", f"input[{index}]")
    return list(raw)  # type: ignore[arg-type]


def _encoded(vector: np.ndarray, encoding: str) -> Any:
    """base64 text, or the float32 array itself (json_reply writes it)."""
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return np.ascontiguousarray(vector, dtype=np.float32)


@blueprint.post("/v1/embeddings")
@blueprint.post("/v3/embeddings")
async def embeddings() -> Any:
    body = await parse_body(EmbeddingsRequest)
    encoder = await encoder_for(body.model, "embedding", NO_EMBEDDER)
    if body.dimensions is not None:
        raise invalid(
            f"Invalid value for 'dimensions': the model '{encoder.name}' gives vectors of one size only"
            " (it was not trained to be cut shorter); leave 'dimensions' out.",
            "dimensions",
            "unsupported_parameter",
        )
    inputs = _inputs(body, encoder.settings.max_inputs_per_request)
    truncate = body.truncate_prompt_tokens
    if truncate == 0:
        raise invalid(
            "Invalid value for 'truncate_prompt_tokens': it must be -1 or at least 1.", "truncate_prompt_tokens"
        )
    names = (
        ["input"]
        if isinstance(body.input, str) or inputs == [body.input]
        else [f"input[{index}]" for index in range(len(inputs))]
    )
    job = await run(encoder, EmbeddingWork(inputs, truncate, names), len(inputs))
    vectors: np.ndarray = job.result

    def reply() -> dict[str, Any]:
        data = [
            {"object": "embedding", "index": index, "embedding": _encoded(vector, body.encoding_format)}
            for index, vector in enumerate(vectors)
        ]
        usage = {"prompt_tokens": job.tokens, "total_tokens": job.tokens}
        return {"object": "list", "data": data, "model": encoder.name, "usage": usage}

    return await json_reply(reply, vectors.size)
