"""What goes in and what comes out: the four completions prompt forms, echo, logprobs
(completions and chat, unary and streamed), stop strings and stop_token_ids,
skip_special_tokens, nvext.use_raw_prompt, and the id / system_fingerprint of bodies and
chunks. Every body and chunk is checked against OpenAI's schema by the helpers."""

from __future__ import annotations

import pytest

from helpers import (
    CHAT_PATHS,
    COMPLETION_PATHS,
    SHORT_ANSWER,
    assert_error,
    chat,
    chat_stream,
    complete,
    complete_stream,
    completion_body,
    post,
    warm_up,
)
from openai_schema import validate
from sse import MODEL, check_chat_choices

CHAT = CHAT_PATHS[0]
COMPLETIONS = COMPLETION_PATHS[0]
# Greedy: " 4, 5, 6, 7, 8, 9, 10, 1..." (plain ASCII, one character or space per token).
COUNT = "Count: 1, 2, 3,"
STORY = "Once upon a time"
# Single ASCII characters are tokens ord(c) - 16 in this vocabulary ("," is 28, "4" is 36),
# and "1,2,3," is tokenized character by character, without a BOS token.
DIGITS = "1,2,3,"
DIGIT_IDS = [ord(c) - 16 for c in DIGITS]
COMMA, FOUR, DOT = 28, 36, 30
EOS = "<|im_end|>"
GREEDY = {"temperature": 0, "max_tokens": 8}


# ---- prompt forms ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits_reference(server):
    return complete(server.base_url, prompt=DIGITS, **GREEDY)


@pytest.mark.parametrize(
    "prompt",
    [DIGITS, [DIGITS], DIGIT_IDS, [DIGIT_IDS]],
    ids=["string", "list-of-strings", "token-ids", "list-of-token-id-lists"],
)
def test_the_four_prompt_forms_are_the_same_prompt(server, digits_reference, prompt):
    result = complete(server.base_url, prompt=prompt, **GREEDY)
    assert result.usage["prompt_tokens"] == len(DIGIT_IDS) == digits_reference.usage["prompt_tokens"]
    assert result.text == digits_reference.text
    assert result.text.startswith("4,5,")
    echoed = complete(server.base_url, prompt=prompt, echo=True, **GREEDY)
    assert echoed.text == DIGITS + result.text


def test_several_prompts_give_n_choices_each_in_prompt_order(server):
    single = [complete(server.base_url, prompt=p, ignore_eos=True, **GREEDY) for p in (COUNT, STORY)]
    both = complete(server.base_url, prompt=[COUNT, STORY], n=2, ignore_eos=True, **GREEDY)
    # choice p * n + i is the i-th output of prompt p
    assert both.texts == [single[0].text, single[0].text, single[1].text, single[1].text]
    assert both.usage["prompt_tokens"] == sum(s.usage["prompt_tokens"] for s in single)
    assert both.usage["completion_tokens"] == 4 * GREEDY["max_tokens"]


def test_several_prompts_stream_with_echo(server):
    params = {"prompt": [COUNT, STORY], "n": 2, "echo": True, **GREEDY}
    unary = complete(server.base_url, **params)
    for text, prompt in zip(unary.texts, [COUNT, COUNT, STORY, STORY]):
        assert text.startswith(prompt)
    # complete_stream checks that each choice's prompt comes first, in index order
    streamed = complete_stream(server.base_url, stream_options={"include_usage": True}, **params)
    assert [choice.echo for choice in streamed.choices] == [COUNT, COUNT, STORY, STORY]
    assert streamed.texts == unary.texts
    assert streamed.usage == unary.usage


def test_several_token_id_prompts(server):
    ids = [DIGIT_IDS, DIGIT_IDS[:4]]
    result = complete(server.base_url, prompt=ids, echo=True, **GREEDY)
    assert len(result.texts) == 2
    assert result.texts[0].startswith(DIGITS)
    assert result.texts[1].startswith(DIGITS[:4])
    assert result.usage["prompt_tokens"] == 10
    streamed = complete_stream(server.base_url, prompt=ids, echo=True, **GREEDY)
    assert [choice.echo for choice in streamed.choices] == [DIGITS, DIGITS[:4]]
    assert streamed.texts == result.texts


