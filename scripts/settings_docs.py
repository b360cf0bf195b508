"""Writes docs/configuration.md, the reference of every setting, from the settings model.

    python scripts/settings_docs.py            # writes docs/configuration.md
    python scripts/settings_docs.py --check    # exits 1 if the page differs from what it would write

Each setting's flag, environment variable, default and description come from its field
in ovtrio/settings/model.py (one model's settings, which a config file's entry may set)
or ovtrio/settings/server.py (the server's); the prose around the tables is here.
tests/test_settings_docs.py checks that the committed page is this script's output, so a
setting added, renamed or redescribed without running it fails the tests.
"""

from __future__ import annotations

import argparse
import sys
import typing
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pydantic.fields import FieldInfo  # noqa: E402

from ovtrio.settings.config_file import PATH_SETTINGS  # noqa: E402
from ovtrio.settings.model import ModelSettings  # noqa: E402
from ovtrio.settings.server import ENV_PREFIX, ServerSettings, is_list_setting  # noqa: E402

PAGE = ROOT / "docs" / "configuration.md"

INTRO = f"""\
<!-- Written by scripts/settings_docs.py from ovtrio/settings/: edit the settings'
descriptions there (or the prose in the script), then run it. -->

# Configuration

Every setting has one name, and three ways to be given:

- a flag of `ovtrio serve` (and `ovtrio convert`): the name with dashes, `--max-num-seqs 8`;
- an environment variable: the name in upper case after `{ENV_PREFIX}`, `{ENV_PREFIX}MAX_NUM_SEQS=8`
  (the only way under a bare `hypercorn -k trio ovtrio.app:app`);
- for one model's settings, a key of a model's entry in the config file (see
  [The config file](#the-config-file)): the name itself, `max_num_seqs = 8`.

A flag wins over the variable, which wins over the default; a config file's entry wins
over both for its model. `ovtrio serve --help` lists the same settings.

- An empty variable counts as unset.
- On/off settings are flags in pairs (`--playground` / `--no-playground`); their variables
  take `true` or `false` (or `1`/`0`, `yes`/`no`, `on`/`off`).
- Settings that take several values repeat their flag (`--api-key A --api-key B`); their
  variable holds one value (`{ENV_PREFIX}API_KEY`: one key). `allowed_hosts` and
  `allowed_origins` also take several values separated by commas, in the flag or the
  variable.
- `plugin_config` is a JSON object, as one flag value or variable
  (`--plugin-config '{{"DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}}'`), and the object itself in
  a config file.
- A value that cannot be used stops startup with one line naming the setting, its
  variable and its flag, and exit code 2, for instance `ovtrio: invalid setting
  max_num_seqs ({ENV_PREFIX}MAX_NUM_SEQS / --max-num-seqs): Input should be greater than or
  equal to 1`.
"""

CONFIG_FILE = f"""\
## The config file

`--config models.json` (or `{ENV_PREFIX}CONFIG`, also under a bare `hypercorn`) serves every
model the file lists, each routed by the `model` field of a request:

```json
{{"models": [
  {{"served_model_name": "chat", "model": "models/qwen2.5-1.5b-instruct-q4_k_m.gguf", "max_tokens_limit": 2048}},
  {{"served_model_name": "small", "model": "models/smollm2-ir", "num_kv_blocks": 256, "max_tokens_limit": 256}}
]}}
```

or in TOML (a file ending in `.toml`):

```toml
[[models]]
served_model_name = "chat"
model = "models/qwen2.5-1.5b-instruct-q4_k_m.gguf"
max_tokens_limit = 2048

[[models]]
served_model_name = "small"
model = "models/smollm2-ir"
num_kv_blocks = 256
```

- An entry may set any of the [model settings](#model-settings), by name. The
  [server settings](#server-settings) (listening, keys, the response store, the model
  cache, the drain, logging, ...) are the server's: set on the command line or in the
  environment, and refused in an entry.
- An entry's values override the flags and environment, whose values are every model's
  defaults. Relative paths in an entry ({", ".join(f"`{name}`" for name in PATH_SETTINGS)}) are
  relative to the file's folder. With several entries, each needs its own
  `served_model_name`.
- A bad file stops startup with one line naming the file, the entry and the key, such as
  `invalid config file models.json: models[1] ('small'): port is a server-wide setting,
  not one model's: set it with --port or {ENV_PREFIX}PORT`.
- Each model has its own engine, scheduler, KV cache (`cache_size` each: two models take
  twice the memory), admission limits and chat template. The models load one after the
  other, in the file's order (a GGUF file the first converts is in the model cache for
  the next), and each serves as soon as it is loaded: a request for one still loading
  gets 503 `model_loading`, one for a model the file does not list 404
  `model_not_found`. `/tokenize`, `/detokenize` and `/tokenizer_info` (`?model=`) use
  the first model when the request names none.
- A path that cannot be served stops startup at once, as for one model. A model that
  fails while loading (the engine refuses it) is logged in one line and stays failed:
  requests for it get 503 `model_unavailable`, `/v2/models/{{name}}/ready` says `failed`
  with the reason, and `/health/ready` stays 503, while the other models serve. If every
  model fails, the server exits with code 1.
- Readiness: `/health/ready` is 200 once every model is, with
  `{{"status": "ready", "models": [{{"id": "chat", "status": "ready"}}, ...]}}`;
  `/v2/models/{{name}}/ready` answers for one model, and `/v1/config` gives every model's
  state as OVMS does.
- Metrics: every series of a model carries its `model_name`; the token-count
  histograms' buckets go up to the longest context of the models.
- On shutdown the drain covers the requests of every model, then every engine is
  released.
"""

