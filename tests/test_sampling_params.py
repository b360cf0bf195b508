"""Sampling parameters against the real server: each accepted value works and changes
what it should (n, best_of, temperature, top_p/top_k/min_p, penalties, seed, min_tokens,
ignore_eos, nvext), unary and streamed, every body and chunk checked against OpenAI's
schema. (The 400s for out-of-range values are in test_validation_rules.py.)"""

from __future__ import annotations

import pytest

from helpers import (
    CHAT_PATHS,
    COMPLETION_PATHS,
    SHORT_ANSWER,
    chat,
    chat_stream,
    check_chat_body,
    check_completion_body,
    complete,
    complete_stream,
    warm_up,
)
from openai_schema import validate_completion_chunk
from sse import MODEL, check_chat_choices, check_completion_choices

CHAT = CHAT_PATHS[0]
COMPLETIONS = COMPLETION_PATHS[0]
STORY = "Once upon a time"
# A prompt the model loops on under greedy decoding, so every penalty changes the text.
REPEATS = "The cat sat on the mat. The cat"
EOS = "<|im_end|>"


def sampled(**params):
    """A seeded, well-randomised sampling request (what truncation / greedy must undo)."""
    return {"prompt": STORY, "max_tokens": 16, "temperature": 1.5, "seed": 3, **params}


@pytest.fixture(autouse=True, scope="module")
def _short_answer_cached(server) -> None:
    """Chat prompts fill whole KV blocks: cache this one before any output is compared."""
    warm_up(server.base_url, CHAT, messages=SHORT_ANSWER)


@pytest.fixture(scope="module")
def greedy_story(server) -> str:
    warm_up(server.base_url, COMPLETIONS, prompt=STORY)
    return complete(server.base_url, prompt=STORY, max_tokens=16, temperature=0).text


# ---- n --------------------------------------------------------------------------------


def test_n_choices_have_their_own_finish_reason_and_usage_sums_them(server):
    # Seed 2 makes one choice run into max_tokens while the others end by themselves.
    result = chat(server.base_url, messages=SHORT_ANSWER, n=3, max_tokens=12, temperature=1, seed=2, logprobs=True)
    assert len(result.texts) == 3
    counts = []
    for choice in result.body["choices"]:
        entries = choice["logprobs"]["content"]
        counts.append(len(entries))
        if choice["finish_reason"] == "length":
            assert len(entries) == 12
        else:  # ended by the end-of-sequence token, whose text is skipped
            assert entries[-1]["token"] == EOS and len(entries) <= 12
            assert EOS not in choice["message"]["content"]
    assert set(result.finish_reasons) == {"stop", "length"}, result.finish_reasons
    assert result.usage["completion_tokens"] == sum(counts)


def test_n_usage_with_ignore_eos_is_n_times_max_tokens(server):
    result = complete(server.base_url, prompt=STORY, n=4, max_tokens=6, temperature=1, seed=1, ignore_eos=True)
    assert result.finish_reasons == ["length"] * 4
    assert result.usage["completion_tokens"] == 24
    # prompt tokens are counted once, not once per choice
    single = complete(server.base_url, prompt=STORY, max_tokens=2)
    assert result.usage["prompt_tokens"] == single.usage["prompt_tokens"]


def test_n_with_a_seed_is_reproducible(server, client):
    warm_up(server.base_url, COMPLETIONS, prompt=STORY)

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
    params = {"prompt": STORY, "max_tokens": 10, "temperature": 1.0}
    warm_up(server.base_url, COMPLETIONS, **params)
    together = complete(server.base_url, n=3, seed=500, **params)
    alone = [complete(server.base_url, seed=500 + i, **params).text for i in range(3)]
    assert together.texts == alone


def test_n_greedy_choices_are_identical(server):
    result = chat(server.base_url, content="Hi", n=2, max_tokens=8, temperature=0)
    assert result.texts[0] == result.texts[1]