@pytest.mark.parametrize(
    "prompt, param",
    [
        ([], "prompt"),
        ("", "prompt"),
        ([[]], "prompt[0]"),
        ([10**9], "prompt[0]"),
        ([DIGIT_IDS[0], 10**9], "prompt[1]"),
        ([DIGIT_IDS, [10**9]], "prompt[1][0]"),
        ([DIGIT_IDS, [DIGIT_IDS[0], 49152]], "prompt[1][1]"),
        ([-1], "prompt[0]"),
        ([[DIGIT_IDS[0], -5]], "prompt[0][1]"),
    ],
    ids=[
        "empty-list",
        "empty-string",
        "empty-token-list",
        "token-out-of-vocab",
        "second-token-out-of-vocab",
        "nested-out-of-vocab",
        "vocab-size-itself",
        "negative-token",
        "nested-negative-token",
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_bad_prompts_are_400_naming_the_place(server, prompt, param, stream):
    response = post(server.base_url, COMPLETIONS, completion_body(prompt, max_tokens=4, stream=stream))
    error = assert_error(response, 400, param=param)
    if "vocab" in error["message"]:
        assert "49152" in error["message"]


# ---- echo ---------------------------------------------------------------------------------


def test_echo_unary_prepends_the_prompt(server):
    plain = complete(server.base_url, prompt=COUNT, **GREEDY)
    echoed = complete(server.base_url, prompt=COUNT, echo=True, **GREEDY)
    assert echoed.text == COUNT + plain.text
    assert echoed.usage == plain.usage


def test_echo_stream_sends_the_prompt_first(server):
    unary = complete(server.base_url, prompt=COUNT, echo=True, **GREEDY)
    streamed = complete_stream(server.base_url, prompt=COUNT, echo=True, **GREEDY)
    assert streamed.chunks[0]["choices"][0]["text"] == COUNT
    assert streamed.texts == [unary.text]


def test_echo_through_the_sdk(client):
    completion = client.completions.create(model=MODEL, prompt=COUNT, echo=True, **GREEDY)
    validate(completion.model_dump(exclude_unset=True), "CreateCompletionResponse")
    assert completion.choices[0].text.startswith(COUNT + " 4,")


# ---- completions logprobs ----------------------------------------------------------------------


def check_completion_logprobs(logprobs: dict, text: str, first_offset: int) -> None:
    """OpenAI's legacy logprobs object for plain-ASCII output: one entry per token, the
    chosen token standing as its own top entry, offsets into the returned text."""
    tokens = logprobs["tokens"]
    assert tokens and all(isinstance(token, str) for token in tokens)
    assert "".join(tokens) == text
    assert len(logprobs["token_logprobs"]) == len(tokens)
    for logprob in logprobs["token_logprobs"]:
        assert isinstance(logprob, float) and logprob <= 0.0
    assert logprobs["top_logprobs"] == [{t: lp} for t, lp in zip(tokens, logprobs["token_logprobs"])]
    offsets = logprobs["text_offset"]
    assert offsets[0] == first_offset
    for i in range(1, len(offsets)):
        assert offsets[i] == offsets[i - 1] + len(tokens[i - 1]) > offsets[i - 1]


@pytest.mark.parametrize("logprobs", [0, 1])
def test_completion_logprobs(server, logprobs):
    result = complete(server.base_url, prompt=COUNT, logprobs=logprobs, ignore_eos=True, **GREEDY)
    choice = result.body["choices"][0]
    check_completion_logprobs(choice["logprobs"], result.text, 0)
    assert len(choice["logprobs"]["tokens"]) == result.usage["completion_tokens"] == GREEDY["max_tokens"]
    assert result.text == complete(server.base_url, prompt=COUNT, **GREEDY).text


def test_completion_logprobs_absent_is_null(server):
    result = complete(server.base_url, prompt=COUNT, **GREEDY)
    assert result.body["choices"][0]["logprobs"] is None


def test_completion_logprobs_with_echo_count_offsets_from_the_prompt(server):
    result = complete(server.base_url, prompt=COUNT, logprobs=1, echo=True, **GREEDY)
    logprobs = result.body["choices"][0]["logprobs"]
    assert result.text.startswith(COUNT)
    check_completion_logprobs(logprobs, result.text[len(COUNT) :], len(COUNT))


def test_completion_logprobs_per_choice(server):
    result = complete(server.base_url, prompt=[COUNT, STORY], logprobs=1, ignore_eos=True, **GREEDY)
    for choice in result.body["choices"]:
        assert len(choice["logprobs"]["tokens"]) == GREEDY["max_tokens"]
        assert "".join(choice["logprobs"]["tokens"]) == choice["text"]


@pytest.mark.parametrize("echo", [False, True])
def test_completion_logprobs_stream(server, echo):
    params = {"prompt": COUNT, "logprobs": 1, "echo": echo, "ignore_eos": True, **GREEDY}
    unary = complete(server.base_url, **params)
    streamed = complete_stream(server.base_url, stream_options={"include_usage": True}, **params)
    (choice,) = streamed.choices
    assert streamed.texts == [unary.text]
    tokens, offsets, token_logprobs = [], [], []
    for text, logprobs in choice.pieces:
        assert logprobs is not None
        assert "".join(logprobs["tokens"]) == text  # each chunk's entries cover its own text
        tokens += logprobs["tokens"]
        offsets += logprobs["text_offset"]
        token_logprobs += logprobs["token_logprobs"]
    assert len(tokens) == streamed.usage["completion_tokens"] == GREEDY["max_tokens"]
    merged = {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": [{t: lp} for t, lp in zip(tokens, token_logprobs)],
        "text_offset": offsets,
    }
    check_completion_logprobs(merged, choice.text[len(choice.echo) :], len(COUNT) if echo else 0)
    assert merged == unary.body["choices"][0]["logprobs"]


# ---- chat logprobs ---------------------------------------------------------------------------


def check_chat_logprob_entries(entries: list, text: str) -> None:
    for entry in entries:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}, entry
        assert isinstance(entry["logprob"], float) and entry["logprob"] <= 0.0
        assert all(isinstance(b, int) and 0 <= b < 256 for b in entry["bytes"])
        assert bytes(entry["bytes"]).decode("utf-8") == entry["token"]
        assert entry["top_logprobs"] == []
    assert "".join(entry["token"] for entry in entries) == text


@pytest.mark.parametrize("top_logprobs", [None, 0])
def test_chat_logprobs(server, top_logprobs):
    extra = {} if top_logprobs is None else {"top_logprobs": top_logprobs}
    result = chat(server.base_url, messages=SHORT_ANSWER, logprobs=True, ignore_eos=True, **GREEDY, **extra)
    logprobs = result.body["choices"][0]["logprobs"]
    assert logprobs["refusal"] is None
    entries = logprobs["content"]
    assert len(entries) == result.usage["completion_tokens"] == GREEDY["max_tokens"]
    check_chat_logprob_entries(entries, result.text)


@pytest.mark.parametrize("logprobs", [None, False])
def test_chat_without_logprobs_is_null(server, logprobs):
    extra = {} if logprobs is None else {"logprobs": logprobs}
    assert chat(server.base_url, content="Hi", **GREEDY, **extra).body["choices"][0]["logprobs"] is None


def test_chat_logprobs_count_the_end_of_sequence_token(server):
    result = chat(server.base_url, messages=SHORT_ANSWER, logprobs=True, temperature=0, max_tokens=24)
    assert result.finish_reason == "stop"
    entries = result.body["choices"][0]["logprobs"]["content"]
    assert len(entries) == result.usage["completion_tokens"]
    assert entries[-1]["token"] == EOS and EOS not in result.text
    check_chat_logprob_entries(entries[:-1], result.text)


def test_chat_logprobs_stream(server):
    params = {"messages": SHORT_ANSWER, "logprobs": True, "ignore_eos": True, **GREEDY}
    warm_up(server.base_url, CHAT, messages=SHORT_ANSWER)
    unary = chat(server.base_url, **params)
    streamed = chat_stream(server.base_url, stream_options={"include_usage": True}, **params)
    (choice,) = streamed.choices
    assert streamed.texts == [unary.text]
    entries = []
    for text, logprobs in choice.pieces:
        check_chat_logprob_entries(logprobs["content"], text)  # each chunk covers its own tokens
        entries += logprobs["content"]
    assert len(entries) == streamed.usage["completion_tokens"] == GREEDY["max_tokens"]
    assert entries == unary.body["choices"][0]["logprobs"]["content"]


def test_chat_logprobs_stream_through_the_sdk_with_n(server, client):
    messages = [{"role": "user", "content": "Name a fruit."}]
    warm_up(server.base_url, CHAT, messages=messages)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        n=2,
        seed=8,
        temperature=1.0,
        max_tokens=6,
        logprobs=True,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    streamed = check_chat_choices([c.model_dump(exclude_unset=True) for c in stream], 2, include_usage=True)
    total = 0
    for choice in streamed.choices:
        entries = [entry for logprobs in choice.logprobs for entry in logprobs["content"]]
        check_chat_logprob_entries(entries, choice.text)
        assert len(entries) == 6
        total += len(entries)
    assert total == streamed.usage["completion_tokens"]


# ---- skip_special_tokens ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def _short_answer_cached(server):
    warm_up(server.base_url, CHAT, messages=SHORT_ANSWER)


def test_skip_special_tokens_false_keeps_the_end_token(server, _short_answer_cached):
    params = {"messages": SHORT_ANSWER, "temperature": 0, "max_tokens": 24}
    skipped = chat(server.base_url, **params)
    assert skipped.finish_reason == "stop" and EOS not in skipped.text
    assert chat(server.base_url, skip_special_tokens=True, **params).text == skipped.text
    kept = chat(server.base_url, skip_special_tokens=False, **params)
    assert kept.text == skipped.text + EOS
    assert kept.usage == skipped.usage
    streamed = chat_stream(server.base_url, skip_special_tokens=False, **params)
    assert streamed.texts == [kept.text]


# ---- stop strings and include_stop_str_in_output --------------------------------------------------


@pytest.fixture(scope="module")
def count_text(server) -> str:
    text = complete(server.base_url, prompt=COUNT, max_tokens=12, temperature=0).text
    assert text.startswith(" 4, 5, 6, 7,")
    return text


@pytest.mark.parametrize(
    "stop, include, expected",
    [
        ("6", None, " 4, 5, "),
        ("6", False, " 4, 5, "),
        ("6", True, " 4, 5, 6"),
        (["zz", "6", "qq", "7"], None, " 4, 5, "),
        (["zz", "qq", "xx", ", 6"], True, " 4, 5, 6"),
        ([", 5", "4"], None, " "),
    ],
)
def test_unary_stop_strings(server, count_text, stop, include, expected):
    extra = {} if include is None else {"include_stop_str_in_output": include}
    result = complete(server.base_url, prompt=COUNT, max_tokens=12, temperature=0, stop=stop, **extra)
    assert result.text == expected
    assert result.finish_reason == "stop"
    assert result.usage["completion_tokens"] < 12


@pytest.mark.parametrize("include", [None, True])
def test_streamed_stop_strings_include_the_stop_string(server, count_text, include):
    extra = {} if include is None else {"include_stop_str_in_output": include}
    streamed = complete_stream(server.base_url, prompt=COUNT, max_tokens=12, temperature=0, stop="6", **extra)
    assert streamed.texts == [" 4, 5, 6"]
    assert streamed.finish_reasons == ["stop"]


def test_stop_strings_on_chat_through_the_sdk(server, client):
    messages = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
    warm_up(server.base_url, CHAT, messages=messages)
    full = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=24)
    text = full.choices[0].message.content
    assert "5" in text, text
    stopped = client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=24, stop=["5"]
    )
    assert stopped.choices[0].message.content == text[: text.index("5")]
    assert stopped.choices[0].finish_reason == "stop"
    kept = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        temperature=0,
        max_tokens=24,
        stop="5",
        extra_body={"include_stop_str_in_output": True},
    )
    assert kept.choices[0].message.content == text[: text.index("5") + 1]


