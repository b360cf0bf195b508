"""Giving freed memory back to the operating system, without giving it back too soon.

glibc's allocator keeps freed memory for reuse instead of returning it: after big
objects are dropped the process still holds their pages, and its RSS stays where the
peak left it. Returning them at once costs as much: a page mapped again faults in on
first touch, and on a virtual machine's guest that costs about 1 ms a megabyte (a 2-core
Xeon KVM guest). A request with four 1024-pixel images (a 17 MB body, copied into its
buffer, then its data URLs into strings) spent 24-29 ms of the event loop's time in
those faults alone, and 5-6 ms once the pages were reused (bench/images.py). So freed
memory is kept while large requests keep coming, and returned once they stop; none of
this walks a heap while requests are served unless something just freed a lot:

- `configure_allocator`, once at start, fixes glibc's two thresholds (mallopt). A block
  under `MMAP_THRESHOLD_BYTES` (glibc's largest: any request body, a decoded image, a
  long prompt's buffers) comes from a heap, where the next one reuses its pages; only
  larger ones get a mapping of their own, unmapped when freed. Free space at the top of
  a heap goes back at once only beyond `TRIM_THRESHOLD_BYTES`. Left alone, glibc starts
  from 128 kB and raises both thresholds as large blocks are freed, so that what it
  returns at once depends on what the process happened to free first.
- `trim_in_background` returns what is free (malloc_trim, in a worker thread: ctypes
  drops the GIL) once no large request (an HTTP body or a
  WebSocket message of a megabyte or more, `note_request_size`) has come for `QUIET_SECONDS`, and when the
  engine's grammar cache changed: its threads free memory the server cannot see (a
  grammar's compilation, a compiled grammar evicted from XGrammar's cache), in their
  own arenas. Over 150 distinct schemas, RSS grew 162 MB without any trim while the
  cache held 68 MB.
- `return_free_memory` once a model is loaded and warmed up (loading frees much).
- `release_free_memory`: the server's own large releases (stored responses deleted or
  expired) are counted, and each time they add up to `TRIM_AFTER_BYTES`, a trim runs.

Not a periodic malloc_trim while requests come: it locks each arena while it walks that
arena's heap, and every allocation the event loop makes meanwhile waits. With one every
2 s, `/health` p99 while images decoded was 48 ms, against 28 ms without
(bench/images.py).

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

# Blocks this large are mapped on their own and unmapped when freed; smaller ones (glibc
# takes at most 32 MB here) come from a heap and reuse pages already faulted in.
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
# Free space at the top of a heap beyond this goes back to the system at once; below
# it, it waits for a trim. Large enough for a burst of large requests (8 requests of
# four 1024-pixel images use about 300 MB at once).
TRIM_THRESHOLD_BYTES = 1024 * 1024 * 1024
# A trim runs once no request of LARGE_REQUEST_BYTES or more has come for QUIET_SECONDS.
LARGE_REQUEST_BYTES = 1024 * 1024
QUIET_SECONDS = 30.0
# Below this many bytes released since the last trim, trimming is not worth a walk.
TRIM_AFTER_BYTES = 1024 * 1024
# How often the background task looks whether a trim is due.
CHECK_SECONDS = 1.0

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


def configure_allocator(mmap_threshold: int = MMAP_THRESHOLD_BYTES, trim_threshold: int = TRIM_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap and trim thresholds for the whole process; False where there is
    no glibc (or it refused)."""
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
    """Whether large requests came since the last trim, and when the last one came."""

    def __init__(self) -> None:
        self.pending = False
        self.last = -math.inf

    def note(self, now: float) -> None:
        self.pending = True
        self.last = now

    def quiet(self, now: float) -> bool:
        """Large requests came, and none for QUIET_SECONDS: time to trim."""
        return self.pending and now - self.last >= QUIET_SECONDS


_large_requests = _LargeRequests()


def note_request_size(size: int) -> None:
    """A request body or WebSocket message of `size` bytes arrives: from
    LARGE_REQUEST_BYTES, freed memory is kept for the next one until they stop."""
    if size >= LARGE_REQUEST_BYTES:
        _large_requests.note(time.monotonic())


def _grammar_cache_bytes() -> int:
    from ovtrio.model import grammar_cache

    return grammar_cache.cache_bytes()


async def trim_in_background(
    interval: float = CHECK_SECONDS,
    *,
    probe: Callable[[], int] = _grammar_cache_bytes,
    clock: Callable[[], float] = time.monotonic,
    task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Every `interval` seconds, return free memory to the system if large requests came
    and then stopped for QUIET_SECONDS, or if `probe` (the engine's grammar cache size)
    changed since the last look; until the cancel scope handed to the starter is
    cancelled."""
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
            quiet = _large_requests.quiet(clock())
            if grammars_changed or quiet:
                if quiet:
                    _large_requests.pending = False
                await _trimmer.trim()
