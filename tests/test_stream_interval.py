"""--stream-interval: deltas merged over several engine steps, nothing lost or reordered
(on the session's alternate server, which merges them over ALTERNATE_STREAM_INTERVAL steps)."""

from __future__ import annotations

from conftest import ALTERNATE_STREAM_INTERVAL
from helpers import complete, completion_body
from sse import check_completion_stream, stream_post

TOKENS = 24


def test_chunks_carry_several_tokens_and_add_up_to_the_unary_text(alternate_server):
    params = {"max_tokens": TOKENS, "temperature": 0, "ignore_eos": True}
    unary = complete(alternate_server.base_url, prompt="Once upon a time", **params)
    body = completion_body("Once upon a time", stream=True, stream_options={"include_usage": True}, **params)
    result = check_completion_stream(
        stream_post(alternate_server.base_url, "/v3/completions", body), include_usage=True
    )
    assert result.text == unary.text
    assert result.usage["completion_tokens"] == TOKENS
    text_chunks = len(result.chunks) - 2  # minus the finish and usage chunks
    # The first token alone (time to first token is not delayed), then one chunk per
    # interval of engine steps (counted on the server's step counter, so where they fall
    # depends on the steps it ran before), and the last tokens as the request ends.
    assert text_chunks <= 2 + -(-(TOKENS - 1) // ALTERNATE_STREAM_INTERVAL), text_chunks
    assert text_chunks >= 2