def test_stop_string_with_n_cuts_every_choice(server):
    result = complete(server.base_url, prompt=COUNT, n=2, max_tokens=12, temperature=0, stop="6")
    assert result.texts == [" 4, 5, "] * 2
    assert result.finish_reasons == ["stop", "stop"]


# ---- stop_token_ids ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stop_token_ids, text, tokens",
    [([COMMA], " 4,", 3), ([FOUR], " 4", 2), ([COMMA, FOUR], " 4", 2), ([], None, 12)],
    ids=["comma", "four", "both", "none"],
)
def test_stop_token_ids_keep_the_stop_token(server, count_text, stop_token_ids, text, tokens):
    params = {"prompt": COUNT, "max_tokens": 12, "temperature": 0, "stop_token_ids": stop_token_ids}
    result = complete(server.base_url, **params)
    assert result.text == (count_text if text is None else text)
    assert result.usage["completion_tokens"] == tokens
    assert result.finish_reason == ("stop" if tokens < 12 else "length")
    streamed = complete_stream(server.base_url, stream_options={"include_usage": True}, **params)
    assert streamed.texts == [result.text]
    assert streamed.finish_reasons == [result.finish_reason]
    assert streamed.usage == result.usage


def test_stop_token_ids_on_chat_through_the_sdk(server, client):
    messages = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
    warm_up(server.base_url, CHAT, messages=messages)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=24, extra_body={"stop_token_ids": [DOT]}
    )
    body = raw.http_response.json()
    validate(body, "CreateChatCompletionResponse")
    content = body["choices"][0]["message"]["content"]
    assert content.endswith(".") and content.count(".") == 1, content
    assert body["choices"][0]["finish_reason"] == "stop"