def test_n_16_is_the_maximum(server):
    result = chat(server.base_url, content="Hi", n=16, max_tokens=4, temperature=1, seed=9, ignore_eos=True)
    assert len(result.texts) == 16
    assert result.usage["completion_tokens"] == 64


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_n_stream_matches_unary_per_index(server, endpoint):
    params = {"n": 2, "max_tokens": 12, "temperature": 1.0, "seed": 77}
    if endpoint == "chat":
        warm_up(server.base_url, CHAT, content="Tell me about cats.")
        unary = chat(server.base_url, content="Tell me about cats.", **params)
        streamed = chat_stream(
            server.base_url, content="Tell me about cats.", stream_options={"include_usage": True}, **params
        )
    else:
        warm_up(server.base_url, COMPLETIONS, prompt=STORY)
        unary = complete(server.base_url, prompt=STORY, **params)
        streamed = complete_stream(server.base_url, prompt=STORY, stream_options={"include_usage": True}, **params)
    indices = {chunk["choices"][0]["index"] for chunk in streamed.chunks if chunk["choices"]}
    assert indices == {0, 1}
    assert streamed.texts == unary.texts
    assert streamed.finish_reasons == unary.finish_reasons
    assert streamed.usage == unary.usage


def test_sdk_chat_stream_with_n(server, client):
    messages = [{"role": "user", "content": "Name a colour."}]
    warm_up(server.base_url, CHAT, messages=messages)
    params = {"model": MODEL, "messages": messages, "n": 2, "max_tokens": 10, "temperature": 1.0, "seed": 5}
    unary = client.chat.completions.create(**params)
    stream = client.chat.completions.create(**params, stream=True)
    streamed = check_chat_choices([chunk.model_dump(exclude_unset=True) for chunk in stream], 2)
    assert streamed.texts == [choice.message.content for choice in unary.choices]
    assert streamed.finish_reasons == [choice.finish_reason for choice in unary.choices]


# ---- best_of: beam search ---------------------------------------------------------------


def test_beam_search_returns_n_distinct_deterministic_beams(server, client):
    warm_up(server.base_url, COMPLETIONS, prompt=STORY)

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
    params = {"model": MODEL, "messages": SHORT_ANSWER, "max_tokens": 12, "temperature": 0}
    warm_up(server.base_url, CHAT, messages=SHORT_ANSWER)
    raw = client.chat.completions.with_raw_response.create(**params, extra_body={"best_of": 2})
    first = check_chat_body(raw.http_response.json())
    again = check_chat_body(
        client.chat.completions.with_raw_response.create(**params, extra_body={"best_of": 2}).http_response.json()
    )
    assert first.text and first.text == again.text


@pytest.mark.parametrize("length_penalty", [0.0, 0.5, 2.0, -1.0])
def test_length_penalty_is_accepted(server, length_penalty):
    result = complete(
        server.base_url, prompt=STORY, best_of=2, n=2, temperature=0, max_tokens=6, length_penalty=length_penalty
    )
    assert all(result.texts)


def test_diversity_penalty_changes_the_beams(server):
    params = {"prompt": STORY, "best_of": 2, "n": 2, "temperature": 0, "max_tokens": 8}
    plain = complete(server.base_url, **params)
    zero = complete(server.base_url, diversity_penalty=0.0, **params)
    diverse = complete(server.base_url, diversity_penalty=1.5, **params)
    assert zero.texts == plain.texts
    assert diverse.texts != plain.texts
    assert len(diverse.texts) == 2


# ---- temperature, truncation, seed ------------------------------------------------------


def test_temperature_zero_is_greedy_whatever_the_seed(server, greedy_story):
    assert complete(server.base_url, **sampled(temperature=0)).text == greedy_story
    assert complete(server.base_url, **sampled(temperature=0, seed=99)).text == greedy_story


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_sampling_differs_from_greedy(server, greedy_story, temperature):
    assert complete(server.base_url, **sampled(temperature=temperature)).text != greedy_story


@pytest.mark.parametrize(
    "truncation",
    [{"top_k": 1}, {"top_p": 1e-6}, {"min_p": 0.99}, {"nvext": {"top_k": 1}}],
    ids=["top_k-1", "top_p-tiny", "min_p-0.99", "nvext.top_k-1"],
)
def test_truncation_to_one_token_is_greedy(server, greedy_story, truncation):
    assert complete(server.base_url, **sampled(**truncation)).text == greedy_story


