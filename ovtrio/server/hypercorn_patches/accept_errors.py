"""One log line, not a traceback ten times a second, when the server cannot accept
connections because the process is out of file descriptors (or the system of memory).

Hypercorn's trio worker accepts through `trio.serve_listeners`, which already backs off
on those errors (EMFILE, ENFILE, ENOMEM, ENOBUFS): it sleeps 100 ms and tries again,
while the connections it could not accept wait in the listen backlog. But it logs every
failed attempt at ERROR with its traceback, so a spell of exhaustion fills the log with
tracebacks, ten a second. `install()` puts a filter on trio's logger that turns the
first failure of a spell into one warning on ovtrio's log and drops the repeats; a
failure after QUIET_SECONDS without one starts a new spell, and is logged again.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("ovtrio")

# The logger trio.serve_listeners reports failed accepts on.
TRIO_ACCEPT_LOGGER = "trio.serve_listeners"

# Failures closer together than this belong to one spell (trio retries every 0.1 s).
QUIET_SECONDS = 5.0


class OneLinePerSpell(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self._last_failure = -float("inf")

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        new_spell = now - self._last_failure > QUIET_SECONDS
        self._last_failure = now
        if new_spell:
            log.warning(
                "not accepting new connections for now: %s (said once per spell; waiting connections"
                " are accepted as soon as descriptors free up)",
                record.getMessage(),
            )
        return False  # trio's own record, with its traceback, is dropped


_installed = False


def install() -> None:
    """Filter trio's accept-failure log, once per process."""
    global _installed
    if not _installed:
        logging.getLogger(TRIO_ACCEPT_LOGGER).addFilter(OneLinePerSpell())
        _installed = True
