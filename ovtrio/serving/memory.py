"""Giving freed memory back to the operating system.

glibc's allocator keeps freed memory for reuse instead of returning it: after big
objects are dropped the process still holds their pages, and its RSS stays where the
peak left it. These return it, none of which walks the heap while requests are served
unless something just freed a lot:

- `configure_allocator`, once at start, fixes glibc's two thresholds (mallopt). A block
  of `MMAP_THRESHOLD_BYTES` or more (a request body, a decoded image, a long prompt's
  buffers) gets a mapping of its own, unmapped when it is freed; free space over
  `TRIM_THRESHOLD_BYTES` at the top of a heap goes back at once. Left alone, glibc
  raises both thresholds each time a large block is freed (up to 32 and 64 MB), and
  from then on such blocks live in the heap and keep their pages after they are freed.
- `return_free_memory` once a model is loaded and warmed up (loading frees much).
- `release_free_memory`: the server's own large releases (stored responses deleted or
  expired) are counted, and each time they add up to `TRIM_AFTER_BYTES`, glibc is asked
  to return what it can (malloc_trim, in a worker thread: ctypes drops the GIL).
- `trim_after_grammar_changes`: the engine's threads free memory the server cannot see
  (a grammar's compilation, a compiled grammar evicted from XGrammar's cache), in their
  own arenas. Every 2 s the task reads the cache's size (one call, no heap walked); when
  it changed since the last look, a trim runs in a worker thread. Over 150 distinct
  schemas, RSS grew 162 MB without any trim while the cache held 68 MB.

Not a periodic malloc_trim: it locks each arena while it walks that arena's heap, and
every allocation the event loop makes meanwhile waits. With one every 2 s, `/health`
p99 while images decoded was 48 ms, against 28 ms without (bench/images.py).

Elsewhere than glibc, all of this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable

import trio

log = logging.getLogger("ovtrio")

# Blocks this large are mapped on their own and unmapped when freed. Below it, the
# engine's per-step buffers (a few rows of logits) are reused from the heap, not mapped
# and faulted in anew every step.
MMAP_THRESHOLD_BYTES = 1024 * 1024
# Free space at the top of a heap beyond this goes back to the system when freed.
TRIM_THRESHOLD_BYTES = 4 * 1024 * 1024
# Below this many bytes released since the last trim, trimming is not worth a walk.
TRIM_AFTER_BYTES = 1024 * 1024
# How often the grammar cache's size is read.
GRAMMAR_CHECK_SECONDS = 2.0

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


def _grammar_cache_bytes() -> int:
    from ovtrio.model import grammar_cache

    return grammar_cache.cache_bytes()


async def trim_after_grammar_changes(
    interval: float = GRAMMAR_CHECK_SECONDS,
    *,
    probe: Callable[[], int] = _grammar_cache_bytes,
    task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Every `interval` seconds, read `probe` (the engine's grammar cache size) and return
    free memory to the system if it changed since the last look, until the cancel scope
    handed to the starter is cancelled."""
    with trio.CancelScope() as scope:
        task_status.started(scope)
        if _libc() is None:
            return
        seen = probe()
        while True:
            await trio.sleep(interval)
            now = probe()
            if now != seen:
                seen = now
                await _trimmer.trim()
