"""What the scheduler needs to run one request, and the one place where it becomes
engine input: an OpenVINO GenAI GenerationConfig (with its StructuredOutputConfig), and
the prompt as a tensor of token ids (or, for a vision-language model, text and images).

Everything here is already checked by the caller (the API layer validates request
fields and output formats); check_params lets the engine itself refuse a combination
before any request is made.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ovtrio.errors import FieldError


@dataclass(frozen=True)
class TaggedRegion:
    begin: str
    schema: str  # JSON text
    end: str


@dataclass(frozen=True)
class OutputConstraint:
    """A shape the output must have, enforced by the engine's constrained decoding
    (XGrammar): a JSON schema, or structural tags (free text in which regions that
    start with a trigger must match a schema).

    `grammar` is what the engine is given: the constraint compiled before admission
    (constraints/check.py) to XGrammar's EBNF, JSON without free whitespace. `param`
    names the request field it came from, for the client's 400 when it does not
    compile."""

    json_schema: str | None = None  # JSON text
    tags: tuple[TaggedRegion, ...] = ()
    triggers: tuple[str, ...] = ()
    grammar: str | None = None
    param: str = field(default="response_format", compare=False)


@dataclass(frozen=True, slots=True)
class SpeculativeDecoding:
    """A request's speculative-decoding settings, on a pipeline built for it (0: not
    set). Prompt lookup sets num_assistant_tokens and max_ngram_size; a draft model
    num_assistant_tokens or assistant_confidence_threshold. Candidates are verified by
    the main model."""

    num_assistant_tokens: int = 0
    assistant_confidence_threshold: float = 0.0
    max_ngram_size: int = 0


NO_SPECULATION = SpeculativeDecoding()


def sequences_per_prompt(n: int, best_of: int) -> int:
    """Engine sequences one prompt runs: its n choices, or the best_of beams they are
    picked from (beams count too)."""
    return max(n, best_of)


@dataclass(frozen=True)
class SamplingParams:
    """Decoding settings for one request, already validated by the caller.

    `temperature == 0` means greedy decoding; `best_of > 1` means beam search with that
    beam width, returning the `n` best beams. With sampling, `n > 1` runs n independent
    engine requests (seeds seed, seed+1, ...), so every choice streams as it is made.
    `stop` strings are matched on the decoded text by the scheduler (not by the
    engine), so the cut is exact to the character and the same for streamed and unary
    output.
    """

    max_new_tokens: int
    n: int = 1
    best_of: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    length_penalty: float = 1.0
    diversity_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_new_tokens: int = 0
    skip_special_tokens: bool = True
    # Special tokens to keep in the text even when skipping special tokens (the tags
    # of a tool-call format, for its parser).
    keep_special_token_ids: frozenset[int] = frozenset()
    logprobs: bool = False
    constraint: OutputConstraint | None = None  # enforced by constrained decoding
    speculation: SpeculativeDecoding = NO_SPECULATION

    @property
    def speculative(self) -> bool:
        return self.speculation.num_assistant_tokens > 0 or self.speculation.assistant_confidence_threshold > 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def beam_search(self) -> bool:
        return self.best_of > 1


@dataclass(frozen=True)
class TextPrompt:
    """A prompt as a vision-language model's engine takes it: the text, with an image
    tag (`<ov_genai_image_N>`) where each image goes, and the images as RGB arrays
    (height x width x 3, uint8) in the order of their tags."""

    text: str
    images: tuple[Any, ...] = ()


@dataclass(frozen=True)
class GenerationRequest:
    """Tokenized prompts plus their sampling settings. Choice `p * n + i` is the i-th
    output of prompt p, as OpenAI numbers them.

    `texts`, when given (one per prompt), is what the engine is given instead of the
    token ids: a vision-language model's engine takes text and images only. The ids
    then hold the prompt's tokens as the server counts them (each image as the tokens
    it costs), for limits, usage and detokenizing."""

    prompts: list[list[int]]
    params: SamplingParams
    texts: list[TextPrompt] | None = None

    # What it counts for, in one place: the API's limits, admission, stats and usage
    # all read these.

    @property
    def choices(self) -> int:
        """Choices it returns: n per prompt."""
        return len(self.prompts) * self.params.n

    @property
    def engine_requests(self) -> int:
        """Engine requests it becomes: one per prompt and sibling, or one beam search
        per prompt."""
        return len(self.prompts) * (1 if self.params.beam_search else self.params.n)

    @property
    def sequences(self) -> int:
        """Engine sequences it runs (what admission weighs it by): choices, or beams."""
        return len(self.prompts) * sequences_per_prompt(self.params.n, self.params.best_of)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(prompt) for prompt in self.prompts)


def engine_prompt(text: TextPrompt) -> tuple[str, list[Any]]:
    """A text prompt as a vision-language model's engine takes it: the text, and each
    image as a uint8 HWC tensor."""
    import openvino as ov

    return text.text, [ov.Tensor(np.ascontiguousarray(image, dtype=np.uint8)) for image in text.images]


def to_generation_config(
    params: SamplingParams, *, seed_offset: int = 0, model_stop_token_ids: frozenset[int] = frozenset()
) -> Any:
    """Build the engine's GenerationConfig for one engine request of `params`.

    Beam search returns `n` sequences from one engine request; otherwise each engine
    request makes one sequence, and `seed_offset` tells the n siblings apart.
    """
    import openvino_genai

    config = openvino_genai.GenerationConfig()
    # A text prompt (a vision-language model's) already went through the chat template.
    config.apply_chat_template = False
    config.max_new_tokens = params.max_new_tokens
    config.min_new_tokens = params.min_new_tokens
    config.ignore_eos = params.ignore_eos
    config.repetition_penalty = params.repetition_penalty
    config.frequency_penalty = params.frequency_penalty
    config.presence_penalty = params.presence_penalty
    if params.stop_token_ids:
        # Setting stop_token_ids replaces the model's end-of-sequence ids: keep them.
        config.stop_token_ids = set(params.stop_token_ids) | set(model_stop_token_ids)
    if params.logprobs:
        config.logprobs = 1
    if params.constraint is not None:
        config.structured_output_config = to_engine_config(params.constraint)
    config.num_assistant_tokens = params.speculation.num_assistant_tokens
    config.assistant_confidence_threshold = params.speculation.assistant_confidence_threshold
    config.max_ngram_size = params.speculation.max_ngram_size
    if params.beam_search:
        config.num_beams = params.best_of
        config.num_return_sequences = params.n
        config.length_penalty = params.length_penalty
        if params.diversity_penalty > 0:
            config.num_beam_groups = params.best_of
            config.diversity_penalty = params.diversity_penalty
        return config
    config.num_return_sequences = 1
    if params.greedy:
        config.do_sample = False
        config.temperature = 0.0
        return config
    config.do_sample = True
    config.temperature = params.temperature
    config.top_p = params.top_p
    config.min_p = params.min_p
    if params.top_k is not None and params.top_k > 0:
        config.top_k = params.top_k
    if params.seed is not None:
        config.rng_seed = (params.seed + seed_offset) % (2**32)
    else:
        # The engine's default rng_seed is a constant 0: unseeded requests would all
        # sample the same text, and the n choices of one request would be identical.
        config.rng_seed = random.getrandbits(32)
    return config


def to_engine_config(constraint: OutputConstraint) -> Any:
    """The engine's StructuredOutputConfig for `constraint`: its compiled grammar, or
    (before it is compiled: check_params) the schema or tags themselves."""
    import openvino_genai

    if constraint.grammar is not None:
        return openvino_genai.StructuredOutputConfig(grammar=constraint.grammar)
    if constraint.json_schema is not None:
        return openvino_genai.StructuredOutputConfig(json_schema=constraint.json_schema)
    tags = openvino_genai.StructuralTagsConfig(
        structural_tags=[
            openvino_genai.StructuralTagItem(begin=t.begin, schema=t.schema, end=t.end) for t in constraint.tags
        ],
        triggers=list(constraint.triggers),
    )
    return openvino_genai.StructuredOutputConfig(structural_tags_config=tags)


class UnsupportedParams(FieldError):
    """The engine refuses this request's settings: a combination its checks reject, or
    an output constraint it cannot compile. The message says why; `param` names the
    request field at fault when the caller knows it."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message, param)

    def client_message(self) -> str:
        return f"The engine cannot run this request: {self}"


def check_params(params: SamplingParams) -> None:
    """Let the engine check `params` before any request is made (and before a client is
    answered 200), so that a combination it refuses is the client's 400, not a failure
    halfway through a stream."""
    config = to_generation_config(params)
    try:
        config.validate()
    except Exception as exc:  # noqa: BLE001 - the engine raises RuntimeError("Check 'x' failed at file:line ...")
        text = str(exc)
        if "Check '" in text:
            text = "it requires " + text.split("Check '", 1)[1].split("'", 1)[0]
        raise UnsupportedParams(text.splitlines()[0]) from None
