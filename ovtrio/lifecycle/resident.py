"""What every served model is to the residency, the registry's listing, the model cards
and the metrics, whatever its kind: a `Resident`, in one `ModelState` at a time."""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

from ovtrio.lifecycle.lease import LeaseCount

__all__ = ["ModelState", "Resident"]


class ModelState(StrEnum):
    """llama-server's router words for a model's state (and the failure of its last
    load). A StrEnum: it is the word itself in a JSON body and a metric label."""

    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"
    FAILED = "failed"


class Resident(Protocol):
    """A served model: generation, vision, embedding, rerank or transcription."""

    @property
    def name(self) -> str:
        """The name requests give it (`model`)."""
        ...

    @property
    def kind(self) -> str:
        """What it serves: generation, embedding, rerank or transcription."""
        ...

    @property
    def state(self) -> ModelState: ...

    @property
    def failure(self) -> str | None:
        """Why its last load or serving failed, as clients read it; None unless failed."""
        ...

    @property
    def idle(self) -> bool:
        """Loaded, with no lease out and nothing running or waiting: free to unload."""
        ...

    # The requests that hold it now (lease.py), when one last used it (trio's clock), and
    # how long it may stay loaded idle when a request said so (None: the server's rule).
    leases: LeaseCount
    last_used: float
    keep_alive: float | None
