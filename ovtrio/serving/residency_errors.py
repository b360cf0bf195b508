"""What the residency (ovtrio/serving/residency.py) raises when a model cannot serve a
request now, or cannot be unloaded now; the API layer words each for clients."""

from __future__ import annotations


class NotLoaded(Exception):
    """The model is not loaded and the server loads models only when asked to."""


class LoadFailed(Exception):
    """The model's load failed; the message is the reason, `retry_after` the seconds
    until it is loaded again (ovtrio/lifecycle/load_retry.py)."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class NoRoom(Exception):
    """Every loaded model ran requests for as long as a load may wait for room."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Stopping(Exception):
    """The server is shutting down: no load begins."""


class Busy(Exception):
    """An unload that may not wait was asked of a model running requests."""
