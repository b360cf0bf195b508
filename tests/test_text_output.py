"""Pure logic of turning token ids into text: stop strings, and both detokenizers checked
against the model's own detokenizer on the embedded model's vocabulary."""

from __future__ import annotations

import random

import pytest

from ovtrio.model import embedded_model_path
from ovtrio.scheduler.text_output import IncrementalDetokenizer, StopMatcher, VocabularyDetokenizer, decode_batch
from ovtrio.text.vocabulary import load_vocabulary

TEXTS = [
    "The quick brown fox jumps over the lazy dog.\n\nIt was a bright cold day in April.",
    "Ünïcödé: café, naïve, 東京タワー, Привет мир, 🙂🚀🎉, ∑∞≠ and more.",
    "def add(a, b):\n    return a + b  # two spaces\n\tindent",
]


def feed_all(matcher: StopMatcher, pieces: list[str]) -> tuple[str, str | None]:
    out = []
    for piece in pieces:
        text, matched = matcher.feed(piece)
        out.append(text)
        if matched is not None:
            return "".join(out), matched
    out.append(matcher.flush())
    return "".join(out), None


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_split_across_pieces_is_caught(include):
    text, matched = feed_all(StopMatcher(["STOP"], include), ["Hello S", "T", "OP and more"])
    assert matched == "STOP"
    assert text == ("Hello STOP" if include else "Hello ")


def test_stop_matcher_holds_back_only_a_possible_stop_prefix():
    matcher = StopMatcher(["abc"], False)
    assert matcher.feed("xxab") == ("xx", None)  # "ab" may still become "abc"
    assert matcher.feed("d") == ("a", None)  # the last len("abc") - 1 characters wait
    assert matcher.flush() == "bd"


def test_earliest_of_several_stops_wins():
    assert feed_all(StopMatcher(["world", "lo"], False), ["hello world"]) == ("hel", "lo")


def test_no_stops_passes_everything_through():
    matcher = StopMatcher([], False)
    assert matcher.feed("anything") == ("anything", None)
    assert matcher.flush() == ""


@pytest.fixture(scope="module")
def tokenizer(embedded_pipeline):
    return embedded_pipeline.get_tokenizer()


@pytest.fixture(scope="module")
def vocabulary(tokenizer):
    vocabulary = load_vocabulary(embedded_model_path(), "gguf", tokenizer)
    assert vocabulary is not None, "the embedded model has a byte-level vocabulary"
    return vocabulary


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).input_ids.data[0].tolist()


def random_splits(ids: list[int], rng: random.Random) -> list[list[int]]:
    pieces, at = [], 0
    while at < len(ids):
        size = rng.randint(1, 3)
        pieces.append(ids[at : at + size])
        at += size
    return pieces


@pytest.mark.parametrize("text", TEXTS)
def test_vocabulary_detokenizer_streams_exactly_the_engine_text(tokenizer, vocabulary, text):
    ids = ids_of(tokenizer, text)
    rng = random.Random(7)
    for _ in range(5):
        detokenizer = VocabularyDetokenizer(vocabulary.token_bytes, vocabulary.special_ids)
        streamed = []
        for piece in random_splits(ids, rng):
            detokenizer.append(piece)
            streamed.append(decode_batch(tokenizer, [detokenizer])[0])
        assert "".join(streamed) == tokenizer.decode(ids) == text


@pytest.mark.parametrize("text", TEXTS)
def test_engine_window_detokenizer_streams_exactly_the_engine_text(tokenizer, text):
    prompt = ids_of(tokenizer, "Say something:")
    ids = ids_of(tokenizer, text)
    rng = random.Random(11)
    detokenizer = IncrementalDetokenizer(prompt)
    streamed = []
    for piece in random_splits(ids, rng):
        detokenizer.append(piece)
        streamed.append(decode_batch(tokenizer, [detokenizer])[0])
    assert "".join(streamed) == text


def test_special_tokens_are_skipped_unless_asked_for(tokenizer, vocabulary):
    end = tokenizer.get_eos_token_id()
    ids = ids_of(tokenizer, "Done.") + [end]
    for skip in (True, False):
        detokenizer = VocabularyDetokenizer(vocabulary.token_bytes, vocabulary.special_ids, skip)
        detokenizer.append(ids)
        assert detokenizer.take() == tokenizer.decode(ids, skip_special_tokens=skip)
    assert tokenizer.get_eos_token() not in tokenizer.decode(ids, skip_special_tokens=True)


def test_kept_special_tokens_stay_in_the_text(tokenizer, vocabulary):
    """A tool-call format's tags can be special tokens; its parser must see them."""
    from ovtrio.text.prompts import PromptBuilder

    start = PromptBuilder(tokenizer, vocabulary=vocabulary).special_token_ids(("<|im_start|>", "not a tag"))
    assert start == frozenset({tokenizer.encode("<|im_start|>", add_special_tokens=False).input_ids.data[0][0]})
    ids = [*start, *ids_of(tokenizer, "call"), tokenizer.get_eos_token_id()]
    detokenizer = VocabularyDetokenizer(vocabulary.token_bytes, vocabulary.special_ids, True, keep=start)
    detokenizer.append(ids)
    assert detokenizer.take() == "<|im_start|>call"  # kept tag in, end-of-sequence still out


def test_token_ids_are_checked_against_the_tokenizer_when_the_model_states_no_vocabulary_size(tokenizer, vocabulary):
    """A config.json without `vocab_size`: the tokenizer's vocabulary bounds the ids."""
    from ovtrio.text.prompts import PromptBuilder, PromptError

    prompts = PromptBuilder(tokenizer, vocab_size=None)
    size = len(vocabulary.token_bytes)
    assert prompts.checked_ids([0, size - 1], "prompt") == [0, size - 1]
    with pytest.raises(PromptError) as refused:
        prompts.checked_ids([1, size + 5], "stop_token_ids")
    assert refused.value.param == "stop_token_ids[1]"