# ---- nvext.use_raw_prompt ---------------------------------------------------------------------------


def test_nvext_use_raw_prompt_skips_the_chat_template(server):
    templated = chat(server.base_url, content="Say hi", max_tokens=4, temperature=0)
    raw = chat(server.base_url, content="Say hi", max_tokens=4, temperature=0, nvext={"use_raw_prompt": True})
    assert raw.usage["prompt_tokens"] <= 3 < 20 < templated.usage["prompt_tokens"]
    # the raw prompt is the messages' text, as a completions prompt would be
    as_completion = complete(server.base_url, prompt="Say hi", max_tokens=4, temperature=0)
    assert raw.usage["prompt_tokens"] == as_completion.usage["prompt_tokens"]
    assert raw.text == as_completion.text
    streamed = chat_stream(
        server.base_url, content="Say hi", max_tokens=4, temperature=0, nvext={"use_raw_prompt": True}
    )
    assert streamed.texts == [raw.text]


def test_nvext_annotations_are_accepted(server):
    result = chat(server.base_url, content="Hi", max_tokens=4, nvext={"annotations": ["request_id"]})
    assert result.usage["completion_tokens"] <= 4


# ---- id and system_fingerprint ---------------------------------------------------------------------


def test_unary_ids_are_unique_and_fingerprints_stable(server):
    bodies = [
        chat(server.base_url, content="Hi", max_tokens=4).body,
        chat(server.base_url, content="Hi", max_tokens=4).body,
        complete(server.base_url, prompt="Hi", max_tokens=4).body,
        complete(server.base_url, prompt="Hi", max_tokens=4).body,
    ]
    assert [b["id"][: len("chatcmpl-")] for b in bodies[:2]] == ["chatcmpl-"] * 2
    assert [b["id"][: len("cmpl-")] for b in bodies[2:]] == ["cmpl-"] * 2
    assert len({b["id"] for b in bodies}) == 4
    assert len({b["system_fingerprint"] for b in bodies}) == 1
    assert all(b["system_fingerprint"] for b in bodies)


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_stream_chunks_share_one_id_and_the_fingerprint(server, path):
    params = {"n": 2, "max_tokens": 4, "stream_options": {"include_usage": True}}
    if path == CHAT:
        streamed = chat_stream(server.base_url, content="Hi", **params)
        prefix = "chatcmpl-"
    else:
        streamed = complete_stream(server.base_url, prompt="Hi", **params)
        prefix = "cmpl-"
    ids = {chunk["id"] for chunk in streamed.chunks}
    fingerprints = {chunk["system_fingerprint"] for chunk in streamed.chunks}
    assert len(ids) == 1 and ids.pop().startswith(prefix)
    if path == CHAT:
        unary = chat(server.base_url, max_tokens=4)
    else:
        unary = complete(server.base_url, prompt="Hi", max_tokens=4)
    assert fingerprints == {unary.body["system_fingerprint"]}
