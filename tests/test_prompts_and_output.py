"""What goes in and what comes out: the four completions prompt forms, echo, logprobs
(completions and chat, unary and streamed), stop strings and stop_token_ids,
skip_special_tokens, nvext.use_raw_prompt, and the id / system_fingerprint of bodies and
chunks. Every body and chunk is checked against OpenAI's schema by the helpers."""

from __future__ import annotations

import pytest

from helpers import (
    CHAT_PATHS,
    COMPLETION_PATHS,
    ENDS_BY_ITSELF,
    assert_error,
    chat,
    chat_stream,
    complete,
    complete_stream,
    completion_body,
    pick_stop_word,
    post,
)
from openai_schema import validate
from sse import MODEL, check_chat_choices
from vocab import embedded_vocabulary

CHAT = CHAT_PATHS[0]
COMPLETIONS = COMPLETION_PATHS[0]
COUNT = "Count: 1, 2, 3,"
STORY = "Once upon a time"
DIGITS = "1,2,3,"
# ignore_eos: every request runs its full length, whatever this CPU makes the model write
# (a model that ends at once on one CPU would leave nothing to compare).
GREEDY = {"temperature": 0, "max_tokens": 8, "ignore_eos": True}
VOCAB_SIZE = embedded_vocabulary().size


@pytest.fixture(scope="module")
def digit_ids(server) -> list[int]:
    """DIGITS as the server's tokenizer splits it (what the completions endpoint does)."""
    tokenized = post(server.base_url, "/tokenize", {"prompt": DIGITS})
    assert tokenized.status_code == 200, tokenized.text
    ids = tokenized.json()["tokens"]
    assert len(ids) >= 2
    assert post(server.base_url, "/detokenize", {"tokens": ids}).json()["prompt"] == DIGITS
    return ids


# ---- prompt forms ---------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["string", "list-of-strings", "token-ids", "list-of-token-id-lists"])
def test_the_four_prompt_forms_are_the_same_prompt(server, digit_ids, form):
    prompt = {
        "string": DIGITS,
        "list-of-strings": [DIGITS],
        "token-ids": digit_ids,
        "list-of-token-id-lists": [digit_ids],
    }[form]
    reference = complete(server.base_url, prompt=DIGITS, logprobs=1, **GREEDY)
    result = complete(server.base_url, prompt=prompt, logprobs=1, **GREEDY)
    assert result.usage["prompt_tokens"] == len(digit_ids) == reference.usage["prompt_tokens"]
    assert result.text == reference.text
    assert result.body["choices"][0]["logprobs"] == reference.body["choices"][0]["logprobs"]
    echoed = complete(server.base_url, prompt=prompt, echo=True, **GREEDY)
    assert echoed.text == DIGITS + result.text


def test_several_prompts_give_n_choices_each_in_prompt_order(server):
    # Outputs are compared between requests of the same shape (two prompts, two choices
    # each): batching a sequence with others can change its greedy text on some CPUs.
    both = complete(server.base_url, prompt=[COUNT, STORY], n=2, echo=True, **GREEDY)
    swapped = complete(server.base_url, prompt=[STORY, COUNT], n=2, echo=True, **GREEDY)
    # choice p * n + i is the i-th output of prompt p
    assert [text[: len(COUNT)] for text in both.texts[:2]] == [COUNT, COUNT]
    assert [text[: len(STORY)] for text in both.texts[2:]] == [STORY, STORY]
    assert both.texts[0] == both.texts[1] and both.texts[2] == both.texts[3]  # greedy copies
    assert both.texts == swapped.texts[2:] + swapped.texts[:2]
    singles = [complete(server.base_url, prompt=p, max_tokens=1) for p in (COUNT, STORY)]
    assert both.usage["prompt_tokens"] == sum(s.usage["prompt_tokens"] for s in singles)
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


