"""Reading an Anthropic Messages stream strictly: named server-sent events, each event
validated against the Messages API's event types (the `anthropic` SDK's models), and
the whole stream walked as a state machine in Anthropic's order:

    message_start, then per content block (indexes 0, 1, ... in turn)
    content_block_start, content_block_delta* (of the block's own kind), content_block_stop,
    then message_delta, message_stop; `ping` anywhere after message_start.

`walk` returns the Message the events add up to, for comparing with a unary reply.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter

DELTA_OF_BLOCK = {"text": "text_delta", "thinking": "thinking_delta", "tool_use": "input_json_delta"}
STOP_REASONS = {"end_turn", "max_tokens", "stop_sequence", "tool_use"}


def parse_named_sse(raw: str) -> list[dict[str, Any]]:
    """The events of a complete body: each `event: <name>` + `data: <json>`, the name
    equal to the payload's type; no `[DONE]`."""
    assert raw.endswith("\n\n"), raw[-80:]
    events = []
    for block in raw[:-2].split("\n\n"):
        lines = block.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), block[:120]
        name, payload = lines[0][len("event: ") :], json.loads(lines[1][len("data: ") :])
        assert payload["type"] == name, block[:120]
        events.append(payload)
    return events


def _event_adapter() -> TypeAdapter:
    from anthropic.types import RawMessageStreamEvent

    return TypeAdapter(RawMessageStreamEvent)


def check_message(message: dict[str, Any]) -> None:
    from anthropic.types import Message

    Message.model_validate(message)
    assert message["id"].startswith("msg_") and message["type"] == "message" and message["role"] == "assistant"
    for block in message["content"]:
        assert block["type"] in DELTA_OF_BLOCK, block
        if block["type"] == "tool_use":
            assert block["id"].startswith("toolu_") and isinstance(block["input"], dict), block
    usage = message["usage"]
    assert isinstance(usage["input_tokens"], int) and usage["input_tokens"] > 0
    assert isinstance(usage["output_tokens"], int) and usage["cache_read_input_tokens"] == 0


def walk(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Check the events' shapes and order; the Message they add up to."""
    adapter = _event_adapter()
    state = "start"
    message: dict[str, Any] = {}
    blocks: list[dict[str, Any]] = []
    partial: dict[int, str] = {}
    for event in events:
        kind = event["type"]
        if kind == "ping":  # not among the SDK's event types: it skips pings
            assert event == {"type": "ping"} and state != "start", (event, state)
            continue
        adapter.validate_python(event)
        if state == "start":
            assert kind == "message_start", kind
            message = json.loads(json.dumps(event["message"]))
            assert message["content"] == [] and message["stop_reason"] is None and message["stop_sequence"] is None
            state = "between_blocks"
        elif state == "between_blocks":
            assert kind in ("content_block_start", "message_delta"), kind
            if kind == "content_block_start":
                assert event["index"] == len(blocks), (event["index"], len(blocks))
                block = dict(event["content_block"])
                assert block["type"] in DELTA_OF_BLOCK, block
                if block["type"] == "tool_use":
                    assert block["input"] == {}
                    partial[event["index"]] = ""
                blocks.append(block)
                state = "in_block"
            else:
                assert event["delta"]["stop_reason"] in STOP_REASONS, event
                message["stop_reason"] = event["delta"]["stop_reason"]
                message["stop_sequence"] = event["delta"]["stop_sequence"]
                message["usage"].update(event["usage"])
                state = "delta_sent"
        elif state == "in_block":
            index = len(blocks) - 1
            assert kind in ("content_block_delta", "content_block_stop"), kind
            assert event["index"] == index, (event["index"], index)
            block = blocks[index]
            if kind == "content_block_delta":
                delta = event["delta"]
                assert delta["type"] == DELTA_OF_BLOCK[block["type"]], (delta, block)
                if delta["type"] == "text_delta":
                    assert delta["text"]
                    block["text"] += delta["text"]
                elif delta["type"] == "thinking_delta":
                    block["thinking"] += delta["thinking"]
                else:
                    partial[index] += delta["partial_json"]
            else:
                if block["type"] == "tool_use":
                    block["input"] = json.loads(partial[index]) if partial[index] else {}
                state = "between_blocks"
        elif state == "delta_sent":
            assert kind == "message_stop", kind
            state = "stopped"
        else:
            raise AssertionError(f"{kind} after message_stop")
    assert state == "stopped", f"the stream ended in state {state}"
    message["content"] = blocks
    check_message(message)
    return message
