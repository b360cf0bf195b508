"""POST /v1/messages (and /v3/messages) and POST /v1/messages/count_tokens."""

from __future__ import annotations

from typing import Any

from pydantic_core import to_jsonable_python
from quart import Blueprint

from ovtrio.api.context import ready_model
from ovtrio.api.generation import accept, parse_body
from ovtrio.api.messages.prepare import count_tokens, prepare
from ovtrio.api.messages.protocol import MessagesInput, MessagesRequest
from ovtrio.api.messages.stream import message_stream, unary_message
from ovtrio.api.messages.writer import MessageWriter
from ovtrio.api.sse import sse_response
from ovtrio.parsing.ids import new_id

blueprint = Blueprint("messages", __name__)


@blueprint.post("/v3/messages")
@blueprint.post("/v1/messages")
async def create_message() -> Any:
    body, model = await accept(MessagesRequest)
    ready = await prepare(model, body)
    one_call = bool(body.tool_choice and body.tool_choice.disable_parallel_tool_use)
    writer = MessageWriter(new_id("msg_"), model.name, ready.input_tokens, one_call)
    if body.stream:
        return sse_response(message_stream(model.scheduler, ready, writer))
    return to_jsonable_python(await unary_message(model.scheduler, ready, writer))


@blueprint.post("/v3/messages/count_tokens")
@blueprint.post("/v1/messages/count_tokens")
async def count_message_tokens() -> Any:
    body = await parse_body(MessagesInput)
    return {"input_tokens": await count_tokens(await ready_model(body.model), body)}
