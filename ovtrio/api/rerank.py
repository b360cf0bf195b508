"""POST /v1/rerank (and /v3/rerank, /rerank): scores documents against a query with a
cross-encoder, in the shape vLLM, llama-server and Jina/Cohere clients use: `query`,
`documents` (texts or {"text": ...}), `top_n`, `return_documents` ->
`results[{index, relevance_score, document}]`, best first, and `usage`."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field
from quart import Blueprint

from ovtrio.api.encoders import encoder_for, json_reply, run
from ovtrio.api.errors import invalid
from ovtrio.api.generation import parse_body
from ovtrio.api.protocol import Body
from ovtrio.embedding.service import RerankWork
from ovtrio.parsing.ids import new_id

blueprint = Blueprint("rerank", __name__)

NO_RERANKER = (
    "No rerank model is served. Start the server with --rerank-model FOLDER, a cross-encoder exported with"
    " `optimum-cli export openvino --task text-classification --model ID FOLDER` (or list one in the config file)."
)


class Document(Body):
    text: str


class RerankRequest(Body):
    model: str | None = None
    query: str
    documents: list[str | Document]
    top_n: Annotated[int, Field(ge=1)] | None = None
    return_documents: bool = True


@blueprint.post("/rerank")
@blueprint.post("/v1/rerank")
@blueprint.post("/v3/rerank")
async def rerank() -> Any:
    body = await parse_body(RerankRequest)
    encoder = await encoder_for(body.model, "rerank", NO_RERANKER)
    if not body.query:
        raise invalid("Invalid value for 'query': it must not be empty.", "query")
    if not body.documents:
        raise invalid("Invalid value for 'documents': it must not be an empty list.", "documents")
    limit = encoder.settings.max_inputs_per_request
    if len(body.documents) > limit:
        raise invalid(
            f"Invalid value for 'documents': this server takes at most {limit} documents in one request,"
            f" not {len(body.documents)}.",
            "documents",
        )
    texts = [doc if isinstance(doc, str) else doc.text for doc in body.documents]
    for index, text in enumerate(texts):
        if not text:
            raise invalid(f"Invalid value for 'documents[{index}]': it must not be empty.", f"documents[{index}]")
    job = await run(encoder, RerankWork(body.query, texts), len(texts))
    scores: list[tuple[int, float]] = job.result
    if body.top_n is not None:
        scores = scores[: body.top_n]
    results = []
    for index, score in scores:
        result: dict[str, Any] = {"index": index, "relevance_score": score}
        if body.return_documents:
            result["document"] = {"text": texts[index]}
        results.append(result)
    reply = {
        "id": new_id("rerank-"),
        "model": encoder.name,
        "results": results,
        "usage": {"prompt_tokens": job.tokens, "total_tokens": job.tokens},
    }
    return await json_reply(lambda: reply, len(results))
