"""write_ir_folder in a process of its own.

Building holds the GIL in many numpy and tokenizer calls (seconds for a real model), which
in the server's process would stall its event loop and the streams of the models it
serves; the memory it takes (the rebuilt vocabulary's merges, a layer's codes at a time)
is returned whole when the child ends."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ovtrio.gguf.child_log import relay_records, send_records_to_parent

_CHILD = "from ovtrio.gguf.builder.child import main; main()"


class BuildError(ValueError):
    """The file cannot be built; the message says why, in one line."""


def build_in_child(source: Path, folder: Path) -> list[str]:
    """Build the model of the GGUF file `source` into `folder`; the lines to log. Raises
    BuildError, or OSError when `folder` cannot be written."""
    result = subprocess.run([sys.executable, "-c", _CHILD, str(source), str(folder)], capture_output=True, text=True)
    lines = relay_records(result.stderr)
    if result.returncode != 0:
        reason = lines[-1] if lines else f"exit status {result.returncode}"
        if reason.startswith("OSError: "):
            raise OSError(reason.removeprefix("OSError: "))
        raise BuildError(reason.removeprefix("BuildError: "))
    return list(json.loads(result.stdout.strip().splitlines()[-1]))


def main() -> None:
    """The child of build_in_child (arguments: source, folder): build, and print the log
    lines as JSON on the last line."""
    from ovtrio.gguf.builder.folder import write_ir_folder

    send_records_to_parent()
    source, folder = sys.argv[1:3]
    try:
        lines = write_ir_folder(Path(source), Path(folder))
    except OSError as exc:
        sys.exit(f"OSError: {exc}")
    except (ValueError, KeyError, IndexError) as exc:
        sys.exit(f"BuildError: {exc}")
    except Exception as exc:  # noqa: BLE001 - whatever a file makes the graph's ops raise fails that file alone
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        sys.exit(f"BuildError: {type(exc).__name__}: {first}")
    print(json.dumps(lines))
