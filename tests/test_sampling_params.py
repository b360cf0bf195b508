"""Sampling parameters against the real server: each accepted value works and changes
what it should (n, best_of, temperature, top_p/top_k/min_p, penalties, seed, min_tokens,
ignore_eos, nvext), unary and streamed, every body and chunk checked against OpenAI's
schema. (The 400s for out-of-range values are in test_validation_rules.py.)"""

from __future__ import annotations

import pytest

from helpers import (
    CHAT_PATHS,
    COMPLETION_PATHS,
    ENDS_BY_ITSELF,
    chat,
    chat_stream,
    check_chat_body,
    check_completion_body,
    complete,
    complete_stream,
)
from openai_schema import validate_completion_chunk
from sse import MODEL, check_chat_choices, check_completion_choices

CHAT = CHAT_PATHS[0]
COMPLETIONS = COMPLETION_PATHS[0]
STORY = "Once upon a time"
# Prompts whose continuations repeat words: a penalty that works changes the greedy text
# of at least one of them (which one depends on the CPU).
REPEATS = ["The cat sat on the mat. The cat", "one two three one two three one", "Hello hello hello hello"]


def sampled(**params):
    """A seeded, well-randomised sampling request (what truncation / greedy must undo)."""
    return {"prompt": STORY, "max_tokens": 16, "temperature": 1.5, "seed": 3, "ignore_eos": True, **params}


@pytest.fixture(scope="module")
def greedy_story(server) -> str:
    return complete(server.base_url, prompt=STORY, max_tokens=16, temperature=0, ignore_eos=True).text


# ---- n --------------------------------------------------------------------------------


