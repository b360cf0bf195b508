"""Stored responses: what GET /v1/responses/{id} returns and what previous_response_id
continues from. Bounded by count and age; kept in memory (per server process)."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StoredResponse:
    response: dict[str, Any]
    input_items: list[dict[str, Any]]  # the request's input items, with ids
    # The conversation up to and including this response's output, as chat messages
    # (dicts of ChatMessage fields), for a continuation to start from.
    conversation: list[dict[str, Any]]
    stored_at: float = field(default_factory=time.monotonic)


class ResponseStore:
    def __init__(self, max_entries: int = 1000, max_age_seconds: float = 3600.0) -> None:
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self.max_entries = max_entries
        self.max_age_seconds = max_age_seconds

    def put(self, entry: StoredResponse) -> None:
        self._entries[entry.response["id"]] = entry
        self._entries.move_to_end(entry.response["id"])
        self._expire()

    def get(self, response_id: str) -> StoredResponse | None:
        self._expire()
        return self._entries.get(response_id)

    def delete(self, response_id: str) -> bool:
        return self._entries.pop(response_id, None) is not None

    def __len__(self) -> int:
        return len(self._entries)

    def _expire(self) -> None:
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        oldest_allowed = time.monotonic() - self.max_age_seconds
        while self._entries:
            first = next(iter(self._entries.values()))
            if first.stored_at >= oldest_allowed:
                break
            self._entries.popitem(last=False)
