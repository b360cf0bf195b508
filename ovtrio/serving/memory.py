"""Giving freed memory back to the operating system, except while large requests come.

glibc's allocator keeps freed memory for reuse instead of returning it: after big
objects are dropped the process still holds their pages, and its RSS stays where the
peak left it. Returning them at once has its own cost: a page mapped again faults in on
first touch, which is dear on a virtual machine's guest. A request with images (a body
of megabytes, copied into its buffer, then its data URLs read as strings) spent several
times more of the event loop's time in those faults than once the pages were reused
(measured in docs/benchmarks.md#images). So:

- `configure_allocator`, once at start, fixes glibc's two thresholds (mallopt). A block
  of `MMAP_THRESHOLD_BYTES` or more gets a mapping of its own, unmapped when it is
  freed; free space over `TRIM_THRESHOLD_BYTES` at the top of a heap goes back at once.
  Left alone, glibc raises both thresholds each time a large block is freed (up to 32
  and 64 MB), and from then on such blocks live in the heap and keep their pages after
  they are freed.
- While large requests come (`note_request_size`: an HTTP body or a WebSocket message
  of `LARGE_REQUEST_BYTES` or more), the thresholds are raised to `KEPT_*`: blocks under
  32 MB (glibc's most) come from a heap, and what is freed stays there for the next
  request. Once none has come for `QUIET_SECONDS`, `trim_in_background` returns what is
  free and puts the thresholds back.
- `trim_in_background` also trims when the engine's grammar cache changed: its threads
  free memory the server cannot see (a grammar's compilation, a compiled grammar
  evicted from XGrammar's cache), in their own arenas: without a trim, RSS grew by
  far more than the cache held over many distinct schemas (the grammar cache attack,
  docs/benchmarks.md#attacks-huge-inputs-cache-growth-closed-sockets). While large
  requests come, that trim waits for theirs, which returns what the compilations freed
  as well: a trim walks every arena's heap, and then those hold what the large requests
  freed.
- `return_free_memory` once a model is loaded and warmed up (loading frees much).
- `release_free_memory`: the server's own large releases (stored responses deleted or
  expired) are counted, and each time they add up to `TRIM_AFTER_BYTES`, a trim runs.

Every trim is malloc_trim in a worker thread (ctypes drops the GIL). None is periodic:
it locks each arena while it walks that arena's heap, and every allocation the event
loop makes meanwhile waits: one every few seconds raised `/health`'s p99 while images
decoded (measured in docs/benchmarks.md#images).

Elsewhere than glibc, all of this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import math
import time
from collections.abc import Callable

import trio

log = logging.getLogger("ovtrio")

# Blocks this large are mapped on their own and unmapped when freed. Below it, the
# engine's per-step buffers (a few rows of logits) are reused from the heap, not mapped
# and faulted in anew every step.
MMAP_THRESHOLD_BYTES = 1024 * 1024
# Free space at the top of a heap beyond this goes back to the system when freed.
TRIM_THRESHOLD_BYTES = 4 * 1024 * 1024
# While large requests come: blocks under glibc's largest mmap threshold come from a
# heap, and free space stays at the top of a heap up to more than a burst of them uses
# (docs/benchmarks.md#request-bodies).
KEPT_MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
KEPT_TRIM_THRESHOLD_BYTES = 1024 * 1024 * 1024
# Requests this large keep freed memory until none has come for QUIET_SECONDS.
LARGE_REQUEST_BYTES = 1024 * 1024
QUIET_SECONDS = 30.0
# Below this many bytes released since the last trim, trimming is not worth a walk.
TRIM_AFTER_BYTES = 1024 * 1024
# How often the background task looks whether a trim is due.
CHECK_SECONDS = 2.0

# glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim.argtypes = (ctypes.c_size_t,)
        libc.malloc_trim.restype = ctypes.c_int
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.mallopt.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def configure_allocator() -> bool:
    """Fix glibc's mmap and trim thresholds for the whole process, so that large freed
    blocks go back to the system; False where there is no glibc (or it refused)."""
    return _set_thresholds(MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES)


def keep_freed_memory() -> bool:
    """Raise glibc's thresholds, so that freed blocks under 32 MB stay in the heap for
    the next large request (until configure_allocator puts them back)."""
    return _set_thresholds(KEPT_MMAP_THRESHOLD_BYTES, KEPT_TRIM_THRESHOLD_BYTES)


def _set_thresholds(mmap_threshold: int, trim_threshold: int) -> bool:
    libc = _libc()
    if libc is None:
        return False
    done = libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold) == 1
    done = libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold) == 1 and done
    if not done:
        log.warning("cannot set the allocator's thresholds: memory freed may not go back to the system")
    return done


class _Trimmer:
    """Runs malloc_trim in a worker thread, one at a time: a release while a trim runs
    is counted toward the next one."""

    def __init__(self) -> None:
        self.released = 0
        self.running = False
        self.trims = 0

    async def trim(self) -> bool:
        libc = _libc()
        if libc is None or self.running:
            return False
        self.running = True
        self.released = 0
        try:
            await trio.to_thread.run_sync(libc.malloc_trim, 0)
        finally:
            self.running = False
        self.trims += 1
        return True

    async def released_bytes(self, count: int) -> bool:
        self.released += count
        if self.released < TRIM_AFTER_BYTES:
            return False
        return await self.trim()


_trimmer = _Trimmer()


async def return_free_memory() -> None:
    """Return free memory to the system now (after something freed a lot: a model's
    loading and warm-up)."""
    await _trimmer.trim()


async def release_free_memory(released_bytes: int) -> None:
    """After `released_bytes` of objects were dropped, return free memory to the system
    once such releases add up to TRIM_AFTER_BYTES."""
    await _trimmer.released_bytes(released_bytes)


class _LargeRequests:
    """Whether large requests came since freed memory was last returned, and when the
    last one came."""

    def __init__(self) -> None:
        self.pending = False
        self.last = -math.inf

    def note(self, now: float) -> None:
        self.pending = True
        self.last = now

    def quiet(self, now: float) -> bool:
        """Large requests came, and none for QUIET_SECONDS: time to trim."""
        return self.pending and now - self.last >= QUIET_SECONDS

    def returned(self) -> None:
        """Freed memory is being returned: none of the requests so far count any more."""
        self.pending = False


_large_requests = _LargeRequests()


def note_request_size(size: int) -> None:
    """A request body or WebSocket message of `size` bytes arrives: from
    LARGE_REQUEST_BYTES, freed memory is kept for the next one until they stop."""
    if size < LARGE_REQUEST_BYTES:
        return
    if not _large_requests.pending:
        keep_freed_memory()
    _large_requests.note(time.monotonic())


def _grammar_cache_bytes() -> int:
    from ovtrio.constraints import cache as grammar_cache

    return grammar_cache.cache_bytes()


async def trim_in_background(
    interval: float = CHECK_SECONDS,
    *,
    probe: Callable[[], int] = _grammar_cache_bytes,
    clock: Callable[[], float] = time.monotonic,
    task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Every `interval` seconds, return free memory to the system if large requests came
    and then stopped for QUIET_SECONDS (and put the allocator's thresholds back), or if
    `probe` (the engine's grammar cache size) changed since the last look while no large
    requests come; until the cancel scope handed to the starter is cancelled."""
    with trio.CancelScope() as scope:
        task_status.started(scope)
        if _libc() is None:
            return
        seen = probe()
        while True:
            await trio.sleep(interval)
            now = probe()
            grammars_changed = now != seen
            seen = now
            if _large_requests.quiet(clock()):
                _large_requests.returned()
                configure_allocator()
                await _trimmer.trim()
            elif grammars_changed and not _large_requests.pending:
                await _trimmer.trim()
