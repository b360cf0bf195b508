"""POST /tokenize and /detokenize (vLLM's shapes, also under /v1 and /v3): the served
model's own tokenizer and chat template, as the generation endpoints use them, for
clients that count or build prompts themselves. GET /tokenizer_info describes the
tokenizer as lm-evaluation-harness's remote tokenizer reads it (its special tokens and
chat template; it then tokenizes through /tokenize). With several models, `model` (a
query parameter for /tokenizer_info) picks one; left out, the first model answers."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import trio
from pydantic import Field
from quart import Blueprint, Response, request

from ovtrio.api.context import ready_model
from ovtrio.api.conversation import template_messages, vision_text
from ovtrio.api.errors import invalid
from ovtrio.api.generation import parse_body
from ovtrio.api.protocol import Body, ChatMessage
from ovtrio.api.text_limits import check_prompt_chars, message_texts, tokenized

blueprint = Blueprint("tokenize", __name__)


class TokenizeRequest(Body):
    """Either a completions `prompt` or chat `messages` (rendered by the chat template)."""

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    # The tools shown to the model, as a chat request sends them (vLLM's /tokenize
    # takes them too): the chat template renders them into the prompt.
    tools: list[dict[str, Any]] | None = None
    return_token_strs: bool = False
    # Special-token text read as control tokens (llama.cpp's name): by default, yes in a
    # `prompt` (as completions read it), no in `messages` (as chat reads them, unless
    # the server's --parse-special-in-content says otherwise).
    parse_special: bool | None = None


class DetokenizeRequest(Body):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]


@blueprint.post("/tokenize")
@blueprint.post("/v1/tokenize")
@blueprint.post("/v3/tokenize")
async def tokenize() -> Any:
    body = await parse_body(TokenizeRequest)
    model = await ready_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise invalid("Send either 'prompt' or 'messages'.", "prompt" if body.prompt is not None else "messages")
    if body.messages is not None:
        chars = check_prompt_chars(model, message_texts(body.messages), "messages")
        prompt = await tokenized(
            chars,
            model.prompts.encode_chat,
            # As chat reads them: on a vision-language model, as its engine is given them.
            template_messages(body.messages, as_text=vision_text(model, body.parse_special)),
            tools=body.tools,
            template_kwargs=body.chat_template_kwargs,
            add_generation_prompt=body.add_generation_prompt,
            parse_special=body.parse_special,
        )
        ids = prompt.ids
    else:
        text = body.prompt or ""
        chars = check_prompt_chars(model, [text], "prompt")
        ids = await tokenized(
            chars,
            model.prompts.encode_raw,
            text,
            add_special_tokens=body.add_special_tokens,
            parse_special=body.parse_special is not False,
        )
    reply: dict[str, Any] = {"count": len(ids), "max_model_len": model.sequence_limit.tokens, "tokens": ids}
    if body.return_token_strs:
        pieces = [model.prompts.token_piece(i) for i in ids]
        if None in pieces:
            raise invalid(
                "return_token_strs needs the model's vocabulary, which this tokenizer does not expose.",
                "return_token_strs",
                "unsupported_parameter",
            )
        reply["token_strs"] = pieces
    if len(ids) <= OFF_LOOP_TOKENS:
        return reply
    # Writing a long list of ids as JSON would hold the event loop: in a worker thread, in
    # parts, handing the GIL back to it between them (see
    # docs/benchmarks.md#tokenizing-and-detokenizing).
    return Response(await trio.to_thread.run_sync(_json_in_parts, reply), mimetype="application/json")


OFF_LOOP_TOKENS = 8192


def _json_in_parts(reply: dict[str, Any]) -> str:
    head = {key: value for key, value in reply.items() if not isinstance(value, list)}
    parts = [json.dumps(head)[:-1]]
    for key, values in reply.items():
        if isinstance(values, list):
            pieces = []
            for start in range(0, len(values), OFF_LOOP_TOKENS):
                pieces.append(json.dumps(values[start : start + OFF_LOOP_TOKENS], ensure_ascii=False)[1:-1])
                time.sleep(0)
            parts.append(f', "{key}": [' + ",".join(piece for piece in pieces if piece) + "]")
    return "".join(parts) + "}"


@blueprint.post("/detokenize")
@blueprint.post("/v1/detokenize")
@blueprint.post("/v3/detokenize")
async def detokenize() -> Any:
    body = await parse_body(DetokenizeRequest)
    model = await ready_model(body.model)
    return {"prompt": model.prompts.decode(model.prompts.checked_ids(body.tokens, "tokens"))}


@blueprint.get("/tokenizer_info")
@blueprint.get("/v1/tokenizer_info")
@blueprint.get("/v3/tokenizer_info")
async def tokenizer_info() -> Any:
    model = await ready_model(request.args.get("model"))
    return {
        "tokenizer_class": "openvino_genai.Tokenizer",
        "model": model.name,
        "model_max_length": model.sequence_limit.tokens,
        **model.prompts.special_tokens(),
    }
