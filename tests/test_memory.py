"""Returning freed memory to the system (ovtrio/serving/memory.py).

The allocator's thresholds are checked against glibc itself, in a child process (they
are process-wide); when trims run is pure logic, checked with a stand-in for libc that
counts them.
"""

from __future__ import annotations

import ctypes.util
import subprocess
import sys
import textwrap

import pytest
import trio

from ovtrio.serving import memory

# Allocates 40 blocks of 2 MB, each followed by a block of 200 kB that stays (so the
# heap's top cannot shrink past them), touches them all and frees the large ones; then
# does it again; then asks glibc to return what is free. Prints how many MB of RSS the
# process kept after the first round, what the second round added, and what it kept
# after the trim (8 MB of it the small blocks). Before that, one 16 MB block is
# allocated and freed: left alone, glibc then raises its mmap threshold to 16 MB, so the
# 2 MB blocks land in the heap and keep their pages after they are freed.
RETAINED = textwrap.dedent(
    """
    import ctypes, sys
    from ovtrio.serving import memory

    if sys.argv[1] == "configured":
        assert memory.configure_allocator()
    elif sys.argv[1] == "kept":
        assert memory.configure_allocator()
        assert memory.keep_freed_memory()
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)

    def rss_mb():
        with open("/proc/self/statm") as file:
            return int(file.read().split()[1]) * 4096 / 1e6

    def allocate_and_free():
        blocks = []
        for _ in range(40):
            block = libc.malloc(2 << 20)
            ctypes.memset(block, 1, 2 << 20)
            blocks.append(block)
            pin = libc.malloc(200_000)
            ctypes.memset(pin, 1, 200_000)
        for block in blocks:
            libc.free(block)

    libc.free(libc.malloc(16 << 20))
    before = rss_mb()
    allocate_and_free()
    kept = rss_mb()
    allocate_and_free()
    again = rss_mb()
    libc.malloc_trim(0)
    print(kept - before, again - kept, rss_mb() - before)
    """
)


