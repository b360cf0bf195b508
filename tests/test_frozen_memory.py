"""What a model's ready does to the collector (ovtrio/serving/load_waits.py settle_memory):
what lives then is frozen, out of a full collection's walk, but garbage made before it
is collected first, never frozen for good (each model loaded on demand freezes once
more, and an unloaded one is freed by reference counts, with no unfreeze)."""

from __future__ import annotations

import gc
import weakref

from ovtrio.serving.load_waits import settle_memory


class Node:
    def __init__(self) -> None:
        self.itself = self  # a reference cycle: only the collector frees it


async def test_garbage_made_before_a_ready_is_collected_and_what_lives_is_frozen() -> None:
    gc.disable()  # no automatic collection between the steps: only settle_memory's
    try:
        await settle_memory()  # a first model's ready
        living = Node()
        garbage = weakref.ref(Node())
        assert garbage() is not None  # in a cycle: not freed by reference counts
        await settle_memory()  # the next model's
        assert garbage() is None
        assert not any(candidate is living for candidate in gc.get_objects())  # frozen: out of sight
    finally:
        gc.unfreeze()
        gc.enable()
    assert any(candidate is living for candidate in gc.get_objects())
