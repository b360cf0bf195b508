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
# heap's top cannot shrink past them), touches them all, frees the large ones and prints
# how many MB of RSS the process kept (8 MB of it the small blocks). Before that, one
# 16 MB block is allocated and freed: left alone, glibc then raises its mmap threshold
# to 16 MB, so the 2 MB blocks land in the heap and keep their pages after they are
# freed.
RETAINED = textwrap.dedent(
    """
    import ctypes, sys
    from ovtrio.serving import memory

    if sys.argv[1] == "configured":
        assert memory.configure_allocator()
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)

    def rss_mb():
        with open("/proc/self/statm") as file:
            return int(file.read().split()[1]) * 4096 / 1e6

    libc.free(libc.malloc(16 << 20))
    before = rss_mb()
    blocks, pins = [], []
    for _ in range(40):
        block = libc.malloc(2 << 20)
        ctypes.memset(block, 1, 2 << 20)
        blocks.append(block)
        pin = libc.malloc(200_000)
        ctypes.memset(pin, 1, 200_000)
        pins.append(pin)
    for block in blocks:
        libc.free(block)
    print(rss_mb() - before)
    """
)


def retained_mb(mode: str) -> float:
    result = subprocess.run([sys.executable, "-c", RETAINED, mode], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return float(result.stdout)


glibc_only = pytest.mark.skipif(
    not sys.platform.startswith("linux") or ctypes.util.find_library("c") is None, reason="glibc's allocator only"
)


@glibc_only
def test_large_blocks_go_back_to_the_system_when_freed():
    # 80 MB were allocated and freed: glibc's defaults keep them all.
    assert retained_mb("default") > 70
    assert retained_mb("configured") < 20


class FakeLibc:
    """Counts the trims asked for; each takes `seconds` of its worker thread."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.trims = 0
        self.seconds = seconds

    def malloc_trim(self, pad: int) -> int:
        import time

        time.sleep(self.seconds)
        self.trims += 1
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
            lambda task_status: memory.trim_after_grammar_changes(0.01, probe=probe, task_status=task_status)
        )
    # A trim after each look that saw a change (5,000, 9,000 and 4,000), none otherwise.
    assert trims_seen == [0, 0, 0, 0, 1, 1, 1, 2, 3]


async def test_nothing_to_do_without_glibc(monkeypatch):
    monkeypatch.setattr(memory, "_libc", lambda: None)
    assert memory.configure_allocator() is False
    await memory.release_free_memory(10 * memory.TRIM_AFTER_BYTES)
    with trio.move_on_after(5) as waiting:
        async with trio.open_nursery() as nursery:
            await nursery.start(memory.trim_after_grammar_changes)
    # The task ended by itself: nothing to probe or trim.
    assert not waiting.cancelled_caught
