"""What an engine exception says went wrong, in words a client may read.

OpenVINO and OpenVINO GenAI wrap their reasons in where they were raised: nested
"Exception from src/inference/src/cpp/core.cpp:223:" lines (one per layer), a
"Check 'cond' failed at /home/build/.../pipeline.cpp:616:" line before the reason, or a
"[time] /build/path/file.cc:12: " prefix. The first line alone is then a path or a
condition without its reason; the whole text shows the paths the library was built
from. `client_reason` keeps the reason and the failed check, and drops the paths.
"""

from __future__ import annotations

import re

# A source file of the engine as built, with its line number: "/home/x/src/a.cpp:616:".
_SOURCE = r"(?:[A-Za-z]:)?[\w./\\~+-]*\.(?:cpp|cc|cxx|c|hpp|hh|h|py)(?::\d+)+:?"
_NESTING = re.compile(rf"^Exception from\s+{_SOURCE}$")
_LOG_PREFIX = re.compile(rf"^(?:\[[^\]]*\]\s*)?{_SOURCE}\s*")
_AT_SOURCE = re.compile(rf"\s+at\s+{_SOURCE}")
_ANY_SOURCE = re.compile(rf"\s*{_SOURCE}")


def client_reason(exc: BaseException) -> str:
    """The line of `exc` that says what went wrong: the first after the innermost failed
    check (with the check in parentheses), or else the first; with no build path, and the
    exception's type name if it says nothing."""
    reasons = [line for line in map(_clean, str(exc).splitlines()) if line]
    if not reasons:
        return type(exc).__name__
    checks = [at for at, line in enumerate(reasons) if _is_check(line)]
    if not checks:
        return reasons[0]
    check = checks[-1]
    return f"{reasons[check + 1]} ({reasons[check]})" if check + 1 < len(reasons) else reasons[check]


def _clean(line: str) -> str:
    line = line.strip()
    if _NESTING.match(line):
        return ""
    line = _LOG_PREFIX.sub("", line)
    line = _AT_SOURCE.sub("", line)
    return _ANY_SOURCE.sub("", line).strip()


def _is_check(line: str) -> bool:
    return line.startswith("Check '") and line.endswith(" failed")
