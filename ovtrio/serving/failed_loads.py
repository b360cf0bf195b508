"""When a model whose load failed is loaded again: not within RETRY_AFTER seconds of
the failure, unless its file changed meanwhile. Each load holds the one load turn
(ovtrio/serving/residency.py) for as long as a load takes, so a client asking again and
again for a broken model would otherwise hold up everyone's loads; its requests hear
the failure's reason at once instead. A model unloaded by hand (POST /models/unload)
forgets its failure, and its next request loads it."""

from __future__ import annotations

import trio

from ovtrio.serving.service import ModelService

# Seconds after a failed load during which the model is not loaded again.
RETRY_AFTER = 10.0

# A model's file (or IR folder) as it was: when it last changed, and its size.
FileState = tuple[int, int] | None


def file_state(service: ModelService) -> FileState:
    if service.source is None:
        return None
    try:
        status = service.source.path.stat()
    except OSError:
        return None
    return status.st_mtime_ns, status.st_size


class FailedLoads:
    def __init__(self) -> None:
        # The models whose last load failed: when, and their file as it was then.
        self._failures: dict[ModelService, tuple[float, FileState]] = {}

    def settled(self, service: ModelService) -> None:
        """A load of `service` has ended, loaded or failed."""
        if service.ready.is_set():
            self._failures.pop(service, None)
        elif service.failed.is_set():
            self._failures[service] = (trio.current_time(), file_state(service))

    def too_soon(self, service: ModelService) -> bool:
        """Whether `service` failed to load a moment ago, and nothing changed since."""
        failure = self._failures.get(service)
        if service.state != "failed" or failure is None:
            return False
        when, file = failure
        return trio.current_time() - when < RETRY_AFTER and file_state(service) == file
