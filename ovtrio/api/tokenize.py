"""POST /tokenize and /detokenize (vLLM's shapes, also under /v1 and /v3) and
GET /tokenizer_info: the served model's own tokenizer and chat template, as the
generation endpoints use them, for clients that count or build prompts themselves."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field
from quart import Blueprint

from ovtrio.api.errors import invalid
from ovtrio.api.generation import check_model, parse_body, ready_service
from ovtrio.api.protocol import ChatMessage, _Body

blueprint = Blueprint("tokenize", __name__)


class TokenizeRequest(_Body):
    """Either a completions `prompt` or chat `messages` (rendered by the chat template)."""

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]


@blueprint.post("/tokenize")
@blueprint.post("/v1/tokenize")
@blueprint.post("/v3/tokenize")
async def tokenize() -> Any:
    body: TokenizeRequest = await parse_body(TokenizeRequest)
    service = ready_service()
    if body.model is not None:
        check_model(service, body)
    prompts = service.prompts
    assert prompts is not None
    if (body.prompt is None) == (body.messages is None):
        raise invalid("Send either 'prompt' or 'messages'.", "prompt" if body.prompt is not None else "messages")
    if body.messages is not None:
        ids = prompts.encode_chat(
            body.messages,
            template_kwargs=body.chat_template_kwargs,
            add_generation_prompt=body.add_generation_prompt,
        ).ids
    else:
        ids = prompts.encode_raw(body.prompt or "", add_special_tokens=body.add_special_tokens is not False)
    reply: dict[str, Any] = {"count": len(ids), "max_model_len": service.sequence_limit.tokens, "tokens": ids}
    if body.return_token_strs:
        reply["token_strs"] = [prompts.token_bytes(i).decode("utf-8", errors="replace") for i in ids]
    return reply


@blueprint.post("/detokenize")
@blueprint.post("/v1/detokenize")
@blueprint.post("/v3/detokenize")
async def detokenize() -> Any:
    body: DetokenizeRequest = await parse_body(DetokenizeRequest)
    service = ready_service()
    if body.model is not None:
        check_model(service, body)
    assert service.prompts is not None
    ids = service.prompts.checked_ids(body.tokens, "tokens")
    return {"prompt": service.prompts.decode(ids)}