@pytest.mark.xfail(
    strict=True,
    reason="OpenVINO GenAI 2026.4.1's sampler: with top_p over many candidates (top_k -1, or"
    " 1000 and up) the token kept is at times not the most likely one; small top_k is exact",
)
def test_top_p_over_all_tokens_keeps_the_most_likely_one(server, greedy_story):
    """top_p=1e-6 keeps only the most likely token, also with top_k=-1 (no top-k cut)."""
    assert complete(server.base_url, **sampled(top_k=2, top_p=1e-6)).text == greedy_story
    assert complete(server.base_url, **sampled(top_k=-1, top_p=1e-6)).text == greedy_story


def test_same_seed_same_text_different_seed_different_text(server, client):
    messages = [{"role": "user", "content": "Write a poem about the sea."}]
    warm_up(server.base_url, CHAT, messages=messages)

    def text(seed):
        return client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=24,
            temperature=1.0,
            seed=seed,
        ).choices[0].message.content

    first = text(42)
    assert first and text(42) == first
    assert text(43) != first


@pytest.mark.parametrize("seed", [0, 4294967295])
def test_boundary_seeds_are_reproducible(server, seed):
    params = sampled(seed=seed, max_tokens=8)
    assert complete(server.base_url, **params).text == complete(server.base_url, **params).text


@pytest.mark.xfail(
    strict=True,
    reason="OpenVINO GenAI 2026.4: reusing a prompt's KV blocks from the prefix cache shifts"
    " logits by ~0.03-0.15 (u8 KV cache vs fresh prefill); exact with --no-enable-prefix-caching",
)
def test_output_does_not_depend_on_the_prefix_cache(server):
    """The same greedy request must give the same tokens and log-probabilities whether
    or not the engine finds its prompt in the prefix cache.

    Known failure (OpenVINO GenAI 2026.4 with enable_prefix_caching, ovtrio's default):
    once a request that generated a single token has left this prompt's KV in the cache,
    the next request reuses it and gets logits off by ~0.03-0.15 in log-probability,
    enough to change sampled (and sometimes greedy) text. With --no-enable-prefix-caching
    the results are identical. Prompts of 32+ tokens (every chat prompt) hit the same
    path for their full blocks after their first request.
    """
    params = {"prompt": "In a quiet village by the sea, an old fisherman", "max_tokens": 6, "temperature": 0}
    cold = complete(server.base_url, logprobs=1, **params)
    complete(server.base_url, **{**params, "max_tokens": 1})
    cached = complete(server.base_url, logprobs=1, **params)
    assert cached.text == cold.text
    assert cached.body["choices"][0]["logprobs"]["token_logprobs"] == pytest.approx(
        cold.body["choices"][0]["logprobs"]["token_logprobs"], abs=1e-3
    )


# ---- penalties ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def greedy_repeats(server) -> str:
    warm_up(server.base_url, COMPLETIONS, prompt=REPEATS)
    return complete(server.base_url, prompt=REPEATS, max_tokens=24, temperature=0).text


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
    assert complete(server.base_url, prompt=REPEATS, max_tokens=24, temperature=0, **penalty).text != greedy_repeats


@pytest.mark.parametrize(
    "neutral",
    [{"repetition_penalty": 1.0}, {"presence_penalty": 0.0}, {"frequency_penalty": 0.0}],
    ids=lambda p: next(iter(p)),
)
def test_neutral_penalties_change_nothing(server, greedy_repeats, neutral):
    assert complete(server.base_url, prompt=REPEATS, max_tokens=24, temperature=0, **neutral).text == greedy_repeats


