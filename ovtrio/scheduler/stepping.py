"""How the loop steps the engine, chosen before each run of steps.

Four ways, each in one place:

- RUNS (scheduler.py): the GIL-free step (engine_step.py), in runs: the worker thread
  steps on by itself while the loop has nothing to do between steps, and reads the
  handles after each step.
- ONE_STEP (scheduler.py): the GIL-free step, one step per hand-off, its handles read by
  the worker: while long prompts are sliced or a consumer lags (the loop has work
  between steps), or with step runs turned off.
- WHEN_IDLE (scheduler.py, step_thread.py): the binding's `step()`, which holds
  the GIL, one step started once the event loop is idle; the loop reads the handles.
  Only when the GIL-free step is off or fails its checks.
- the stateful backend (stateful.py): `generate()` in a worker thread, one request at
  a time; no steps to choose.

Every step goes GIL-free when it can, a request's first step included. A C++ exception
cannot cross the ctypes call of the GIL-free step (one thrown inside it ends the
process), and what a request brings that a step builds is built at its first step: its
sampler state (openvino.genai's LogitProcessor) with the transforms of its sampling
settings, and the grammar of its output constraint. So what could throw there is made
impossible before the request is admitted, not caught by holding the event loop:

- the sampling settings pass the engine's own `GenerationConfig.validate()`
  (params.check_params) before a client is answered; the transforms it builds from
  valid settings assert only on token ids outside the vocabulary (penalties), and
  prompt ids are checked against it (text/prompts.py) while generated ones come from
  the model;
- stop token ids are checked against the vocabulary too (api/generation.py, with
  text/prompts.py's check), since the engine indexes with them unchecked: the logits
  that min_tokens holds back, and the bits of a grammar's token mask;
- the output constraint is compiled before admission by the same XGrammar, held to
  limits of time and size, and the engine is given the very grammar that compiled
  (constraints/check.py); one that does not compile is the client's 400;
- the engine is given no stop strings (the scheduler matches them itself), the other
  thing a first step builds that could throw.

engine_step.py lists what a step can still throw (faults of the engine or the device).
"""

from __future__ import annotations

import enum


class Stepping(enum.Enum):
    RUNS = "GIL-free runs"
    ONE_STEP = "GIL-free, one step per hand-off"
    WHEN_IDLE = "the binding's step when the loop is idle"


def choose_stepping(gil_free: bool, runs: bool) -> Stepping:
    """How to step next: the binding's step without a GIL-free one, else GIL-free runs
    if `runs` (the loop has nothing to do between steps), else one GIL-free step."""
    if not gil_free:
        return Stepping.WHEN_IDLE
    return Stepping.RUNS if runs else Stepping.ONE_STEP