def unique_piece(text: str, others: list[str]) -> str:
    """A stop string from the later part of `text` that none of `others` contains."""
    for length in (8, 6, 4):
        for start in range(len(text) // 3, len(text) - length):
            word = text[start : start + length]
            if word.strip() == word and not any(word in other for other in others):
                return word
    raise AssertionError(f"no piece of {text!r} is missing from {others!r}")


def test_n_choices_have_their_own_finish_reason_and_usage_sums_them(server):
    params = {"prompt": STORY, "n": 3, "max_tokens": 16, "temperature": 1.0, "seed": 2, "ignore_eos": True}
    sampled = complete(server.base_url, **params)
    # A stop string that choice 0 writes and the others do not: choice 0 stops there,
    # the others run into max_tokens.
    stop = unique_piece(sampled.texts[0], sampled.texts[1:])
    result = complete(server.base_url, stop=stop, logprobs=1, **params)
    assert result.texts[0] == sampled.texts[0][: sampled.texts[0].find(stop)]
    assert result.finish_reasons[0] == "stop"
    assert "length" in result.finish_reasons[1:]
    counts = []
    for choice in result.body["choices"]:
        counts.append(len(choice["logprobs"]["tokens"]))
        if choice["finish_reason"] == "length":
            assert counts[-1] == 16
    assert counts[0] < 16
    assert result.usage["completion_tokens"] == sum(counts)


def test_n_usage_with_ignore_eos_is_n_times_max_tokens(server):
    result = complete(server.base_url, prompt=STORY, n=4, max_tokens=6, temperature=1, seed=1, ignore_eos=True)
    assert result.finish_reasons == ["length"] * 4
    assert result.usage["completion_tokens"] == 24
    # prompt tokens are counted once, not once per choice
    single = complete(server.base_url, prompt=STORY, max_tokens=2)
    assert result.usage["prompt_tokens"] == single.usage["prompt_tokens"]


def test_n_with_a_seed_is_reproducible(server, client):

    def texts():
        raw = client.completions.with_raw_response.create(
            model=MODEL, prompt=STORY, n=3, seed=1234, temperature=1.0, max_tokens=12
        )
        return check_completion_body(raw.http_response.json(), choices=3).texts

    first, second = texts(), texts()
    assert first == second
    assert len(set(first)) > 1, "n sampled choices should differ from each other"


def test_n_without_a_seed_samples_independent_choices(server):
    result = complete(server.base_url, prompt=STORY, n=4, max_tokens=12, temperature=1.0)
    assert len(set(result.texts)) > 1, result.texts
    again = complete(server.base_url, prompt=STORY, n=4, max_tokens=12, temperature=1.0)
    assert again.texts != result.texts


def test_choice_i_is_sampled_with_seed_plus_i(server):
    # Two requests of the same shape (three choices running to max_tokens), seeded one
    # apart: their choices overlap by two. (A choice run alone can differ on some CPUs,
    # where a sequence's logits change with the number of sequences stepped beside it.)
    params = {"prompt": STORY, "max_tokens": 10, "temperature": 1.0, "ignore_eos": True, "n": 3}
    first = complete(server.base_url, seed=500, **params)
    second = complete(server.base_url, seed=501, **params)
    assert first.texts[1:] == second.texts[:2]
    assert len(set(first.texts)) > 1


def test_n_greedy_choices_are_identical(server):
    result = chat(server.base_url, content="Hi", n=2, max_tokens=8, temperature=0, ignore_eos=True)
    assert result.texts[0] == result.texts[1]


def test_n_16_is_the_maximum(server):
    result = chat(server.base_url, content="Hi", n=16, max_tokens=4, temperature=1, seed=9, ignore_eos=True)
    assert len(result.texts) == 16
    assert result.usage["completion_tokens"] == 64


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_n_stream_matches_unary_per_index(server, endpoint):
    params = {"n": 2, "max_tokens": 12, "temperature": 1.0, "seed": 77}
    if endpoint == "chat":
        unary = chat(server.base_url, content="Tell me about cats.", **params)
        streamed = chat_stream(
            server.base_url, content="Tell me about cats.", stream_options={"include_usage": True}, **params
        )
    else:
        unary = complete(server.base_url, prompt=STORY, **params)
        streamed = complete_stream(server.base_url, prompt=STORY, stream_options={"include_usage": True}, **params)
    indices = {chunk["choices"][0]["index"] for chunk in streamed.chunks if chunk["choices"]}
    assert indices == {0, 1}
    assert streamed.texts == unary.texts
    assert streamed.finish_reasons == unary.finish_reasons
    assert streamed.usage == unary.usage


def test_sdk_chat_stream_with_n(server, client):
    messages = [{"role": "user", "content": "Name a colour."}]
    params = {"model": MODEL, "messages": messages, "n": 2, "max_tokens": 10, "temperature": 1.0, "seed": 5}
    unary = client.chat.completions.create(**params)
    stream = client.chat.completions.create(**params, stream=True)
    streamed = check_chat_choices([chunk.model_dump(exclude_unset=True) for chunk in stream], 2)
    assert streamed.texts == [choice.message.content for choice in unary.choices]
    assert streamed.finish_reasons == [choice.finish_reason for choice in unary.choices]


# ---- best_of: beam search ---------------------------------------------------------------


def test_beam_search_returns_n_distinct_deterministic_beams(server, client):

    def beams():
        raw = client.completions.with_raw_response.create(
            model=MODEL, prompt=STORY, best_of=3, n=2, temperature=0, max_tokens=8
        )
        return check_completion_body(raw.http_response.json(), choices=2)

    first, second = beams(), beams()
    assert first.texts == second.texts
    assert first.texts[0] != first.texts[1]
    assert first.usage["completion_tokens"] == 16


def test_beam_search_stream_matches_unary(server):
    params = {"prompt": STORY, "best_of": 3, "n": 2, "temperature": 0, "max_tokens": 8}
    unary = complete(server.base_url, **params)
    streamed = complete_stream(server.base_url, stream_options={"include_usage": True}, **params)
    assert streamed.texts == unary.texts
    assert streamed.finish_reasons == unary.finish_reasons
    assert streamed.usage == unary.usage


def test_beam_search_on_chat(server, client):
    params = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "temperature": 0}
    raw = client.chat.completions.with_raw_response.create(**params, extra_body={"best_of": 2, "ignore_eos": True})
    first = check_chat_body(raw.http_response.json())
    again = check_chat_body(
        client.chat.completions.with_raw_response.create(
            **params, extra_body={"best_of": 2, "ignore_eos": True}
        ).http_response.json()
    )
    assert first.text == again.text and first.usage == again.usage


