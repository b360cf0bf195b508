"""The log records of a child process (ovtrio/loading/cache_build.py, builder/child.py), in the server's log.

A child's records go to its standard error as lines marked CHILD_RECORD, beside whatever
the engine writes there; the parent logs them as its own once the child ends and keeps
the other lines (the last of which says why a child failed)."""

from __future__ import annotations

import logging
import sys

CHILD_RECORD = "ovtrio-child-record "
log = logging.getLogger("ovtrio")


class _Marked(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage().replace("\n", " ")
        sys.stderr.write(f"{CHILD_RECORD}{record.levelno} {message}\n")
        sys.stderr.flush()


def send_records_to_parent() -> None:
    """In the child: the "ovtrio" logger's records of INFO and above go to the parent."""
    log.addHandler(_Marked())
    log.setLevel(logging.INFO)
    log.propagate = False


def relay_records(stderr: str) -> list[str]:
    """In the parent: log the child's records found in `stderr`; the other non-blank lines."""
    others: list[str] = []
    for line in stderr.splitlines():
        if line.startswith(CHILD_RECORD):
            level, _, message = line.removeprefix(CHILD_RECORD).partition(" ")
            log.log(int(level) if level.isdigit() else logging.INFO, "%s", message)
        elif line.strip():
            others.append(line)
    return others
