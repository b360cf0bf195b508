"""--stream-interval: deltas merged over several engine steps, nothing lost or reordered."""

from __future__ import annotations

import pytest

from conftest import running_server
from helpers import complete, completion_body
from sse import check_completion_stream, stream_post

TOKENS = 24


@pytest.fixture(scope="module")
def coarse_server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("interval"), "--stream-interval", "4") as server:
        yield server


def test_chunks_carry_several_tokens_and_add_up_to_the_unary_text(coarse_server):
    params = dict(max_tokens=TOKENS, temperature=0, ignore_eos=True)
    unary = complete(coarse_server.base_url, prompt="Once upon a time", **params)
    body = completion_body("Once upon a time", stream=True, stream_options={"include_usage": True}, **params)
    result = check_completion_stream(stream_post(coarse_server.base_url, "/v3/completions", body), include_usage=True)
    assert result.text == unary.text
    assert result.usage["completion_tokens"] == TOKENS
    text_chunks = len(result.chunks) - 2  # minus the finish and usage chunks
    # First token alone (time to first token is not delayed), then one chunk per 4 steps.
    assert text_chunks <= 1 + -(-(TOKENS - 1) // 4), text_chunks
    assert text_chunks >= 2