@pytest.mark.parametrize("length_penalty", [0.0, 0.5, 2.0, -1.0])
def test_length_penalty_only_weighs_beams_of_different_lengths(server, length_penalty):
    """Beams that all run to max_tokens have one length, so no length penalty can change
    which of them are best: the reply is the plain beam search's."""
    params = {"prompt": STORY, "best_of": 2, "n": 2, "temperature": 0, "max_tokens": 6, "ignore_eos": True}
    plain = complete(server.base_url, **params)
    result = complete(server.base_url, length_penalty=length_penalty, **params)
    assert result.texts == plain.texts
    assert result.usage == plain.usage and result.finish_reasons == ["length", "length"]


def test_diversity_penalty_runs_group_beam_search(server):
    """(How the penalty reaches the engine's config is checked in test_sampling_defaults.)"""
    params = {"prompt": STORY, "best_of": 2, "n": 2, "temperature": 0, "max_tokens": 8, "ignore_eos": True}
    plain = complete(server.base_url, **params)
    zero = complete(server.base_url, diversity_penalty=0.0, **params)
    diverse = complete(server.base_url, diversity_penalty=1.5, **params)
    assert zero.texts == plain.texts
    assert len(diverse.texts) == 2 and diverse.finish_reasons == ["length", "length"]
    assert diverse.usage["completion_tokens"] == 16
    assert complete(server.base_url, diversity_penalty=1.5, **params).texts == diverse.texts


# ---- temperature, truncation, seed ------------------------------------------------------


def test_temperature_zero_is_greedy_whatever_the_seed(server, greedy_story):
    assert complete(server.base_url, **sampled(temperature=0)).text == greedy_story
    assert complete(server.base_url, **sampled(temperature=0, seed=99)).text == greedy_story


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_sampling_differs_from_greedy(server, greedy_story, temperature):
    # (One seed could happen to write the greedy text; five seeds all doing so cannot. The
    # five choices of one request are sampled with seeds 0-4.)
    texts = complete(server.base_url, **sampled(temperature=temperature, seed=0, n=5)).texts
    assert len(texts) == 5 and any(text != greedy_story for text in texts)


@pytest.mark.parametrize(
    "truncation",
    [{"top_k": 1}, {"top_k": 2, "top_p": 1e-6}, {"nvext": {"top_k": 1}}],
    ids=["top_k-1", "top_k-2-top_p-tiny", "nvext.top_k-1"],
)
def test_truncation_to_one_token_is_greedy(server, greedy_story, truncation):
    assert complete(server.base_url, **sampled(**truncation)).text == greedy_story


@pytest.mark.parametrize("truncation", [{"top_p": 1e-6}, {"top_k": 1}], ids=["top_p-tiny", "top_k-1"])
def test_truncation_to_one_token_leaves_the_seed_nothing_to_choose(server, truncation):
    """Over the whole vocabulary the engine's top_p filter keeps the first token of its sort,
    which is not always greedy's on every CPU (docs/determinism.md#known-engine-behaviours),
    so the text is not always greedy's; but it keeps one token, so five seeds write the
    same text, where untruncated sampling gives them five different ones."""
    untruncated = complete(server.base_url, **sampled(seed=0, n=5)).texts
    assert len(set(untruncated)) > 1
    assert len(set(complete(server.base_url, **sampled(seed=0, n=5, **truncation)).texts)) == 1


# A prompt whose greedy continuation is far ahead of the runner-up at most positions.
COUNTING = "1, 2, 3, 4, 5,"
# Log-probability margin between the best and the second token (as the scoring path
# reports them) below which a position counts as a near tie: the scoring pass rounds
# otherwise than decode steps, by up to 0.25 seen (docs/determinism.md).
NEAR_TIE = 1.0


def test_min_p_near_one_keeps_only_the_best_token_until_a_tie(server):
    """min_p keeps every token at least min_p times as likely as the best one: at 0.999999
    the best and any tied with it. Logits computed in bf16 tie often, so five seeds may
    part at a tie (on an AVX-512 BF16 AMD EPYC they do, every run); up to the first near
    tie each of them writes the tokens that top_k 1 picks in a request of the same shape,
    where untruncated sampling leaves them."""
    params = sampled(prompt=COUNTING, seed=0, n=5)
    best = complete(server.base_url, top_k=1, logprobs=2, **params).body["choices"][0]["logprobs"]
    prefix = ""
    for token, top in zip(best["tokens"], best["top_logprobs"]):
        first, second = sorted(top.values(), reverse=True)[:2]
        if top[token] != first or first - second < NEAR_TIE:
            break
        prefix += token
    assert len(prefix) >= len(" 6, 7,")
    assert all(text.startswith(prefix) for text in complete(server.base_url, min_p=0.999999, **params).texts)
    assert not all(text.startswith(prefix) for text in complete(server.base_url, **params).texts)


