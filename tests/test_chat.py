"""POST /v3/chat/completions (and /v1/chat/completions): unary and streamed, raw HTTP,
the sync SDK and the async SDK (under trio)."""

from __future__ import annotations

import json

import pytest

import loopback
from helpers import CHAT_PATHS, ENDS_BY_ITSELF, chat, chat_body, check_chat_body, pick_stop_word, post
from openai_schema import validate
from sse import MODEL, check_chat_stream, parse_sse, stream_post

STORY = "Tell me a short story about a cat."
# ignore_eos: the model may end at once on some CPUs; the tests need text to compare.
GREEDY = {"temperature": 0, "max_tokens": 16, "ignore_eos": True}
SDK_GREEDY = {"temperature": 0, "max_tokens": 16, "extra_body": {"ignore_eos": True}}
HISTORY = [
    {"role": "user", "content": "My name is Alice."},
    {"role": "assistant", "content": "Nice to meet you, Alice!"},
    {"role": "user", "content": "What is my name?"},
]


def rendered_prompt(base_url: str, messages: list) -> str:
    """The prompt the chat template makes of `messages`, as the server tokenizes it."""
    tokenized = post(base_url, "/tokenize", {"messages": messages})
    assert tokenized.status_code == 200, tokenized.text
    text = post(base_url, "/detokenize", {"tokens": tokenized.json()["tokens"]})
    assert text.status_code == 200, text.text
    return text.json()["prompt"]


@pytest.mark.parametrize("path", CHAT_PATHS)
def test_unary_length_counts_every_token(server, path):
    result = chat(server.base_url, path, content=STORY, max_tokens=10, temperature=0, ignore_eos=True, logprobs=True)
    entries = result.body["choices"][0]["logprobs"]["content"]
    assert len(entries) == 10 and "".join(entry["token"] for entry in entries) == result.text
    assert result.finish_reason == "length"
    assert result.usage["completion_tokens"] == 10
    assert result.body["choices"][0]["message"]["refusal"] is None


def test_v1_and_v3_are_the_same_endpoint(server):
    v3, v1 = (chat(server.base_url, path, content=STORY, **GREEDY) for path in CHAT_PATHS)
    assert v3.text == v1.text
    assert v3.usage == v1.usage


def test_greedy_is_deterministic(server):
    first = chat(server.base_url, content=STORY, logprobs=True, **GREEDY)
    second = chat(server.base_url, content=STORY, logprobs=True, **GREEDY)
    assert first.text == second.text
    assert first.body["choices"][0]["logprobs"] == second.body["choices"][0]["logprobs"]
    assert first.usage == second.usage


def test_end_of_sequence_finishes_with_stop_unless_ignored(server):
    natural = chat(server.base_url, **ENDS_BY_ITSELF, max_tokens=32, temperature=0)
    assert natural.finish_reason == "stop"
    assert 0 < natural.usage["completion_tokens"] < 32
    assert json.loads(natural.text) in (True, False)
    forced = chat(server.base_url, **ENDS_BY_ITSELF, max_tokens=32, temperature=0, ignore_eos=True)
    assert forced.finish_reason == "length"
    assert forced.usage["completion_tokens"] == 32
    assert forced.text.startswith(natural.text)


def test_max_completion_tokens_wins_over_max_tokens(server):
    result = chat(
        server.base_url, content=STORY, max_completion_tokens=5, max_tokens=20, temperature=0, ignore_eos=True
    )
    assert result.finish_reason == "length"
    assert result.usage["completion_tokens"] == 5


def test_content_as_list_of_text_parts(server):
    parts = [{"type": "text", "text": "Tell me a short story "}, {"type": "text", "text": "about a cat."}]
    as_parts = chat(server.base_url, content=parts, **GREEDY)
    as_string = chat(server.base_url, content=STORY, **GREEDY)
    assert as_parts.usage["prompt_tokens"] == as_string.usage["prompt_tokens"]
    assert as_parts.text == as_string.text


def test_system_message_is_part_of_the_prompt(server):
    user = {"role": "user", "content": "Hi"}
    system = {"role": "system", "content": "You are a pirate. Always talk like a pirate."}
    with_system = chat(server.base_url, messages=[system, user], **GREEDY)
    prompt = rendered_prompt(server.base_url, [system, user])
    assert system["content"] in prompt and prompt.index(system["content"]) < prompt.index("Hi")
    # (Without one, SmolLM2's template adds its own default system prompt, so compare
    # two system messages rather than system vs. none.)
    longer = {"role": "system", "content": system["content"] + " Never break character, not even once."}
    with_longer = chat(server.base_url, messages=[longer, user], max_tokens=1)
    assert with_longer.usage["prompt_tokens"] > with_system.usage["prompt_tokens"] + 5
    # "developer" is OpenAI's newer name for "system".
    developer = chat(server.base_url, messages=[{**system, "role": "developer"}, user], **GREEDY)
    assert developer.usage == with_system.usage
    assert developer.text == with_system.text


def test_multi_turn_history_is_part_of_the_prompt(server):
    last_only = chat(server.base_url, messages=HISTORY[-1:], **GREEDY)
    history = chat(server.base_url, messages=HISTORY, **GREEDY)
    assert history.usage["prompt_tokens"] > last_only.usage["prompt_tokens"]
    prompt = rendered_prompt(server.base_url, HISTORY)
    positions = [prompt.index(message["content"]) for message in HISTORY]
    assert positions == sorted(positions)
    tokenized = post(server.base_url, "/tokenize", {"messages": HISTORY}).json()
    assert tokenized["count"] == len(tokenized["tokens"]) == history.usage["prompt_tokens"]