def retained_mb(mode: str) -> tuple[float, float, float]:
    """What the process kept after freeing 80 MB, what allocating them again added, and
    what it kept after a trim."""
    result = subprocess.run([sys.executable, "-c", RETAINED, mode], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    kept, added_again, after_trim = map(float, result.stdout.split())
    return kept, added_again, after_trim


glibc_only = pytest.mark.skipif(
    not sys.platform.startswith("linux") or ctypes.util.find_library("c") is None, reason="glibc's allocator only"
)


@glibc_only
def test_large_blocks_go_back_to_the_system_when_freed():
    # 80 MB were allocated and freed: glibc's defaults keep them all.
    assert retained_mb("default")[0] > 70
    assert retained_mb("configured")[0] < 20


@glibc_only
def test_while_large_requests_come_freed_blocks_are_reused_until_a_trim():
    kept, added_again, after_trim = retained_mb("kept")
    # Kept for the next ones, whose pages are already faulted in (the second round adds
    # only its small blocks, 8 MB)...
    assert kept > 70
    assert added_again < 20
    # ...until a trim gives them back.
    assert after_trim < 30


class FakeLibc:
    """Counts the trims asked for; each takes `seconds` of its worker thread."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.trims = 0
        self.seconds = seconds
        self.thresholds: dict[int, int] = {}

    def malloc_trim(self, pad: int) -> int:
        import time

        time.sleep(self.seconds)
        self.trims += 1
        return 1

    def mallopt(self, option: int, value: int) -> int:
        self.thresholds[option] = value
        return 1


@pytest.fixture
def libc(monkeypatch):
    fake = FakeLibc()
    monkeypatch.setattr(memory, "_libc", lambda: fake)
    monkeypatch.setattr(memory, "_trimmer", memory._Trimmer())
    return fake


async def test_small_releases_add_up_to_a_trim(libc):
    step = memory.TRIM_AFTER_BYTES // 4 + 1
    for _ in range(3):
        await memory.release_free_memory(step)
    assert libc.trims == 0
    await memory.release_free_memory(step)
    assert libc.trims == 1
    # The count starts again after a trim.
    await memory.release_free_memory(step)
    assert libc.trims == 1
    await memory.release_free_memory(memory.TRIM_AFTER_BYTES)
    assert libc.trims == 2


async def test_one_trim_at_a_time(libc):
    libc.seconds = 0.2
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(memory.release_free_memory, memory.TRIM_AFTER_BYTES)
    assert libc.trims == 1


async def test_trims_only_when_the_grammar_cache_changed(libc):
    sizes = [0, 0, 0, 5_000, 5_000, 5_000, 9_000, 4_000, 4_000]
    trims_seen = []

    def probe() -> int:
        # Called once at start and once a look: what had been trimmed by this look.
        trims_seen.append(libc.trims)
        if len(trims_seen) == len(sizes):
            scope.cancel()
        return sizes[len(trims_seen) - 1]

    async with trio.open_nursery() as nursery:
        scope = await nursery.start(
            lambda task_status: memory.trim_in_background(0.01, probe=probe, task_status=task_status)
        )
    # A trim after each look that saw a change (5,000, 9,000 and 4,000), none otherwise.
    assert trims_seen == [0, 0, 0, 0, 1, 1, 1, 2, 3]


def test_large_requests_make_a_trim_due_once_they_stop():
    large = memory._LargeRequests()
    assert not large.quiet(1000.0)  # none came
    large.note(10.0)
    assert not large.quiet(10.0 + memory.QUIET_SECONDS - 0.1)
    large.note(10.0 + memory.QUIET_SECONDS - 0.1)  # another one: the wait starts again
    assert not large.quiet(10.0 + memory.QUIET_SECONDS + 1)
    assert large.quiet(10.0 + 2 * memory.QUIET_SECONDS)


MMAP, TRIM = memory._M_MMAP_THRESHOLD, memory._M_TRIM_THRESHOLD
KEPT = {MMAP: memory.KEPT_MMAP_THRESHOLD_BYTES, TRIM: memory.KEPT_TRIM_THRESHOLD_BYTES}
RETURNED = {MMAP: memory.MMAP_THRESHOLD_BYTES, TRIM: memory.TRIM_THRESHOLD_BYTES}


def test_only_requests_of_a_megabyte_or_more_keep_freed_memory(libc, large_requests):
    memory.note_request_size(memory.LARGE_REQUEST_BYTES - 1)
    assert not memory._large_requests.pending
    assert libc.thresholds == {}
    memory.note_request_size(memory.LARGE_REQUEST_BYTES)
    assert memory._large_requests.pending
    assert libc.thresholds == KEPT


async def trims_by_look(libc, looks: int, large_request_at: set[int], grammar_cache_changes: bool) -> list[int]:
    """Runs the background task for `looks` looks at the grammar cache (one at start),
    the clock moving on by a tenth of the quiet time a look, a large request coming at
    the looks in `large_request_at`: how many trims had run by each look."""
    large = memory._large_requests
    now = 0.0
    trims_seen: list[int] = []

    def probe() -> int:
        nonlocal now
        trims_seen.append(libc.trims)
        if len(trims_seen) in large_request_at:
            large.note(now)
        if len(trims_seen) == looks:
            scope.cancel()
        now += memory.QUIET_SECONDS / 10
        return len(trims_seen) if grammar_cache_changes else 0

    async with trio.open_nursery() as nursery:
        scope = await nursery.start(
            lambda task_status: memory.trim_in_background(
                0.001, probe=probe, clock=lambda: now, task_status=task_status
            )
        )
    return trims_seen


@pytest.fixture
def large_requests(monkeypatch):
    monkeypatch.setattr(memory, "_large_requests", memory._LargeRequests())
    return memory._large_requests


async def test_one_trim_after_large_requests_stop(libc, large_requests):
    trims_seen = await trims_by_look(libc, 60, {3, 30}, grammar_cache_changes=False)
    # One trim ten looks after each large request (seen from the look after it), none
    # before or between; then freed memory goes back at once again.
    assert trims_seen.index(1) == 3 + 10 - 1
    assert trims_seen.index(2) == 30 + 10 - 1
    assert trims_seen[-1] == 2
    assert libc.thresholds == RETURNED


async def test_grammar_changes_wait_for_large_requests_to_stop(libc, large_requests):
    # The grammar cache changes at every look: no trim until the quiet one, then one a look.
    trims_seen = await trims_by_look(libc, 14, {1}, grammar_cache_changes=True)
    assert trims_seen == [0] * 10 + [1, 2, 3, 4]


async def test_nothing_to_do_without_glibc(monkeypatch):
    monkeypatch.setattr(memory, "_libc", lambda: None)
    assert memory.configure_allocator() is False
    await memory.release_free_memory(10 * memory.TRIM_AFTER_BYTES)
    with trio.move_on_after(5) as waiting:
        async with trio.open_nursery() as nursery:
            await nursery.start(memory.trim_in_background)
    # The task ended by itself: nothing to probe or trim.
    assert not waiting.cancelled_caught