def test_same_seed_same_text_different_seed_different_text(server, client):
    messages = [{"role": "user", "content": "Write a poem about the sea."}]

    def text(seed):
        return (
            client.chat.completions.create(
                model=MODEL,
                messages=messages,
                max_tokens=24,
                temperature=1.0,
                seed=seed,
            )
            .choices[0]
            .message.content
        )

    first = text(42)
    assert first and text(42) == first
    assert text(43) != first


@pytest.mark.parametrize("seed", [0, 4294967295])
def test_boundary_seeds_are_reproducible(server, seed):
    params = sampled(seed=seed, max_tokens=8)
    assert complete(server.base_url, **params).text == complete(server.base_url, **params).text


# ---- penalties ---------------------------------------------------------------------------


PENALTY_GREEDY = {"max_tokens": 24, "temperature": 0, "ignore_eos": True}


def repeats_texts(server, **penalty) -> list[str]:
    """The greedy continuations of REPEATS, all three in one request: added to the engine
    together, they are batched the same way every time, so two runs compare exactly."""
    return complete(server.base_url, prompt=REPEATS, **PENALTY_GREEDY, **penalty).texts


@pytest.fixture(scope="module")
def greedy_repeats(server) -> list[str]:
    return repeats_texts(server)


@pytest.mark.parametrize(
    "penalty",
    [
        {"repetition_penalty": 1.5},
        {"repetition_penalty": 2.0},
        {"repetition_penalty": 0.5},
        {"presence_penalty": 2.0},
        {"presence_penalty": -2.0},
        {"frequency_penalty": 2.0},
        {"frequency_penalty": -2.0},
        {"nvext": {"repetition_penalty": 1.5}},
    ],
    ids=lambda p: "-".join(f"{k}={v}" for k, v in p.items()),
)
def test_penalties_change_greedy_text(server, greedy_repeats, penalty):
    assert repeats_texts(server, **penalty) != greedy_repeats


@pytest.mark.parametrize(
    "neutral",
    [{"repetition_penalty": 1.0}, {"presence_penalty": 0.0}, {"frequency_penalty": 0.0}],
    ids=lambda p: next(iter(p)),
)
def test_neutral_penalties_change_nothing(server, greedy_repeats, neutral):
    assert repeats_texts(server, **neutral) == greedy_repeats


def test_nvext_repetition_penalty_overrides_the_top_level_one(server, greedy_repeats):
    top_level = repeats_texts(server, repetition_penalty=1.5)
    assert top_level != greedy_repeats
    assert repeats_texts(server, repetition_penalty=1.5, nvext={"repetition_penalty": 1.0}) == greedy_repeats
    assert repeats_texts(server, nvext={"repetition_penalty": 1.5}) == top_level


MIXED_GREEDY = {
    "temperature": 0,
    "max_tokens": 20,
    "repetition_penalty": 1.2,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.3,
    "top_k": 5,
    "top_p": 0.9,
    "min_p": 0.05,
}


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_stream_matches_unary_with_penalties_under_greedy(server, path):
    usage = {"stream_options": {"include_usage": True}}
    if path == CHAT:
        unary = chat(server.base_url, content="Tell me a short story about a cat.", **MIXED_GREEDY)
        streamed = chat_stream(server.base_url, content="Tell me a short story about a cat.", **usage, **MIXED_GREEDY)
    else:
        unary = complete(server.base_url, prompt=REPEATS[0], **MIXED_GREEDY)
        streamed = complete_stream(server.base_url, prompt=REPEATS[0], **usage, **MIXED_GREEDY)
    assert streamed.texts == [unary.text]
    assert streamed.finish_reasons == [unary.finish_reason]
    assert streamed.usage == unary.usage


# ---- min_tokens, ignore_eos ----------------------------------------------------------------