@pytest.mark.parametrize("path", CHAT_PATHS)
@pytest.mark.parametrize("include_usage", [False, True])
def test_stream_matches_unary(server, path, include_usage):
    unary = chat(server.base_url, path, content=STORY, **GREEDY)
    body = chat_body(STORY, stream=True, stream_options={"include_usage": include_usage}, **GREEDY)
    streamed = check_chat_stream(stream_post(server.base_url, path, body), include_usage=include_usage)
    assert streamed.text == unary.text
    assert streamed.finish_reason == unary.finish_reason
    if include_usage:
        assert streamed.usage == unary.usage


def test_include_usage_framing(server):
    """Every chunk carries "usage": null, except one last chunk with no choices and the
    usage, which comes immediately before [DONE]."""
    body = chat_body(STORY, stream=True, stream_options={"include_usage": True}, max_tokens=8, ignore_eos=True)
    with loopback.stream("POST", server.base_url + "/v3/chat/completions", json=body, timeout=60) as response:
        raw = response.read().decode()
    assert response.status_code == 200
    events = raw.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    # The event right before [DONE] is the usage chunk.
    usage_chunk = json.loads(events[-3].removeprefix("data: "))
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 8
    assert usage_chunk["usage"]["total_tokens"] == usage_chunk["usage"]["prompt_tokens"] + 8
    chunks = parse_sse(raw)
    assert chunks[-1] == usage_chunk
    assert all(chunk["usage"] is None and chunk["choices"] for chunk in chunks[:-1])
    check_chat_stream(chunks, include_usage=True)


def test_stop_strings(server):
    full = chat(server.base_url, content=STORY, max_tokens=32, temperature=0, ignore_eos=True)
    word, at = pick_stop_word(full.text)

    stopped = chat(server.base_url, content=STORY, max_tokens=32, temperature=0, ignore_eos=True, stop=[word])
    assert stopped.text == full.text[:at]
    assert stopped.finish_reason == "stop"
    assert stopped.usage["completion_tokens"] < full.usage["completion_tokens"]

    body = chat_body(STORY, max_tokens=32, temperature=0, ignore_eos=True, stop=[word], stream=True)
    streamed = check_chat_stream(stream_post(server.base_url, "/v3/chat/completions", body))
    # Streams keep the stop string (OVMS's rule); unary responses drop it.
    assert streamed.text == full.text[:at] + word
    assert streamed.finish_reason == "stop"


def test_several_stop_strings_first_match_wins(server):
    full = chat(server.base_url, content=STORY, max_tokens=32, temperature=0, ignore_eos=True)
    word, at = pick_stop_word(full.text)
    stopped = chat(
        server.base_url, content=STORY, max_tokens=32, temperature=0, ignore_eos=True, stop=["zzzzqq", word, "qqqzzz"]
    )
    assert stopped.text == full.text[:at]
    assert stopped.finish_reason == "stop"


# ---- through the official SDK --------------------------------------------------------


def test_sdk_unary(client):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": STORY}],
        max_completion_tokens=8,
        temperature=0,
        logprobs=True,
        extra_body={"ignore_eos": True},
    )
    check_chat_body(raw.http_response.json())
    completion = raw.parse()
    assert completion.choices[0].message.role == "assistant"
    tokens = [entry.token for entry in completion.choices[0].logprobs.content]
    assert len(tokens) == 8 and "".join(tokens) == completion.choices[0].message.content
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == 8


def test_sdk_stream_matches_sdk_unary(client):
    messages = [{"role": "user", "content": STORY}]
    unary = client.chat.completions.create(model=MODEL, messages=messages, **SDK_GREEDY)
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, stream=True, stream_options={"include_usage": True}, **SDK_GREEDY
    )
    chunks = [chunk.model_dump(exclude_unset=True) for chunk in stream]
    streamed = check_chat_stream(chunks, include_usage=True)
    assert streamed.text == unary.choices[0].message.content
    assert streamed.finish_reason == unary.choices[0].finish_reason
    assert streamed.usage["completion_tokens"] == unary.usage.completion_tokens
    assert streamed.usage["prompt_tokens"] == unary.usage.prompt_tokens


async def test_async_sdk_unary(async_client):
    raw = await async_client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": STORY}], max_tokens=8, temperature=0
    )
    result = check_chat_body(raw.http_response.json())
    completion = raw.parse()
    assert completion.choices[0].message.content == result.text


async def test_async_sdk_stream_matches_unary(async_client):
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": [{"type": "text", "text": STORY}]},
    ]
    unary = await async_client.chat.completions.create(model=MODEL, messages=messages, **SDK_GREEDY)
    validate(unary.model_dump(exclude_unset=True), "CreateChatCompletionResponse")
    stream = await async_client.chat.completions.create(
        model=MODEL, messages=messages, stream=True, stream_options={"include_usage": True}, **SDK_GREEDY
    )
    chunks = [chunk.model_dump(exclude_unset=True) async for chunk in stream]
    streamed = check_chat_stream(chunks, include_usage=True)
    assert streamed.text == unary.choices[0].message.content
    assert streamed.usage["total_tokens"] == unary.usage.total_tokens
