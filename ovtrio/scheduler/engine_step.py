"""One engine step without holding the GIL.

Why this exists: openvino.genai's Python binding declares
`.def("step", &ContinuousBatchingPipeline::step)` with no
`py::call_guard<py::gil_scoped_release>()`, so `pipeline.step()` holds the GIL for the
whole step, CPU work of milliseconds to seconds (step_thread.py says why steps run in a
thread): every other Python thread, and so the whole event loop, stops for that long.
The C++ method itself needs no GIL. It is exported from `libopenvino_genai.so.*`
(`ov::genai::ContinuousBatchingPipeline::step()`), and ctypes releases the GIL around
every foreign call; called with the address of the pipeline's C++ object, it runs the
same step (same greedy tokens) while Python keeps running.

The address is the pybind11 instance's value pointer, the first word after the PyObject
header (pybind11's "simple layout", which a class bound with one C++ type and no
multiple inheritance has). Nothing about that is a public interface, so it is checked
before it is trusted:

1. the library is the very file this process loaded (from /proc/self/maps), so the
   symbol belongs to the same copy of the code as the object;
2. the candidate address and the word it starts with point into readable memory, and
   that word points at a vtable of libopenvino_genai's ContinuousBatching classes (the
   pipeline's first member is its implementation object), as `dladdr` names it;
3. `has_non_finished_requests`, called through the same route, agrees with the binding
   on the live pipeline without a request and with one, and the request, stepped through
   the route, finishes as the binding reports it.

Any mismatch (another openvino-genai build, pybind11 layout, platform) gives the
binding's `step()` and one log line. `OVTRIO_GIL_FREE_STEP=false` (`--no-gil-free-step`)
skips all of this.

One behaviour differs: a C++ exception cannot cross a ctypes call, so an exception
inside a GIL-free step ends the process (std::terminate) where the binding raises
RuntimeError, which fails the batch and lets the server go on (Scheduler.run). What
`ContinuousBatchingPipeline::step()` can throw, read from openvino.genai's source (its
main branch of August 2026, near the 2026.4 release this server is built against:
src/cpp/src/continuous_batching/pipeline_impl.cpp, ContinuousBatchingImpl::step, and
what it calls; the prompt-lookup and draft-model pipelines' step() calls the same, plus
assertions that draft and main model agree):

- requests joining (`_pull_awaiting_requests`): nothing (a vector insert under a mutex);
- scheduling (`Scheduler::schedule`): OPENVINO_ASSERTs on its block tables (internal
  faults), and the growth of the KV cache (`allocate_cache_if_needed`), which throws
  when the device has no memory for the larger cache;
- the forward pass (`ModelRunner::forward`, an infer request): device and plugin
  errors, out of memory;
- sampling (`Sampler::sample`): at a request's first scheduled step, its sampler state
  (`LogitProcessor`) is built, and with an output constraint XGrammar builds and
  compiles its grammar (`XGrammarStructuredOutput::get_logits_transformer`), which
  throws for a grammar it cannot build ("Failed to create grammar from structural
  tag", or XGrammar's own errors); the stop strings' tokenization (ovtrio never gives
  the engine stop strings); and assertions of the per-request sampling paths (beam
  search groups, speculative validation), run in the sampler's thread pool and
  rethrown by `future.get()`;
- prompt-lookup candidates and freeing finished requests: assertions only.

What a request brings is thus built in its first step, and made unable to throw there
before the request is admitted (stepping.py says how): its sampling settings pass the
engine's own validation, and its output constraint is compiled first by the same
XGrammar, within limits of time and size, the engine then given the grammar that
compiled (constraints/check.py). What remains to end the process from a GIL-free
step: running out of memory growing the KV cache, in the forward pass or compiling a
grammar, device faults, and the engine's internal assertions. A process supervisor
restarts the server then. Only a C++ shim that catches the exception would close that
(no compiler is assumed here), or the binding's release of the GIL (below).

What retires this module: a `py::call_guard<py::gil_scoped_release>()` on `step` (and
on `add_request` and the handle's `read`) in openvino.genai's
`py_continuous_batching_pipeline.cpp`. With such a release, `pipeline.step()` in a
worker thread already lets the event loop run, and this module becomes a no-op to
delete; the scheduler's threaded loop stays as it is.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("ovtrio.scheduler")

STEP_SYMBOL = "_ZN2ov5genai26ContinuousBatchingPipeline4stepEv"
HAS_UNFINISHED_SYMBOL = "_ZN2ov5genai26ContinuousBatchingPipeline25has_non_finished_requestsEv"
# dladdr's name for a vtable of ov::genai::ContinuousBatchingPipeline's nested classes.
IMPL_VTABLE_PREFIX = "_ZTVN2ov5genai26ContinuousBatchingPipeline"
LIBRARY_NAME = "libopenvino_genai.so"
# Enough steps for a 4-token prompt and one new token, with room to spare.
VERIFY_MAX_STEPS = 16


@dataclass(frozen=True)
class EngineStep:
    """How the scheduler steps the engine: `run()` is one step; `releases_gil` says
    whether other Python threads (the event loop) run while it does."""

    run: Callable[[], None]
    releases_gil: bool
    description: str


class Unavailable(Exception):
    """The GIL-free step cannot be trusted here; the message says why."""


def choose_step(
    pipeline: Any, gil_free: bool = True, configure: Callable[[Any], Any] | None = None, text_prompts: bool = False
) -> EngineStep:
    """The GIL-free step if it is enabled and verified on `pipeline`, else the binding's.

    Blocking (it runs a few engine steps): call it from a worker thread, before the
    scheduler starts and while the pipeline holds no requests. `configure` completes the
    check request's GenerationConfig with what the pipeline requires of every request
    (a speculating pipeline refuses requests without its settings). `text_prompts`: the
    pipeline takes prompts as text only (a vision-language model's).
    """
    binding = EngineStep(pipeline.step, releases_gil=False, description="the binding's step() (holds the GIL)")
    if not gil_free:
        log.info("engine steps hold the GIL (GIL-free stepping is turned off)")
        return binding
    try:
        step = gil_free_step(pipeline, configure, text_prompts)
    except Unavailable as exc:
        log.warning("engine steps hold the GIL, the event loop pauses during each step: %s", exc)
        return binding
    return step


def gil_free_step(
    pipeline: Any, configure: Callable[[Any], Any] | None = None, text_prompts: bool = False
) -> EngineStep:
    """A verified GIL-free step for `pipeline`; raises Unavailable (with why) if not."""
    if not sys.platform.startswith("linux"):
        raise Unavailable(f"GIL-free stepping is only checked on Linux, not {sys.platform}")
    regions = _readable_regions()
    library = _loaded_library(regions)
    try:
        lib = ctypes.CDLL(str(library))
        step = getattr(lib, STEP_SYMBOL)
        has_unfinished = getattr(lib, HAS_UNFINISHED_SYMBOL)
    except (OSError, AttributeError) as exc:
        raise Unavailable(f"{library.name} does not export the step symbols ({exc})") from None
    step.argtypes, step.restype = [ctypes.c_void_p], None
    has_unfinished.argtypes, has_unfinished.restype = [ctypes.c_void_p], ctypes.c_bool

    address = _object_address(pipeline, regions, library)
    _verify(pipeline, lambda: step(address), lambda: bool(has_unfinished(address)), configure, text_prompts)
    log.info("engine steps release the GIL (%s called through ctypes)", library.name)
    return EngineStep(
        _StepByAddress(step, address, pipeline),
        releases_gil=True,
        description=f"{STEP_SYMBOL} in {library.name} via ctypes",
    )


class _StepByAddress:
    """The C++ step called on the pipeline's raw address. It holds the pipeline object
    too: the address alone would not keep the C++ pipeline alive, and a step on a freed
    one would read freed memory."""

    __slots__ = ("_step", "_address", "_pipeline")

    def __init__(self, step: Any, address: int, pipeline: Any) -> None:
        self._step = step
        self._address = address
        self._pipeline = pipeline

    def __call__(self) -> None:
        self._step(self._address)


# ---- checks ------------------------------------------------------------------------------


def _readable_regions() -> list[tuple[int, int, str]]:
    """(start, end, path) of every readable mapping of this process."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            lines = maps.read().splitlines()
    except OSError as exc:
        raise Unavailable(f"cannot read /proc/self/maps ({exc.strerror})") from None
    regions = []
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 5 or not fields[1].startswith("r"):
            continue
        start, end = (int(part, 16) for part in fields[0].split("-"))
        regions.append((start, end, fields[5].strip() if len(fields) == 6 else ""))
    return regions


def _loaded_library(regions: list[tuple[int, int, str]]) -> Path:
    """The libopenvino_genai this process loaded: the same copy as the pipeline's code."""
    paths = {Path(path) for _, _, path in regions if Path(path).name.startswith(LIBRARY_NAME)}
    if len(paths) != 1:
        found = ", ".join(sorted(str(p) for p in paths)) or "none"
        raise Unavailable(f"expected one loaded {LIBRARY_NAME}, found {found}")
    return paths.pop()


def _readable(address: int, size: int, regions: list[tuple[int, int, str]]) -> bool:
    return any(start <= address and address + size <= end for start, end, _ in regions)


def _read_word(address: int, regions: list[tuple[int, int, str]]) -> int:
    if not address or not _readable(address, ctypes.sizeof(ctypes.c_void_p), regions):
        raise Unavailable(f"address {address:#x} is not readable memory")
    return ctypes.c_void_p.from_address(address).value or 0


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _symbol_at(address: int) -> tuple[str, str]:
    """(file, nearest symbol) for a code or data address, from dladdr."""
    info = _DlInfo()
    if not ctypes.CDLL(None).dladdr(ctypes.c_void_p(address), ctypes.byref(info)):
        return "", ""
    return (info.dli_fname or b"").decode(errors="replace"), (info.dli_sname or b"").decode(errors="replace")


def _object_address(pipeline: Any, regions: list[tuple[int, int, str]], library: Path) -> int:
    """The C++ object behind the pybind11 instance, checked as far as memory allows."""
    header = object.__basicsize__  # ob_refcnt and ob_type: the PyObject header
    word = ctypes.sizeof(ctypes.c_void_p)
    if type(pipeline).__basicsize__ < header + word:
        raise Unavailable(f"{type(pipeline).__name__} is not a pybind11 instance of the expected size")
    address = _read_word(id(pipeline) + header, regions)
    implementation = _read_word(address, regions)
    vtable = _read_word(implementation, regions)
    file, symbol = _symbol_at(vtable)
    if Path(file).resolve() != library.resolve() or not symbol.startswith(IMPL_VTABLE_PREFIX):
        raise Unavailable(
            f"the pipeline object's layout is not the expected one (its first member points at"
            f" {symbol or 'an unknown symbol'} in {Path(file).name or 'no library'})"
        )
    return address


def _verify(
    pipeline: Any,
    step: Callable[[], None],
    has_unfinished: Callable[[], bool],
    configure: Callable[[Any], Any] | None = None,
    text_prompts: bool = False,
) -> None:
    """Cross-check the route against the binding on the live pipeline."""
    import openvino_genai

    from ovtrio.engine.tensors import prompt_tensor

    if pipeline.has_non_finished_requests():
        raise Unavailable("the pipeline must hold no request while the step is verified")
    if has_unfinished():
        raise Unavailable("has_non_finished_requests disagrees with the binding on an idle pipeline")
    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = 1
    config.ignore_eos = True
    if configure is not None:
        configure(config)
    if text_prompts:
        config.apply_chat_template = False
        handle = pipeline.add_request(0, "Hi there, hello", [], config)
    else:
        handle = pipeline.add_request(0, prompt_tensor([0] * 4), config)
    try:
        if not (pipeline.has_non_finished_requests() and has_unfinished()):
            raise Unavailable("has_non_finished_requests disagrees with the binding on a pending request")
        for _ in range(VERIFY_MAX_STEPS):
            if not pipeline.has_non_finished_requests():
                break
            step()
        if pipeline.has_non_finished_requests() or has_unfinished():
            raise Unavailable("a request stepped through ctypes did not finish")
        if handle.get_status() != openvino_genai.GenerationStatus.FINISHED or not handle.can_read():
            raise Unavailable("a request stepped through ctypes produced no output")
        generated = 0
        while handle.can_read():
            generated += sum(len(output.generated_ids) for output in handle.read().values())
        if generated != 1:
            raise Unavailable(f"a request stepped through ctypes generated {generated} tokens, not 1")
    finally:
        del handle  # dropping the handle cancels the request if it still runs
        for _ in range(VERIFY_MAX_STEPS):
            if not pipeline.has_non_finished_requests():
                break
            pipeline.step()