def test_min_tokens_holds_off_the_end_of_sequence(server):
    natural = chat(server.base_url, **ENDS_BY_ITSELF, max_tokens=24, temperature=0)
    assert natural.finish_reason == "stop" and natural.usage["completion_tokens"] < 16
    forced = chat(server.base_url, **ENDS_BY_ITSELF, max_tokens=24, temperature=0, min_tokens=16)
    assert forced.usage["completion_tokens"] >= 16
    assert forced.text.startswith(natural.text)
    # As in vLLM, min_tokens counts the tokens before the end token may come: as many as
    # the natural reply has before its end token changes nothing.
    before_end = natural.usage["completion_tokens"] - 1
    low = chat(server.base_url, **ENDS_BY_ITSELF, max_tokens=24, temperature=0, min_tokens=before_end)
    assert low.text == natural.text and low.usage == natural.usage
    one_more = chat(server.base_url, **ENDS_BY_ITSELF, max_tokens=24, temperature=0, min_tokens=before_end + 1)
    assert one_more.usage["completion_tokens"] > natural.usage["completion_tokens"]


def test_min_tokens_in_a_stream(server):
    streamed = chat_stream(
        server.base_url,
        **ENDS_BY_ITSELF,
        max_tokens=24,
        temperature=0,
        min_tokens=16,
        stream_options={"include_usage": True},
    )
    assert streamed.usage["completion_tokens"] >= 16


def test_min_tokens_equal_to_max_tokens(client):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=ENDS_BY_ITSELF["messages"],
        response_format=ENDS_BY_ITSELF["response_format"],
        max_tokens=20,
        temperature=0,
        extra_body={"min_tokens": 20},
    )
    result = check_chat_body(raw.http_response.json())
    assert result.usage["completion_tokens"] == 20
    assert result.finish_reason == "length"


def test_ignore_eos_runs_to_max_tokens(server):
    natural = chat(server.base_url, **ENDS_BY_ITSELF, max_tokens=16, temperature=0)
    assert natural.usage["completion_tokens"] < 16 and natural.finish_reason == "stop"
    forced = chat(server.base_url, **ENDS_BY_ITSELF, max_tokens=16, temperature=0, ignore_eos=True)
    assert forced.usage["completion_tokens"] == 16 and forced.finish_reason == "length"
    assert forced.text.startswith(natural.text)
    streamed = chat_stream(
        server.base_url,
        **ENDS_BY_ITSELF,
        max_tokens=16,
        temperature=0,
        ignore_eos=True,
        stream_options={"include_usage": True},
    )
    assert streamed.usage["completion_tokens"] == 16
    assert streamed.texts == [forced.text]


# ---- nvext (Dynamo's extension) ------------------------------------------------------------


def test_nvext_greedy_sampling_overrides_temperature(server, greedy_story):
    assert complete(server.base_url, **sampled(nvext={"greedy_sampling": True})).text == greedy_story
    # Sampling at temperature 1.5 leaves the greedy text within a few seeds (most often at
    # the first); stop at the first that does.
    sampled_texts = (
        complete(server.base_url, **sampled(seed=seed, nvext={"greedy_sampling": False})).text for seed in range(5)
    )
    assert any(text != greedy_story for text in sampled_texts)


def test_nvext_greedy_sampling_through_the_sdk_stream(client, greedy_story):
    stream = client.completions.create(
        model=MODEL,
        prompt=STORY,
        max_tokens=16,
        temperature=1.5,
        seed=3,
        stream=True,
        extra_body={"nvext": {"greedy_sampling": True}, "ignore_eos": True},
    )
    chunks = [chunk.model_dump(exclude_unset=True) for chunk in stream]
    for chunk in chunks:
        validate_completion_chunk(chunk)
    assert check_completion_choices(chunks).texts == [greedy_story]


def test_nvext_ignore_eos(server):
    params = {**ENDS_BY_ITSELF, "max_tokens": 16, "temperature": 0}
    forced = chat(server.base_url, nvext={"ignore_eos": True}, **params)
    assert forced.usage["completion_tokens"] == 16 and forced.finish_reason == "length"
    # nvext wins over the top-level field, both ways
    natural = chat(server.base_url, ignore_eos=True, nvext={"ignore_eos": False}, **params)
    assert natural.finish_reason == "stop" and natural.usage["completion_tokens"] < 16
    streamed = chat_stream(
        server.base_url, nvext={"ignore_eos": True}, stream_options={"include_usage": True}, **params
    )
    assert streamed.usage["completion_tokens"] == 16 and streamed.finish_reasons == ["length"]
