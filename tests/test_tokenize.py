"""POST /tokenize and /detokenize: the served model's tokenizer and chat template, as the
generation endpoints use them."""

from __future__ import annotations

import pytest

from helpers import assert_error, chat, complete, post
from sse import MODEL
from vocab import embedded_vocabulary

PROMPT = "The capital of France is"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


@pytest.mark.parametrize("path", ["/tokenize", "/v1/tokenize", "/v3/tokenize"])
def test_a_prompt_is_tokenized_as_completions_does(server, path):
    reply = post(server.base_url, path, {"model": MODEL, "prompt": PROMPT})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert set(body) == {"tokens", "count", "max_model_len"}
    assert (
        body["count"]
        == len(body["tokens"])
        == complete(server.base_url, prompt=PROMPT, max_tokens=1).usage["prompt_tokens"]
    )
    assert body["max_model_len"] == 8192
    # the same ids as a prompt of token ids give the same completion
    params = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
    assert (
        complete(server.base_url, prompt=body["tokens"], **params).text
        == complete(server.base_url, prompt=PROMPT, **params).text
    )


def test_messages_are_rendered_by_the_chat_template(server):
    body = post(server.base_url, "/tokenize", {"messages": MESSAGES}).json()
    assert body["count"] == chat(server.base_url, messages=MESSAGES, max_tokens=1).usage["prompt_tokens"]
    text = post(server.base_url, "/detokenize", {"tokens": body["tokens"]}).json()["prompt"]
    assert text.index("Be brief.") < text.index("Hi there")
    without = post(server.base_url, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False}).json()
    assert without["count"] < body["count"] and body["tokens"][: without["count"]] == without["tokens"]


def test_token_strings_and_detokenize_round_trip(server):
    """token_strs are the vocabulary's own spelling of each token (vLLM's raw pieces,
    byte-level stand-ins: "Ġcapital" for " capital")."""
    body = post(server.base_url, "/tokenize", {"prompt": PROMPT, "return_token_strs": True}).json()
    vocabulary = embedded_vocabulary()
    assert body["token_strs"] == [vocabulary.table.pieces[i] for i in body["tokens"]]
    assert b"".join(vocabulary.table.token_bytes[i] for i in body["tokens"]).decode() == PROMPT
    assert " " not in "".join(body["token_strs"])
    assert post(server.base_url, "/v1/detokenize", {"tokens": body["tokens"]}).json() == {"prompt": PROMPT}


@pytest.mark.parametrize(
    "path, body, status, param",
    [
        ("/tokenize", {}, 400, "messages"),
        ("/tokenize", {"prompt": "x", "messages": MESSAGES}, 400, "prompt"),
        ("/tokenize", {"prompt": 5}, 400, "prompt"),
        ("/tokenize", {"model": "nope", "prompt": "x"}, 404, "model"),
        ("/detokenize", {"tokens": [1, 10**9]}, 400, "tokens[1]"),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens[0]"),
        ("/detokenize", {}, 400, "tokens"),
    ],
)
def test_bad_requests_name_the_field(server, path, body, status, param):
    error = assert_error(post(server.base_url, path, body), status, param=param)
    assert error["message"]