def test_nvext_repetition_penalty_overrides_the_top_level_one(server, greedy_repeats):
    params = {"prompt": REPEATS, "max_tokens": 24, "temperature": 0}
    top_level = complete(server.base_url, repetition_penalty=1.5, **params).text
    assert top_level != greedy_repeats
    overridden = complete(server.base_url, repetition_penalty=1.5, nvext={"repetition_penalty": 1.0}, **params)
    assert overridden.text == greedy_repeats
    assert complete(server.base_url, nvext={"repetition_penalty": 1.5}, **params).text == top_level


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
        warm_up(server.base_url, CHAT, content="Tell me a short story about a cat.")
        unary = chat(server.base_url, content="Tell me a short story about a cat.", **MIXED_GREEDY)
        streamed = chat_stream(server.base_url, content="Tell me a short story about a cat.", **usage, **MIXED_GREEDY)
    else:
        unary = complete(server.base_url, prompt=REPEATS, **MIXED_GREEDY)
        streamed = complete_stream(server.base_url, prompt=REPEATS, **usage, **MIXED_GREEDY)
    assert streamed.texts == [unary.text]
    assert streamed.finish_reasons == [unary.finish_reason]
    assert streamed.usage == unary.usage


# ---- min_tokens, ignore_eos ----------------------------------------------------------------


def test_min_tokens_holds_off_the_end_of_sequence(server):
    natural = chat(server.base_url, messages=SHORT_ANSWER, max_tokens=24, temperature=0)
    assert natural.finish_reason == "stop" and natural.usage["completion_tokens"] < 16
    forced = chat(server.base_url, messages=SHORT_ANSWER, max_tokens=24, temperature=0, min_tokens=16)
    assert forced.usage["completion_tokens"] >= 16
    assert forced.text.startswith(natural.text) and len(forced.text) > len(natural.text)
    # min_tokens below the natural length changes nothing
    low = chat(server.base_url, messages=SHORT_ANSWER, max_tokens=24, temperature=0, min_tokens=2)
    assert low.text == natural.text and low.usage == natural.usage


def test_min_tokens_in_a_stream(server):
    streamed = chat_stream(
        server.base_url,
        messages=SHORT_ANSWER,
        max_tokens=24,
        temperature=0,
        min_tokens=16,
        stream_options={"include_usage": True},
    )
    assert streamed.usage["completion_tokens"] >= 16


def test_min_tokens_equal_to_max_tokens(client):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=SHORT_ANSWER, max_tokens=20, temperature=0, extra_body={"min_tokens": 20}
    )
    result = check_chat_body(raw.http_response.json())
    assert result.usage["completion_tokens"] == 20
    assert result.finish_reason == "length"


def test_ignore_eos_runs_to_max_tokens(server):
    natural = chat(server.base_url, messages=SHORT_ANSWER, max_tokens=16, temperature=0)
    assert natural.usage["completion_tokens"] < 16
    forced = chat(server.base_url, messages=SHORT_ANSWER, max_tokens=16, temperature=0, ignore_eos=True)
    assert forced.usage["completion_tokens"] == 16 and forced.finish_reason == "length"
    streamed = chat_stream(
        server.base_url,
        messages=SHORT_ANSWER,
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
    assert complete(server.base_url, **sampled(nvext={"greedy_sampling": False})).text != greedy_story


def test_nvext_greedy_sampling_through_the_sdk_stream(client, greedy_story):
    stream = client.completions.create(
        model=MODEL,
        prompt=STORY,
        max_tokens=16,
        temperature=1.5,
        seed=3,
        stream=True,
        extra_body={"nvext": {"greedy_sampling": True}},
    )
    chunks = [chunk.model_dump(exclude_unset=True) for chunk in stream]
    for chunk in chunks:
        validate_completion_chunk(chunk)
    assert check_completion_choices(chunks).texts == [greedy_story]


def test_nvext_ignore_eos(server):
    params = {"messages": SHORT_ANSWER, "max_tokens": 16, "temperature": 0}
    forced = chat(server.base_url, nvext={"ignore_eos": True}, **params)
    assert forced.usage["completion_tokens"] == 16 and forced.finish_reason == "length"
    # nvext wins over the top-level field, both ways
    natural = chat(server.base_url, ignore_eos=True, nvext={"ignore_eos": False}, **params)
    assert natural.finish_reason == "stop" and natural.usage["completion_tokens"] < 16
    streamed = chat_stream(
        server.base_url, nvext={"ignore_eos": True}, stream_options={"include_usage": True}, **params
    )
    assert streamed.usage["completion_tokens"] == 16 and streamed.finish_reasons == ["length"]
