"""Stored responses: what GET /v1/responses/{id} returns and what previous_response_id
continues from. Bounded by count, by size in bytes and by age; kept in memory, and also
in an SQLite file when one is configured, so they survive a restart.

An entry's size is what its objects take in memory (sys.getsizeof over every dict, list
and string in it), not the length of its JSON text, which undercounts small objects
several times. Memory freed by a deletion or an eviction of large entries is given back
to the system (ovtrio/serving/memory.py), so a DELETE lowers the server's footprint.

The SQLite file's reads and writes run in a worker thread, one at a time (the
connection is shared), so a slow disk or a long fsync never pauses the event loop;
lookups find recent responses in memory first without leaving the loop's thread.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import trio

from ovtrio.serving.memory import release_free_memory


@dataclass
class StoredResponse:
    response: dict[str, Any]
    input_items: list[dict[str, Any]]  # the request's input items, with ids
    # The conversation up to and including this response's output, as chat messages
    # (dicts of ChatMessage fields), for a continuation to start from.
    conversation: list[dict[str, Any]]
    stored_at: float = field(default_factory=time.time)
    size: int = 0  # bytes in memory, set by the store

    def measured(self) -> StoredResponse:
        self.size = memory_size(self.response) + memory_size(self.input_items) + memory_size(self.conversation)
        return self


def memory_size(value: Any) -> int:
    """Bytes `value` takes in memory: its own and those of everything it holds (shared
    objects counted each time they appear, which errs on the large side)."""
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        for key, item in value.items():
            size += sys.getsizeof(key) + memory_size(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            size += memory_size(item)
    return size


class ResponseStore:
    def __init__(
        self,
        max_entries: int = 1000,
        max_age_seconds: float = 3600.0,
        path: str | None = None,
        max_bytes: float = float("inf"),
    ) -> None:
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self.max_entries = max_entries
        self.max_age_seconds = max_age_seconds
        self.max_bytes = max_bytes
        self.bytes = 0  # of the entries in memory
        self._db: sqlite3.Connection | None = None
        # One SQLite call at a time: the connection is shared by the worker threads.
        self._db_limiter = trio.CapacityLimiter(1)
        if path:
            self._db = sqlite3.connect(Path(path).expanduser(), isolation_level=None, check_same_thread=False)
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS responses"
                " (id TEXT PRIMARY KEY, stored_at REAL NOT NULL, entry TEXT NOT NULL)"
            )
            self._db.execute("CREATE INDEX IF NOT EXISTS responses_age ON responses (stored_at)")

    async def put(self, entry: StoredResponse) -> None:
        """Keep `entry`; one larger than the whole store's bytes is not kept."""
        response_id = entry.response["id"]
        entry.measured()
        if entry.size > self.max_bytes:
            return
        self._drop(response_id)
        self._entries[response_id] = entry
        self.bytes += entry.size
        released = self._expire_in_memory()
        if self._db is not None:
            await self._in_thread(self._db_put, entry)
        await release_free_memory(released)

    async def get(self, response_id: str) -> StoredResponse | None:
        released = self._expire_in_memory()
        entry = self._entries.get(response_id)
        if entry is None and self._db is not None:
            entry = await self._in_thread(self._db_get, response_id)
        await release_free_memory(released)
        return entry

    async def delete(self, response_id: str) -> bool:
        released = self._drop(response_id)
        found = released > 0
        if self._db is not None:
            found = await self._in_thread(self._db_delete, response_id) or found
        await release_free_memory(released)
        return found

    def __len__(self) -> int:
        return len(self._entries)

    def _drop(self, response_id: str) -> int:
        """Forget one entry in memory; the bytes it held (0: there was none)."""
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return 0
        self.bytes -= entry.size
        return max(entry.size, 1)

    def _drop_oldest(self) -> int:
        response_id = next(iter(self._entries))
        return self._drop(response_id)

    def _expire_in_memory(self) -> int:
        """Drop entries beyond the count, the bytes and the age; the bytes released."""
        released = 0
        oldest_allowed = time.time() - self.max_age_seconds
        while len(self._entries) > self.max_entries or (self._entries and self.bytes > self.max_bytes):
            released += self._drop_oldest()
        while self._entries and next(iter(self._entries.values())).stored_at < oldest_allowed:
            released += self._drop_oldest()
        return released

    async def _in_thread(self, function: Any, *args: Any) -> Any:
        return await trio.to_thread.run_sync(function, *args, limiter=self._db_limiter)

    # ---- SQLite, in the worker thread ---------------------------------------------------

    def _db_put(self, entry: StoredResponse) -> None:
        assert self._db is not None
        # Written here, not on the event loop: the JSON of a response whose input held
        # images is megabytes, which json.dumps takes milliseconds to write, holding the GIL.
        row = (entry.response["id"], entry.stored_at, json.dumps(asdict(entry)))
        self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?)", row)
        self._db_expire()

    def _db_get(self, response_id: str) -> StoredResponse | None:
        assert self._db is not None
        self._db_expire()
        row = self._db.execute("SELECT entry FROM responses WHERE id = ?", (response_id,)).fetchone()
        return StoredResponse(**json.loads(row[0])) if row else None

    def _db_delete(self, response_id: str) -> bool:
        assert self._db is not None
        return self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount > 0

    def _db_expire(self) -> None:
        assert self._db is not None
        oldest_allowed = time.time() - self.max_age_seconds
        self._db.execute("DELETE FROM responses WHERE stored_at < ?", (oldest_allowed,))
        self._db.execute(
            "DELETE FROM responses WHERE id NOT IN (SELECT id FROM responses ORDER BY stored_at DESC LIMIT ?)",
            (self.max_entries,),
        )
