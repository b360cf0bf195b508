"""Output constraints compiled before admission, in a process of their own.

The engine compiles a request's constraint inside its first engine step. A constraint
it cannot compile makes that step throw, which fails every request in the step (with
the binding's step) or ends the process (with the GIL-free step, through which no C++
exception can pass: engine_step.py); one that compiles slowly stalls every stream for
as long. So the scheduler has each new constraint compiled here first, before the
request is admitted and its client answered: by the same XGrammar as the engine's, in a
worker process (grammar_worker.py) held to a time limit, an address-space limit and a
bound on the grammar's size, and killed (then started again for the next constraint)
when it runs over or dies. What does not compile is refused (ConstraintRefused, the
client's 400); what does is handed to the engine as the EBNF text compiled here, which
the engine parses and compiles as the worker did, so its first step has nothing left
to throw.

Nothing of this runs on the event loop: the loop only writes a line to the worker and
awaits its answer. Results, refusals included, are kept by a hash of the request
(bounded in entries and characters), so a schema costs one compile per process.
"""

from __future__ import annotations

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

log = logging.getLogger("ovtrio")

WORKER = Path(__file__).with_name("grammar_worker.py")


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


# Results kept: at most this many, and this many characters of grammar in all.
CACHE_ENTRIES = 1024
CACHE_CHARACTERS = 64 << 20
# The worker compiles with every VOCAB_SAMPLE-th token of the vocabulary, and its time
# limit is cut by as much (not its size limit: a grammar of a large enum is as large on
# any vocabulary). Why: the engine compiles each grammar
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
        self._process: trio.Process | None = None
        self._buffer = bytearray()
        self._lock = trio.Lock()
        self._cache: OrderedDict[str, tuple[bool, str]] = OrderedDict()
        self._cached_characters = 0
        self._vocab: bytes | None = None  # pickled, as the worker reads it
        self._killed: list[trio.Process] = []
        self.compiles = 0
        self.restarts = 0

    async def grammar(self, request: dict[str, Any]) -> str:
        """The EBNF grammar of `request` (a `kind` of "json_schema" with its `schema`
        text, or "structural_tag" with its `tags` and `triggers`; and the
        `stop_token_ids` the engine will match with), compiled; raises
        ConstraintRefused."""
        key = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
        found = self._cached(key)
        if found is None:
            async with self._lock:
                found = self._cached(key)
                if found is None:
                    found = await self._compile(request)
                    self._keep(key, found)
        compiled, text = found
        if not compiled:
            raise ConstraintRefused(text)
        return text

    def close(self) -> None:
        """Kill the worker, if one runs (the server is stopping)."""
        if self._process is not None:
            self._process.kill()
            self._process = None

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

    async def _compile(self, request: dict[str, Any]) -> tuple[bool, str]:
        """(True, grammar) or (False, why not); never raises for the constraint's sake."""
        try:
            process = await self._started()
        except (OSError, RuntimeError, trio.TooSlowError, trio.BrokenResourceError) as exc:
            log.warning("output constraints cannot be checked: %s", exc)
            self._stop()
            return False, f"output constraints cannot be checked on this server ({exc})"
        self.compiles += 1
        seconds = self.limits.seconds
        try:
            answer, over = await self._answer(process, request, seconds / VOCAB_SAMPLE)
        except trio.BrokenResourceError:  # it had ended
            answer, over = None, False
        except BaseException:
            self._stop()  # mid-compile: the next request starts a new worker
            raise
        if over:
            self._stop()
            return False, f"it takes more than {seconds:g} s to compile"
        if answer is None:
            self._stop()
            return False, "the grammar compiler ended while compiling it"
        if "grammar" in answer:
            return True, answer["grammar"]
        return False, _first_line(answer.get("error", ""))

    async def _answer(
        self, process: trio.Process, request: dict[str, Any], seconds: float
    ) -> tuple[dict[str, Any] | None, bool]:
        """Send `request` and await the answer: (answer, False), or (None, True) once the
        compile has used `seconds` of the worker's CPU time (or WALL_FACTOR times as much
        time on the clock). CPU time, not the clock: on a busy machine the worker gets
        little of it (it runs at a lower priority than the server), and a schema that
        compiles in time on an idle one is not to be refused because of the load."""
        assert process.stdin is not None
        await process.stdin.send_all(json.dumps(request).encode() + b"\n")
        started = _cpu_seconds(process.pid)
        deadline = trio.current_time() + seconds * WALL_FACTOR
        while True:
            with trio.move_on_after(POLL_SECONDS):
                return await self._line(), False
            if _cpu_seconds(process.pid) - started > seconds or trio.current_time() > deadline:
                return None, True

    async def _started(self) -> trio.Process:
        """The worker, started (again) if it is not running."""
        if self._process is not None:
            if self._process.poll() is None:
                return self._process
            self._stop()  # it ended between two compiles (killed from outside)
        for killed in self._killed:  # reaped, not left as zombies
            await killed.wait()
        self._killed.clear()
        if self._vocab is None:
            self._vocab = await trio.to_thread.run_sync(lambda: pickle.dumps(sampled(*self._vocabulary())))
        limits = self.limits
        command = [sys.executable, str(WORKER), str(limits.memory), str(limits.text), str(limits.compiled)]
        self._process = process = await trio.lowlevel.open_process(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self._buffer.clear()
        with trio.fail_after(START_SECONDS):
            assert process.stdin is not None
            await process.stdin.send_all(b"%d\n" % len(self._vocab) + self._vocab)
            ready = await self._line()
        if ready != {"ready": True}:
            raise RuntimeError("the grammar compiler did not start (is xgrammar 0.1.31 installed?)")
        return process

    async def _line(self) -> dict[str, Any] | None:
        """The worker's next answer; None once it has ended."""
        assert self._process is not None and self._process.stdout is not None
        while b"\n" not in self._buffer:
            data = await self._process.stdout.receive_some(1 << 16)
            if not data:
                return None
            self._buffer += data
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer[:] = rest
        answer: dict[str, Any] = json.loads(line)
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
