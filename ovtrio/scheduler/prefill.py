"""Long prompts prefilled in slices, so that requests arriving meanwhile start between them.

Why: the engine fills each step's token budget (max_num_batched_tokens) with prompt
chunks in arrival order (openvino.genai's scheduler, `_schedule_prompt_phase_dynamic_
split_fuse`), and nothing caps one request's share of a step. A 2,000-token prompt thus
takes every step's whole budget until it is prefilled, and a short request that arrives
meanwhile waits for all of it, on the raw engine too (see
docs/benchmarks.md#request-limits-and-prefill-slices).

How: with prefix caching on, the scheduler first adds, one after the other, engine
requests for growing prefixes of the prompt (each generating one token), then the
request itself. Each prefix finds the one before it in the prefix cache, so it computes
one new slice, of the size the prefill policy gives it (prefill_policy.py: as large as
the engine runs fastest while nothing decodes, within a bound on the decoding
sequences' inter-token gap beside them). As each is added after the requests that arrived
while the last one ran, those get their first step before the next slice: on the raw
engine that brings a short request's first token forward several times over and costs
the long prompt little (see docs/benchmarks.md#request-limits-and-prefill-slices).
Slices end on KV-block boundaries, so every
block a slice fills is a whole block the prefix cache can hand on.

The prefixes are the same computation the engine would do in chunks: the output is the
same as without slicing wherever prefix caching gives the same output.

Not for every model: one whose rotary embedding changes with the length it is run at
(LongRoPE: Phi-3 and Phi-4-mini past their original context) computes each chunk of a
prompt with the factors of the length reached so far, so a long prompt prefilled in
parts is computed with the wrong ones until the last part. Such a model's scheduler is
told the length above which prompts must be prefilled whole (`prefills_whole`): those
are never sliced, and they go into the engine only once no other prompt is being
prefilled there, so that the step they start in has its whole budget for them (the
model's engine is configured with a budget that holds its longest prompt,
ovtrio/loading/limits.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ovtrio.scheduler.params import SamplingParams
from ovtrio.scheduler.requests import Admission, EngineRequest


def prefills_whole(prompt_tokens: int, whole_above: int) -> bool:
    """Whether a prompt of `prompt_tokens` must be prefilled in one engine step: it is
    longer than `whole_above` (0: no prompt must)."""
    return 0 < whole_above < prompt_tokens


def slice_params(params: SamplingParams) -> SamplingParams:
    """What a prefix's engine request asks for: one greedy token, nothing else, with the
    request's speculative settings (a speculating pipeline requires them)."""
    return SamplingParams(
        max_new_tokens=1,
        temperature=0.0,
        ignore_eos=True,
        speculation=params.speculation,
    )


@dataclass(eq=False)
class SlicedPrefill:
    """A request in the engine whose long prompts are being prefilled slice by slice:
    what is left of them, and the engine request of the prefix that runs (also among
    the request's parts, so that ending the request cancels it)."""

    admission: Admission
    prompts: list[list[int]]  # the prompts still to prefill, the current one first
    params: SamplingParams | None = None  # what each prefix's engine request asks for (slice_params)
    prefilled: int = 0  # tokens of the current prompt that the last prefix covered
    running: EngineRequest | None = None
    gave_way: bool = False  # its next slice waited a step for requests that had just arrived

    @property
    def remaining(self) -> int:
        """Tokens of its long prompts still to prefill."""
        return sum(map(len, self.prompts)) - self.prefilled

    @property
    def choices(self) -> int:
        """The request's choices once it runs: one per prompt and n."""
        return self.admission.generation.choices

    def next_prefix(self, size: int) -> list[int] | None:
        """The next prefix to prefill, `size` tokens longer than the last one; None once
        no prompt has more than `size` tokens left (the request itself computes those,
        reading the rest from the prefix cache)."""
        while self.prompts:
            prompt = self.prompts[0]
            end = self.prefilled + size
            if end < len(prompt):
                self.prefilled = end
                return prompt[:end]
            self.prompts.pop(0)
            self.prefilled = 0
        return None