def test_several_token_id_prompts(server, digit_ids):
    ids = [digit_ids, digit_ids[:-1]]
    shorter = post(server.base_url, "/detokenize", {"tokens": ids[1]}).json()["prompt"]
    assert DIGITS.startswith(shorter) and shorter != DIGITS
    result = complete(server.base_url, prompt=ids, echo=True, **GREEDY)
    assert len(result.texts) == 2
    assert result.texts[0].startswith(DIGITS)
    assert result.texts[1].startswith(shorter)
    assert result.usage["prompt_tokens"] == 2 * len(digit_ids) - 1
    streamed = complete_stream(server.base_url, prompt=ids, echo=True, **GREEDY)
    assert [choice.echo for choice in streamed.choices] == [DIGITS, shorter]
    assert streamed.texts == result.texts


A_TOKEN = embedded_vocabulary().token_id("1")


@pytest.mark.parametrize(
    "prompt, param",
    [
        ([], "prompt"),
        ("", "prompt"),
        ([[]], "prompt[0]"),
        ([10**9], "prompt[0]"),
        ([A_TOKEN, 10**9], "prompt[1]"),
        ([[A_TOKEN, A_TOKEN], [10**9]], "prompt[1][0]"),
        ([[A_TOKEN, A_TOKEN], [A_TOKEN, VOCAB_SIZE]], "prompt[1][1]"),
        ([-1], "prompt[0]"),
        ([[A_TOKEN, -5]], "prompt[0][1]"),
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
        assert str(VOCAB_SIZE) in error["message"]


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


def test_echo_through_the_sdk(server, client):
    plain = complete(server.base_url, prompt=COUNT, **GREEDY)
    completion = client.completions.create(
        model=MODEL, prompt=COUNT, echo=True, temperature=0, max_tokens=8, extra_body={"ignore_eos": True}
    )
    validate(completion.model_dump(exclude_unset=True), "CreateCompletionResponse")
    assert completion.choices[0].text == COUNT + plain.text


# ---- completions logprobs ----------------------------------------------------------------------


def check_completion_logprobs(logprobs: dict, text: str, first_offset: int, top: int = 1) -> None:
    """OpenAI's legacy logprobs object: one entry per generated token, whose token is the
    text it added (empty for a skipped special token), the `top` most likely tokens (none
    less likely than the chosen one), offsets into the returned text."""
    tokens = logprobs["tokens"]
    assert tokens and all(isinstance(token, str) for token in tokens)
    assert "".join(tokens) == text
    assert len(logprobs["token_logprobs"]) == len(tokens)
    for logprob in logprobs["token_logprobs"]:
        assert isinstance(logprob, float) and logprob <= 0.0
    for value, alternatives in zip(logprobs["token_logprobs"], logprobs["top_logprobs"]):
        assert len(alternatives) == top
        assert all(alternative >= value for alternative in list(alternatives.values())[:1])
    offsets = logprobs["text_offset"]
    assert offsets[0] == first_offset
    for i in range(1, len(offsets)):
        assert offsets[i] == offsets[i - 1] + len(tokens[i - 1])


@pytest.mark.parametrize("logprobs", [0, 1])
def test_completion_logprobs(server, logprobs):
    result = complete(server.base_url, prompt=COUNT, logprobs=logprobs, **GREEDY)
    choice = result.body["choices"][0]
    check_completion_logprobs(choice["logprobs"], result.text, 0, top=logprobs)
    assert len(choice["logprobs"]["tokens"]) == result.usage["completion_tokens"] == GREEDY["max_tokens"]
    assert result.text == complete(server.base_url, prompt=COUNT, **GREEDY).text


def test_completion_logprobs_absent_is_null(server):
    result = complete(server.base_url, prompt=COUNT, **GREEDY)
    assert result.body["choices"][0]["logprobs"] is None


def test_completion_logprobs_with_echo_count_offsets_from_the_prompt(server):
    """With echo the entries cover the prompt (the first token's logprob null), then the
    completion, whose offsets continue after the prompt."""
    result = complete(server.base_url, prompt=COUNT, logprobs=1, echo=True, **GREEDY)
    logprobs = result.body["choices"][0]["logprobs"]
    assert result.text.startswith(COUNT)
    prompt_tokens = result.usage["prompt_tokens"]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert "".join(logprobs["tokens"][:prompt_tokens]) == COUNT
    completion = {key: values[prompt_tokens:] for key, values in logprobs.items()}
    check_completion_logprobs(completion, result.text[len(COUNT) :], len(COUNT))


def test_completion_logprobs_per_choice(server):
    result = complete(server.base_url, prompt=[COUNT, STORY], logprobs=1, **GREEDY)
    for choice in result.body["choices"]:
        assert len(choice["logprobs"]["tokens"]) == GREEDY["max_tokens"]
        assert "".join(choice["logprobs"]["tokens"]) == choice["text"]


@pytest.mark.parametrize("echo", [False, True])
def test_completion_logprobs_stream(server, echo):
    params = {"prompt": COUNT, "logprobs": 1, "echo": echo, **GREEDY}
    unary = complete(server.base_url, **params)
    streamed = complete_stream(server.base_url, stream_options={"include_usage": True}, **params)
    (choice,) = streamed.choices
    assert streamed.texts == [unary.text]
    expected = unary.body["choices"][0]["logprobs"]
    if echo:  # the prompt's scores came with the echoed prompt; the rest is the completion's
        assert choice.echo_logprobs == {
            key: values[: len(choice.echo_logprobs["tokens"])] for key, values in expected.items()
        }
        expected = {key: values[len(choice.echo_logprobs["tokens"]) :] for key, values in expected.items()}
    tokens, offsets, token_logprobs, top_logprobs = [], [], [], []
    for text, logprobs in choice.pieces:
        assert logprobs is not None
        assert "".join(logprobs["tokens"]) == text  # each chunk's entries cover its own text
        tokens += logprobs["tokens"]
        offsets += logprobs["text_offset"]
        token_logprobs += logprobs["token_logprobs"]
        top_logprobs += logprobs["top_logprobs"]
    assert len(tokens) == streamed.usage["completion_tokens"] == GREEDY["max_tokens"]
    merged = {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": offsets,
    }
    check_completion_logprobs(merged, choice.text[len(choice.echo) :], len(COUNT) if echo else 0)
    assert merged == expected


# ---- chat logprobs ---------------------------------------------------------------------------


def check_chat_logprob_entries(entries: list, text: str) -> None:
    """One entry per generated token: its token is the text it added to the reply (empty
    for a skipped special token, or for a token that ends inside a UTF-8 character, whose
    character the next token completes), its bytes what it added as UTF-8."""
    for entry in entries:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}, entry
        assert isinstance(entry["logprob"], float) and entry["logprob"] <= 0.0
        assert all(isinstance(b, int) and 0 <= b < 256 for b in entry["bytes"])
        assert isinstance(entry["token"], str)
        assert entry["top_logprobs"] == []
    assert "".join(entry["token"] for entry in entries) == text
    assert b"".join(bytes(entry["bytes"]) for entry in entries) == text.encode()


@pytest.mark.parametrize("top_logprobs", [None, 0])
def test_chat_logprobs(server, top_logprobs):
    extra = {} if top_logprobs is None else {"top_logprobs": top_logprobs}
    result = chat(server.base_url, content="Tell me a story", logprobs=True, **GREEDY, **extra)
    logprobs = result.body["choices"][0]["logprobs"]
    assert logprobs["refusal"] is None
    entries = logprobs["content"]
    assert len(entries) == result.usage["completion_tokens"] == GREEDY["max_tokens"]
    check_chat_logprob_entries(entries, result.text)


@pytest.mark.parametrize("logprobs", [None, False])
def test_chat_without_logprobs_is_null(server, logprobs):
    extra = {} if logprobs is None else {"logprobs": logprobs}
    assert chat(server.base_url, content="Hi", **GREEDY, **extra).body["choices"][0]["logprobs"] is None


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_chat_logprobs_count_the_end_of_sequence_token(server, stream):
    """The end token has an entry (it was generated and is counted) that adds no text."""
    params = {**ENDS_BY_ITSELF, "logprobs": True, "temperature": 0, "max_tokens": 24}
    if stream:
        streamed = chat_stream(server.base_url, stream_options={"include_usage": True}, **params)
        (choice,) = streamed.choices
        text, reason, usage = choice.text, choice.finish_reason, streamed.usage
        entries = [entry for logprobs in choice.logprobs for entry in logprobs["content"]]
    else:
        result = chat(server.base_url, **params)
        text, reason, usage = result.text, result.finish_reason, result.usage
        entries = result.body["choices"][0]["logprobs"]["content"]
    assert reason == "stop"
    assert len(entries) == usage["completion_tokens"]
    assert entries[-1]["token"] == "" and entries[-1]["bytes"] == []
    assert embedded_vocabulary().eos_text() not in text
    check_chat_logprob_entries(entries, text)


def test_chat_logprobs_through_an_ignored_end_token(server):
    """With ignore_eos the model writes its end token (the grammar leaves it nothing
    else) and goes on: that entry adds no text, and the entries still join to the text."""
    result = chat(server.base_url, **ENDS_BY_ITSELF, logprobs=True, temperature=0, max_tokens=12, ignore_eos=True)
    entries = result.body["choices"][0]["logprobs"]["content"]
    assert len(entries) == 12 and result.finish_reason == "length"
    assert "" in [entry["token"] for entry in entries]
    check_chat_logprob_entries(entries, result.text)


def test_chat_logprobs_stream(server):
    params = {"content": "Tell me a story", "logprobs": True, **GREEDY}
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


def test_skip_special_tokens_false_keeps_the_end_token(server):
    params = {**ENDS_BY_ITSELF, "temperature": 0, "max_tokens": 24}
    eos = embedded_vocabulary().eos_text()
    skipped = chat(server.base_url, **params)
    assert skipped.finish_reason == "stop" and eos not in skipped.text
    assert chat(server.base_url, skip_special_tokens=True, **params).text == skipped.text
    kept = chat(server.base_url, skip_special_tokens=False, logprobs=True, **params)
    assert kept.text == skipped.text + eos
    assert kept.usage == skipped.usage
    # the kept end token's logprob entry carries its text
    assert kept.body["choices"][0]["logprobs"]["content"][-1]["token"] == eos
    streamed = chat_stream(server.base_url, skip_special_tokens=False, **params)
    assert streamed.texts == [kept.text]


# ---- stop strings and include_stop_str_in_output --------------------------------------------------


def stop_cut(tokens: list[str], stops: list[str], include: bool) -> tuple[str, int]:
    """Where the server must cut `tokens` (each token's text): at the first stop string
    completed, the earliest of those the same token completes; returns the text and the
    number of tokens generated up to that one."""
    text = ""
    for count, token in enumerate(tokens, start=1):
        text += token
        found = [(text.find(stop), stop) for stop in stops if stop in text]
        if found:
            at, stop = min(found)
            return text[: at + (len(stop) if include else 0)], count
    raise AssertionError(f"none of {stops} is in {text!r}")


@pytest.fixture(scope="module")
def count_tokens(server) -> list[str]:
    """The greedy continuation of COUNT, token by token (each token's text)."""
    result = complete(server.base_url, prompt=COUNT, max_tokens=12, temperature=0, ignore_eos=True, logprobs=1)
    tokens = result.body["choices"][0]["logprobs"]["tokens"]
    assert "".join(tokens) == result.text and len(tokens) == 12
    return tokens


def stops_for(case: str, tokens: list[str]) -> list[str]:
    """Stop strings taken from the text before its last token (so a stop cuts it short)."""
    text = "".join(tokens[:-1])
    one = pick_stop_word(text, 1)[0]
    if case == "one":
        return [one]
    if case == "four":  # two that never occur around two that do
        return ["zq\x00", pick_stop_word(text, 2, len(text) // 2)[0], "\x00qz", one]
    assert case == "overlapping"  # a stop string and its own tail
    two = pick_stop_word(text, 2)[0]
    return [two, two[1:]]


@pytest.mark.parametrize(
    "case, include",
    [("one", None), ("one", False), ("one", True), ("four", None), ("four", True), ("overlapping", None)],
)
def test_unary_stop_strings(server, count_tokens, case, include):
    stops = stops_for(case, count_tokens)
    extra = {} if include is None else {"include_stop_str_in_output": include}
    result = complete(server.base_url, prompt=COUNT, max_tokens=12, temperature=0, ignore_eos=True, stop=stops, **extra)
    expected, generated = stop_cut(count_tokens, stops, bool(include))
    assert result.text == expected
    assert result.finish_reason == "stop"
    assert result.usage["completion_tokens"] == generated < 12


@pytest.mark.parametrize("include", [None, True])
@pytest.mark.parametrize("case", ["one", "four"])
def test_streamed_stop_strings_include_the_stop_string(server, count_tokens, case, include):
    stops = stops_for(case, count_tokens)
    extra = {} if include is None else {"include_stop_str_in_output": include}
    streamed = complete_stream(
        server.base_url,
        prompt=COUNT,
        max_tokens=12,
        temperature=0,
        ignore_eos=True,
        stop=stops,
        stream_options={"include_usage": True},
        **extra,
    )
    expected, generated = stop_cut(count_tokens, stops, True)
    assert streamed.texts == [expected]
    assert streamed.finish_reasons == ["stop"]
    assert streamed.usage["completion_tokens"] == generated


COUNTING = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]


@pytest.fixture(scope="module")
def counting_entries(client) -> list:
    """The greedy chat reply to COUNTING, as logprob entries (one per token)."""
    reply = client.chat.completions.create(
        model=MODEL, messages=COUNTING, temperature=0, max_tokens=24, logprobs=True, extra_body={"ignore_eos": True}
    )
    entries = reply.choices[0].logprobs.content
    assert "".join(entry.token for entry in entries) == reply.choices[0].message.content
    return entries


def test_stop_strings_on_chat_through_the_sdk(client, counting_entries):
    tokens = [entry.token for entry in counting_entries]
    text = "".join(tokens[:-1])
    stop = pick_stop_word(text, 1)[0]
    params = {
        "model": MODEL,
        "messages": COUNTING,
        "temperature": 0,
        "max_tokens": 24,
        "extra_body": {"ignore_eos": True},
    }
    stopped = client.chat.completions.create(**params, stop=[stop])
    assert stopped.choices[0].message.content == stop_cut(tokens, [stop], False)[0]
    assert stopped.choices[0].finish_reason == "stop"
    kept = client.chat.completions.create(
        **{**params, "extra_body": {"ignore_eos": True, "include_stop_str_in_output": True}}, stop=stop
    )
    assert kept.choices[0].message.content == stop_cut(tokens, [stop], True)[0]


def test_stop_string_with_n_cuts_every_choice(server):
    # The reference has the same shape (two greedy copies in one request): batching a
    # sequence with others can change its greedy text on some CPUs.
    params = {"prompt": COUNT, "n": 2, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    reference = complete(server.base_url, logprobs=1, **params)
    tokens = reference.body["choices"][0]["logprobs"]["tokens"]
    (stop,) = stops_for("one", tokens)
    result = complete(server.base_url, stop=stop, **params)
    expected, generated = stop_cut(tokens, [stop], False)
    assert result.texts == [expected, expected]
    assert result.finish_reasons == ["stop", "stop"]
    assert result.usage["completion_tokens"] == 2 * generated


# ---- stop_token_ids ------------------------------------------------------------------------------


def stop_token_cut(tokens: list[str], stop_tokens: list[str]) -> tuple[str, int]:
    """The text up to and including the first of `stop_tokens`, and how many tokens."""
    for count, token in enumerate(tokens, start=1):
        if token in stop_tokens:
            return "".join(tokens[:count]), count
    return "".join(tokens), len(tokens)


def ordinary_tokens(tokens: list[str]) -> list[str]:
    """The tokens whose text is exactly one ordinary token of the vocabulary."""
    vocabulary = embedded_vocabulary()
    usable = []
    for token in tokens:
        try:
            vocabulary.token_id(token)
        except AssertionError:
            continue
        usable.append(token)
    return usable


@pytest.fixture(scope="module")
def natural_count(server) -> tuple[list[str], str]:
    """The greedy continuation of COUNT without ignore_eos (which would also turn off
    stop_token_ids in the engine), token by token, and its finish reason."""
    result = complete(server.base_url, prompt=COUNT, max_tokens=12, temperature=0, logprobs=1)
    tokens = result.body["choices"][0]["logprobs"]["tokens"]
    assert len(ordinary_tokens(tokens[:-1])) >= 2, f"the model ended too soon on this CPU: {tokens}"
    return tokens, result.finish_reason


@pytest.mark.parametrize("case", ["one", "two", "none"])
def test_stop_token_ids_keep_the_stop_token(server, natural_count, case):
    tokens, natural_reason = natural_count
    vocabulary = embedded_vocabulary()
    usable = ordinary_tokens(tokens[:-1])
    stop_tokens = {"one": usable[-1:], "two": usable[-1:] + usable[:1], "none": []}[case]
    params = {
        "prompt": COUNT,
        "max_tokens": 12,
        "temperature": 0,
        "stop_token_ids": [vocabulary.token_id(token) for token in stop_tokens],
    }
    result = complete(server.base_url, **params)
    text, generated = stop_token_cut(tokens, stop_tokens)
    assert result.text == text
    assert result.usage["completion_tokens"] == generated
    assert result.finish_reason == ("stop" if stop_tokens else natural_reason)
    streamed = complete_stream(server.base_url, stream_options={"include_usage": True}, **params)
    assert streamed.texts == [result.text]
    assert streamed.finish_reasons == [result.finish_reason]
    assert streamed.usage == result.usage


def test_stop_token_ids_on_chat_through_the_sdk(client):
    params = {"model": MODEL, "messages": COUNTING, "temperature": 0, "max_tokens": 24}
    natural = client.chat.completions.create(**params, logprobs=True)
    tokens = [entry.token for entry in natural.choices[0].logprobs.content]
    usable = ordinary_tokens(tokens[:-1])
    assert usable, f"the model ended too soon on this CPU: {tokens}"
    raw = client.chat.completions.with_raw_response.create(
        **params, extra_body={"stop_token_ids": [embedded_vocabulary().token_id(usable[-1])]}
    )
    body = raw.http_response.json()
    validate(body, "CreateChatCompletionResponse")
    assert body["choices"][0]["message"]["content"] == stop_token_cut(tokens, usable[-1:])[0]
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


def test_nvext_annotations_are_accepted_and_change_nothing(server):
    params = {"content": "Hi", "logprobs": True, **GREEDY}
    annotated = chat(server.base_url, nvext={"annotations": ["request_id"]}, **params)
    plain = chat(server.base_url, **params)
    assert annotated.text == plain.text
    assert annotated.usage == plain.usage
    assert annotated.body["choices"][0]["logprobs"] == plain.body["choices"][0]["logprobs"]


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