MODEL_SECTION = """\
## Model settings

One model's settings: with a config file, every model's defaults, which its entry may
override; without one, the settings of the one model served. GGUF files must use the
llama, qwen2 or qwen3 architecture and Q4_0, Q4_1, Q8_0, Q4_K, Q6_K (or F16/F32)
tensors; anything else is refused at startup with a one-line reason.
"""

SERVER_SECTION = """\
## Server settings

The server's own settings, set once for all its models: on the command line or in the
environment, never in a config file's entry.
"""


def flag(name: str, field: FieldInfo) -> str:
    dashed = "--" + name.replace("_", "-")
    if field.annotation is bool:
        return f"`{dashed}` / `--no-{dashed[2:]}`"
    if is_list_setting(name):
        return f"`{dashed}` (repeatable)"
    return f"`{dashed}`"


def default(name: str, field: FieldInfo) -> str:
    value: Any = field.get_default(call_default_factory=True)
    if value is None or value == []:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, dict):
        return f"`{value}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    if name.endswith("_bytes") and isinstance(value, int) and value >= 1024:
        for unit, size in (("MiB", 1024 * 1024), ("KiB", 1024)):
            if value % size == 0:
                return f"`{value}` ({value // size} {unit})"
    return f"`{value}`"


def choices(field: FieldInfo) -> list[str]:
    """The values a setting of a Literal type takes, in the order of its type."""
    annotation = field.annotation
    if typing.get_origin(annotation) is not Literal:
        annotation = next((arg for arg in typing.get_args(annotation) if typing.get_origin(arg) is Literal), None)
    return [str(value) for value in typing.get_args(annotation)] if annotation is not None else []


def description(field: FieldInfo) -> str:
    text = markdown_text(field.description or "")
    values = choices(field)
    if values:
        text += "; one of " + ", ".join(f"`{value}`" for value in values)
    return text


def markdown_text(text: str) -> str:
    """A description as a table cell's text: no raw HTML, emphasis or cell break."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*").replace("|", "\\|")


def table(fields: dict[str, FieldInfo]) -> str:
    rows = [
        "| setting | flag | environment variable | default | description |",
        "|---|---|---|---|---|",
    ]
    for name, field in fields.items():
        rows.append(
            f"| `{name}` | {flag(name, field)} | `{ENV_PREFIX}{name.upper()}` | {default(name, field)}"
            f" | {description(field)} |"
        )
    return "\n".join(rows) + "\n"


def render() -> str:
    """The page, as this script writes it."""
    return "\n".join(
        [
            INTRO,
            MODEL_SECTION,
            table(ModelSettings.model_fields),
            SERVER_SECTION,
            table(ServerSettings.model_fields),
            CONFIG_FILE,
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is not what this script writes")
    args = parser.parse_args()
    page = render()
    if args.check:
        if not PAGE.is_file() or PAGE.read_text(encoding="utf-8") != page:
            print(f"{PAGE.relative_to(ROOT)} is out of date: run python scripts/settings_docs.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
