"""SIGTERM and SIGINT between the start of `ovtrio serve`'s model load and the server's
own handlers (installed once Trio runs, after the web framework's import).

Without these, a signal in that time would meet no handler: the default action, which
in a container's first process is to ignore SIGTERM, so a start that hangs could not
be stopped. The first signal is kept, and the server, once it runs, stops at once as if
it had come then (nothing is served yet, so nothing is drained); a second one ends the
process at once.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Sequence
from types import FrameType

log = logging.getLogger("ovtrio")


class EarlySignals:
    """Handlers for `signals`, installed by the constructor; `received` is the name of
    the first that came (None while none has)."""

    def __init__(self, signals: Sequence[signal.Signals]) -> None:
        self.received: str | None = None
        for number in signals:
            signal.signal(number, self._handle)

    def _handle(self, number: int, frame: FrameType | None) -> None:
        name = signal.Signals(number).name
        if self.received is not None:
            log.warning("second signal (%s) before the server runs: exiting now", name)
            os._exit(128 + number)
        self.received = name
        log.info("%s while the model loads: stopping as soon as the server runs", name)
