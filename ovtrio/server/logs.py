"""The server's log: one handler on the "ovtrio" logger, set up once per process."""

from __future__ import annotations

import logging
import sys


def configure_logging(level: str) -> None:
    logger = logging.getLogger("ovtrio")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s ovtrio %(levelname)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(level.upper())
