"""Stored responses: what GET /v1/responses/{id} returns and what previous_response_id
continues from. Bounded by count and age; kept in memory, and also in an SQLite file
when one is configured, so they survive a restart."""

from __future__ import annotations

import json
import sqlite3
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class StoredResponse:
    response: dict[str, Any]
    input_items: list[dict[str, Any]]  # the request's input items, with ids
    # The conversation up to and including this response's output, as chat messages
    # (dicts of ChatMessage fields), for a continuation to start from.
    conversation: list[dict[str, Any]]
    stored_at: float = field(default_factory=time.time)


class ResponseStore:
    def __init__(self, max_entries: int = 1000, max_age_seconds: float = 3600.0, path: str | None = None) -> None:
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self.max_entries = max_entries
        self.max_age_seconds = max_age_seconds
        self._db: sqlite3.Connection | None = None
        if path:
            self._db = sqlite3.connect(Path(path).expanduser(), isolation_level=None, check_same_thread=False)
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, stored_at REAL NOT NULL, entry TEXT NOT NULL)"
            )
            self._db.execute("CREATE INDEX IF NOT EXISTS responses_age ON responses (stored_at)")

    def put(self, entry: StoredResponse) -> None:
        response_id = entry.response["id"]
        self._entries[response_id] = entry
        self._entries.move_to_end(response_id)
        if self._db is not None:
            self._db.execute(
                "INSERT OR REPLACE INTO responses VALUES (?, ?, ?)",
                (response_id, entry.stored_at, json.dumps(asdict(entry))),
            )
        self._expire()

    def get(self, response_id: str) -> StoredResponse | None:
        self._expire()
        entry = self._entries.get(response_id)
        if entry is None and self._db is not None:
            row = self._db.execute("SELECT entry FROM responses WHERE id = ?", (response_id,)).fetchone()
            entry = StoredResponse(**json.loads(row[0])) if row else None
        return entry

    def delete(self, response_id: str) -> bool:
        found = self._entries.pop(response_id, None) is not None
        if self._db is not None:
            found = self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount > 0 or found
        return found

    def __len__(self) -> int:
        return len(self._entries)

    def _expire(self) -> None:
        oldest_allowed = time.time() - self.max_age_seconds
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        while self._entries and next(iter(self._entries.values())).stored_at < oldest_allowed:
            self._entries.popitem(last=False)
        if self._db is not None:
            self._db.execute("DELETE FROM responses WHERE stored_at < ?", (oldest_allowed,))
            self._db.execute(
                "DELETE FROM responses WHERE id NOT IN (SELECT id FROM responses ORDER BY stored_at DESC LIMIT ?)",
                (self.max_entries,),
            )
