"""Output constraints compiled before admission, in a process of their own.

The engine compiles a request's constraint inside its first engine step. A constraint
it cannot compile makes that step throw, which fails every request in the step (with
the binding's step) or ends the process (with the GIL-free step, through which no C++
exception can pass: engine_step.py); one that compiles slowly stalls every stream for
as long. So the scheduler has each new constraint compiled here first, before the
request is admitted and its client answered: by the same XGrammar as the engine's, in a
worker process (worker.py) held to a time limit, an address-space limit and a
bound on the grammar's size, and killed (then started again for the next constraint)
when it runs over or dies. What does not compile is refused (ConstraintRefused, the
client's 400); what does is handed to the engine as the EBNF text compiled here, which
the engine parses and compiles as the worker did, so its first step has nothing left
to throw.

Nothing of this runs on the event loop: the loop only writes a line to the worker and
awaits its answer. What the constraint itself decides is kept by a hash of the request
(bounded in entries and characters), so a schema costs one compile per process: its
grammar, XGrammar's refusal, a size bound or the CPU-time limit run over. What the
machine does to the worker is not kept, as the same constraint may compile the next
time: a worker that cannot start, one that dies (killed for memory by the system), and
a compile the load starved of CPU time until the clock ran out (the worker runs below
the server's priority). A compile once begun runs to its end, bounded as it is, even if
its client leaves, and its result is kept.

A request and its answer never get out of step: the worker is used only once it has
said it is ready, each answer carries back the id of its request, and a worker whose
answer is missing, late or not the one awaited is killed, never read again.

Without XGrammar 0.1.31 (a server installed without the quick start's
`pip install --no-deps xgrammar==0.1.31`) the first worker says so: that is logged once,
and every constraint is refused at once, saying how to install it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import pickle
import subprocess
import sys
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from ovtrio.constraints.worker import XGRAMMAR_VERSION, space_piece, xgrammar_missing

log = logging.getLogger("ovtrio")

WORKER = Path(__file__).with_name("worker.py")


@functools.cache
def structured_output_missing() -> str | None:
    """Why no output constraint can be compiled in this process's environment (the
    XGrammar the engine compiles with is not installed), saying how to install it;
    None when it can. Read once: what /v1/models tells clients before they send one."""
    missing = xgrammar_missing()
    if missing is None:
        return None
    return (
        f"structured output needs XGrammar on this server ({missing}):"
        f" pip install --no-deps xgrammar=={XGRAMMAR_VERSION}"
    )


@dataclass(frozen=True)
class GrammarLimits:
    """What one constraint may cost to compile: `seconds` of CPU time, `memory`
    bytes of address space beyond what the worker holds when ready, `text` characters of
    grammar (EBNF) and `compiled` bytes of compiled grammar (XGrammar's own estimate,
    what the engine then keeps in its grammar cache)."""

    seconds: float = 2.0
    memory: int = 1 << 30
    text: int = 1 << 20
    compiled: int = 256 << 20


class ConstraintRefused(Exception):
    """The constraint does not compile within the limits; the message says why."""


class CheckerBusy(ConstraintRefused):
    """The constraint could not be checked now, for a cause that is the machine's, not
    the constraint's (the worker starved of time, killed, or unable to start): the same
    constraint may be sent again (the client's 429, not a 400)."""


class CheckerClosed(Exception):
    """The checker was closed (the server is stopping): nothing more is checked."""


# Results kept: at most this many, and this many characters of grammar in all.
CACHE_ENTRIES = 1024
CACHE_CHARACTERS = 64 << 20
# The worker compiles with every VOCAB_SAMPLE-th token of the vocabulary, and its time
# limit is cut by as much (not its size limit: a grammar of a large enum is as large on
# any vocabulary, and XGrammar's estimate of a compiled grammar's size on the sample is
# within a fifth of its estimate on the whole). CPU time falls by less than the
# vocabulary, so the cut time limit errs on the side of refusing (figures:
# docs/benchmarks.md#structured-output-grammars). Why a sample: the engine compiles each grammar
# again (it takes no compiled grammar from outside), and the cost of a compile grows
# with the vocabulary (XGrammar computes a token mask for each state of the grammar); on
# the full vocabulary every new constraint would cost twice. Whether a grammar builds,
# and the grammar itself, do not depend on the vocabulary: they are the engine's
# exactly. Its time on the sample stands for its time on the whole.
VOCAB_SAMPLE = 4
# Time for the worker to start and read the vocabulary.
START_SECONDS = 60.0
# How often a compile's CPU time is read, and how much longer than its CPU-time limit it
# may take on the clock.
POLL_SECONDS = 0.05
WALL_FACTOR = 10


def sampled(tokens: list[bytes], eos_token_id: int) -> tuple[list[bytes], int]:
    """Every VOCAB_SAMPLE-th token (and the end-of-sequence one), for the worker."""
    sample = tokens[::VOCAB_SAMPLE]
    if eos_token_id % VOCAB_SAMPLE == 0:
        return sample, eos_token_id // VOCAB_SAMPLE
    return [*sample, tokens[eos_token_id]], len(sample)


def grammar_vocabulary(tokenizer: Any, vocabulary: Any) -> tuple[list[bytes], int]:
    """The tokens' bytes and the end-of-sequence id, as the engine gives XGrammar its
    vocabulary (each token's decoded bytes, raw)."""
    if vocabulary is not None:
        tokens = list(vocabulary.token_bytes)
    else:
        tokens = [token.encode("utf-8", "surrogateescape") for token in tokenizer.get_vocab_vector()]
    # Without a tokenizer (an engine that has none to give) no id ends the sequence early.
    eos = int(tokenizer.get_eos_token_id()) if tokenizer is not None else 0
    return tokens, eos


class GrammarChecker:
    def __init__(self, vocabulary: Callable[[], tuple[list[bytes], int]], limits: GrammarLimits = GrammarLimits()):
        """`vocabulary` gives the model's tokens and end-of-sequence id
        (grammar_vocabulary), called in a worker thread when the first constraint
        comes."""
        self._vocabulary = vocabulary
        self.limits = limits
        # The worker, once it has said it is ready: never one whose handshake is
        # unconfirmed, or whose answers may be out of step with its requests.
        self._process: trio.Process | None = None
        self._buffer = bytearray()
        self._lock = trio.Lock()
        self._cache: OrderedDict[str, tuple[bool, str]] = OrderedDict()
        self._cached_characters = 0
        self._vocab: bytes | None = None  # pickled, as the worker reads it
        self._killed: list[trio.Process] = []
        self._sent = 0  # the id of the last request sent, which its answer carries back
        # Why no constraint can be checked here (XGrammar is not installed), once known.
        self._unavailable: str | None = None
        self._closed = False
        self.compiles = 0
        self.restarts = 0

    def _pickled_vocabulary(self) -> bytes:
        tokens, eos_token_id = self._vocabulary()
        return pickle.dumps((*sampled(tokens, eos_token_id), space_piece(tokens)))

    async def grammar(self, request: dict[str, Any]) -> str:
        """The EBNF grammar of `request` (a `kind` of "json_schema" with its `schema`
        text, or "structural_tag" with its `tags` and `triggers`; and the
        `stop_token_ids` the engine will match with), compiled; raises
        ConstraintRefused, or CheckerClosed once the server is stopping.

        A compile, once begun, runs to its end (it is bounded in time) even if the
        request that asked for it is cancelled, and its result is kept: a client that
        leaves mid-compile costs neither a restart of the worker nor the compile, and
        the next request for the same constraint is answered at once."""
        self._check_open()
        key = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
        found = self._cached(key)
        if found is None:
            async with self._lock:
                self._check_open()
                found = self._cached(key)
                if found is None:
                    process = await self._started()
                    with trio.CancelScope(shield=True):
                        result, keep = await self._compile(process, request)
                        self._check_open()  # closed meanwhile: the answer says nothing
                        if keep:
                            self._keep(key, result)
                    found = result
                    if not keep and not result[0]:
                        raise CheckerBusy(result[1])
        compiled, text = found
        if not compiled:
            raise ConstraintRefused(text)
        return text

    def close(self) -> None:
        """Kill the worker, if one runs (the server is stopping); every call waiting
        or made from now on raises CheckerClosed."""
        self._closed = True
        self._stop()

    def _check_open(self) -> None:
        if self._closed:
            raise CheckerClosed("the server is shutting down")

    # ---- the cache ------------------------------------------------------------------

    def _cached(self, key: str) -> tuple[bool, str] | None:
        found = self._cache.get(key)
        if found is not None:
            self._cache.move_to_end(key)
        return found

    def _keep(self, key: str, result: tuple[bool, str]) -> None:
        self._cache[key] = result
        self._cached_characters += len(result[1])
        while len(self._cache) > CACHE_ENTRIES or self._cached_characters > CACHE_CHARACTERS:
            _, dropped = self._cache.popitem(last=False)
            self._cached_characters -= len(dropped[1])

    # ---- the worker -----------------------------------------------------------------

    async def _compile(self, process: trio.Process, request: dict[str, Any]) -> tuple[tuple[bool, str], bool]:
        """((True, grammar) or (False, why not), whether to keep it); never raises for
        the constraint's sake. Kept is what the constraint itself decides: XGrammar's
        refusals, the size bounds, the CPU-time limit. Not what the machine does to the
        worker (started, killed, starved of CPU time by the load): the same constraint
        may compile the next time."""
        self.compiles += 1
        seconds = self.limits.seconds
        try:
            answer, over = await self._answer(process, request, seconds / VOCAB_SAMPLE)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ValueError):  # it ended, or spoke no JSON
            answer, over = None, None
        except BaseException:
            self._stop()  # its answer may still come: the next request gets a new worker
            raise
        if answer is None:
            self._stop()
        if over == "cpu":
            return (False, f"it takes more than {seconds:g} s to compile"), True
        if over == "clock":
            wall = seconds / VOCAB_SAMPLE * WALL_FACTOR
            return (False, f"the server was too busy to compile it within {wall:g} s; it may be sent again"), False
        if answer is None:
            return (False, "the grammar compiler ended while compiling it"), False
        if "grammar" in answer:
            return (True, answer["grammar"]), True
        return (False, _first_line(answer.get("error", ""))), True

    async def _answer(
        self, process: trio.Process, request: dict[str, Any], seconds: float
    ) -> tuple[dict[str, Any] | None, str | None]:
        """Send `request` and await the answer: (answer, None); (None, None) if the
        worker ended or answered out of step; or (None, "cpu") once the compile has used
        `seconds` of the worker's CPU time, (None, "clock") once WALL_FACTOR times as
        much time has passed on the clock. CPU time, not the clock: on a busy machine
        the worker gets little of it (it runs at a lower priority than the server), and
        a schema that compiles in time on an idle one is not to be refused because of
        the load."""
        assert process.stdin is not None
        self._sent += 1
        started = _cpu_seconds(process.pid)
        deadline = trio.current_time() + seconds * WALL_FACTOR
        with trio.move_on_at(deadline):  # a worker that reads nothing holds no request
            await process.stdin.send_all(json.dumps({**request, "id": self._sent}).encode() + b"\n")
        if trio.current_time() > deadline:
            return None, "clock"
        while True:
            with trio.move_on_after(POLL_SECONDS):
                answer = await self._line(process)
                if answer is None or answer.get("id") != self._sent:
                    return None, None
                return answer, None
            if _cpu_seconds(process.pid) - started > seconds:
                return None, "cpu"
            if trio.current_time() > deadline:
                return None, "clock"

    async def _started(self) -> trio.Process:
        """The worker, started (again) if it is not running and confirmed ready. Raises
        ConstraintRefused if it cannot start (not kept: it may start the next time),
        or at once if XGrammar is not installed (known from the first start)."""
        if self._unavailable is not None:
            raise ConstraintRefused(self._unavailable)
        if self._process is not None:
            if self._process.poll() is None:
                return self._process
            self._stop()  # it ended between two compiles (killed from outside)
        for killed in self._killed:  # reaped, not left as zombies
            await killed.wait()
        self._killed.clear()
        if self._vocab is None:
            self._vocab = await trio.to_thread.run_sync(self._pickled_vocabulary)
        self._check_open()
        limits = self.limits
        command = [sys.executable, str(WORKER), str(limits.memory), str(limits.text), str(limits.compiled)]
        try:
            process = await trio.lowlevel.open_process(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        except OSError as exc:
            log.warning("output constraints cannot be checked: %s", exc)
            raise CheckerBusy(f"output constraints cannot be checked on this server now ({exc})") from None
        self._buffer.clear()
        try:
            with trio.fail_after(START_SECONDS):
                assert process.stdin is not None
                await process.stdin.send_all(b"%d\n" % len(self._vocab) + self._vocab)
                ready = await self._line(process)
        except BaseException as exc:
            # Cancelled (its client left), timed out, or an answer that is no JSON: this
            # worker may yet say it is ready, which the next request would read as its
            # answer.
            process.kill()
            self._killed.append(process)
            if not isinstance(exc, (trio.TooSlowError, trio.BrokenResourceError, ValueError)):
                raise
            log.warning("output constraints cannot be checked: the grammar compiler did not start (%s)", exc)
            raise CheckerBusy("output constraints cannot be checked on this server now") from None
        if ready != {"ready": True}:
            process.kill()
            self._killed.append(process)
            if ready is not None and "unavailable" in ready:
                self._unavailable = (
                    "structured output needs XGrammar on this server"
                    f" ({ready['unavailable']}): pip install --no-deps xgrammar=={XGRAMMAR_VERSION}"
                )
                log.warning("output constraints are refused: %s", self._unavailable)
                raise ConstraintRefused(self._unavailable)
            log.warning("output constraints cannot be checked: the grammar compiler did not start")
            raise CheckerBusy("output constraints cannot be checked on this server now")
        if self._closed:  # while it started
            process.kill()
            self._killed.append(process)
            self._check_open()
        self._process = process
        return process

    async def _line(self, process: trio.Process) -> dict[str, Any] | None:
        """The worker's next answer; None once it has ended. Raises ValueError for a line
        that is no JSON object."""
        assert process.stdout is not None
        while b"\n" not in self._buffer:
            data = await process.stdout.receive_some(1 << 16)
            if not data:
                return None
            self._buffer += data
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer[:] = rest
        answer = json.loads(line)
        if not isinstance(answer, dict):
            raise ValueError(f"the grammar compiler answered {line[:100]!r}")
        return answer

    def _stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._killed.append(self._process)
            self._process = None
            self.restarts += 1


def _cpu_seconds(pid: int) -> float:
    """CPU time (user and system) the process has used; 0 once it has ended."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _first_line(message: str) -> str:
    """XGrammar's message without its "[time] /build/path/file.cc:line: " prefix."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    text = lines[0] if lines else "it does not compile"
    if text.startswith("["):
        text = text.split("] ", 1)[-1]
        head, sep, tail = text.partition(": ")
        if sep and ("/" in head or ".cc" in head):
            text = tail
    return text.removeprefix("Check failed: ").rstrip(".")
