"""The generation models whose last load failed, so that a request in the next few
seconds hears the failure instead of loading the model again (the rule, and why:
ovtrio/lifecycle/load_retry.py). A model unloaded by hand (POST /models/unload) forgets its
failure, and its next request loads it."""

from __future__ import annotations

from pathlib import Path

from ovtrio.lifecycle.load_retry import RETRY_AFTER, FailedLoad
from ovtrio.serving.service import ModelService


def _path_of(service: ModelService) -> Path | None:
    return service.source.path if service.source is not None else None


class FailedLoads:
    def __init__(self) -> None:
        self._failures: dict[ModelService, FailedLoad] = {}

    def settled(self, service: ModelService) -> None:
        """A load of `service` has ended, loaded or failed."""
        if service.ready.is_set():
            self._failures.pop(service, None)
        elif service.failed.is_set():
            self._failures[service] = FailedLoad.now(_path_of(service))

    def too_soon(self, service: ModelService) -> bool:
        """Whether `service` failed to load a moment ago, and nothing changed since."""
        failure = self._failures.get(service)
        return service.state == "failed" and failure is not None and failure.too_soon(_path_of(service))

    def retry_after(self, service: ModelService) -> int:
        """Whole seconds until `service`, whose load failed, is loaded again."""
        failure = self._failures.get(service)
        return failure.retry_after() if failure is not None else round(RETRY_AFTER)

    def forget(self, service: ModelService) -> None:
        """`service` is served no more."""
        self._failures.pop(service, None)
