"""Sampled structured output is JSON whatever the sampler picks: no raw control
character (U+0000-U+001F) in a string.

XGrammar 0.1.31's grammar for a counted string (minLength, maxLength) and a pattern's
"." let raw control characters through, which no JSON parser takes; the grammar the
engine is given keeps them out (grammar_worker.json_safe). Greedy output rarely meets a
token holding one; sampling at a high temperature over the whole vocabulary does, so
each schema here is sampled many times, on the real engine. (Without json_safe the
counted string's samples fail to parse; the pattern's did not in these 32 samples.)
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from helpers import chat_body, post

STRINGS = {
    "counted": {"type": "string", "minLength": 4, "maxLength": 24},
    "pattern-dot": {"type": "string", "pattern": "^a.{0,20}$"},
}


def sampled(server, string: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    schema = {"type": "object", "properties": {"note": string}, "required": ["note"], "additionalProperties": False}
    body = chat_body(
        "Write a note with tabs, new lines and odd symbols.",
        max_tokens=48,
        temperature=2.0,
        top_p=1.0,
        top_k=-1,
        n=8,
        seed=seed,
        response_format={"type": "json_schema", "json_schema": {"name": "note", "schema": schema}},
    )
    reply = post(server.base_url, "/v1/chat/completions", body)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"]


@pytest.mark.parametrize("string", list(STRINGS.values()), ids=list(STRINGS))
def test_sampled_strings_hold_no_raw_control_character(server, string):
    finished = 0
    for seed in range(4):
        for choice in sampled(server, string, seed):
            content = choice["message"]["content"]
            raw = [hex(ord(char)) for char in content if ord(char) < 0x20]
            assert raw == [], (raw, content)  # compact JSON: no whitespace but spaces, none in strings
            if choice["finish_reason"] == "stop":
                finished += 1
                note = json.loads(content)["note"]  # strict: a raw control character fails here
                assert isinstance(note, str)
    assert finished > 0, "no sample ended within its tokens"
