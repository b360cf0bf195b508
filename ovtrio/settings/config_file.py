"""The config file (`--config`, OVTRIO_CONFIG): several models in one server.

A JSON or TOML file lists the models, each entry with its source and any of the
per-model settings (the fields of ovtrio.settings.model.ModelSettings)::

    {"models": [{"served_model_name": "chat", "model": "chat.gguf", "max_tokens_limit": 512},
                {"served_model_name": "small", "model": "ir/small", "num_kv_blocks": 64}]}

or, in TOML, one `[[models]]` table per model. An entry's values override the
command line and environment, whose values are every model's defaults; relative paths
in an entry are relative to the file's folder. With several models, each entry names
the model it serves (`served_model_name`), and no two the same. Anything wrong stops
startup with one line naming the file, the entry and the key (a SettingsError).

The file is read here, not by pydantic-settings' JSON and TOML sources: those read a file
as one set of top-level settings, where this one lists models, and take a missing file
for an empty one, where a missing file here stops startup naming it.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ovtrio.settings.model import ModelSettings
from ovtrio.settings.server import ENV_PREFIX, Settings, SettingsError

# Entry keys that name a file: relative to the config file's folder, not the server's.
PATH_SETTINGS = ("model", "draft_model", "chat_template")


class ConfigFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # One model's entry: any of its settings, none required (what an entry leaves out
    # comes from the command line and environment).
    models: list[ModelSettings] = Field(min_length=1)


def model_settings(settings: Settings) -> list[Settings]:
    """The settings of each model to serve: `settings` alone without a config file, else
    one per entry of the file, `settings` overridden by the entry. Raises SettingsError."""
    if settings.config is None:
        return [settings]
    path = Path(settings.config).expanduser()
    raw = _read(path)
    try:
        parsed = ConfigFile.model_validate(raw)
    except ValidationError as exc:
        raise SettingsError(f"invalid config file {path}: {_describe(exc, raw)}") from None
    defaults = settings.model_dump()
    models = []
    for index, entry in enumerate(parsed.models):
        values = entry.model_dump(exclude_unset=True)
        for setting in PATH_SETTINGS:
            if values.get(setting) is not None:
                values[setting] = str(path.parent / Path(values[setting]).expanduser())
        models.append(Settings.model_validate({**defaults, **values}))
        if len(parsed.models) > 1 and "served_model_name" not in values:
            raise SettingsError(
                f"invalid config file {path}: models[{index}]: served_model_name is required when the file"
                " lists several models"
            )
    names = [model.served_model_name for model in models]
    for index, name in enumerate(names):
        if name in names[:index]:
            raise SettingsError(
                f"invalid config file {path}: models[{index}] ('{name}'): served_model_name '{name}' is also"
                f" models[{names.index(name)}]'s; each model needs a name of its own"
            )
    return models


def _read(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise SettingsError(f"cannot read config file {path}: {reason}") from None
    try:
        if path.suffix.lower() == ".toml":
            return tomllib.loads(text)
        return json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        kind = "TOML" if path.suffix.lower() == ".toml" else "JSON"
        raise SettingsError(f"invalid config file {path}: not valid {kind} ({exc})") from None


def _describe(exc: ValidationError, raw: Any) -> str:
    """The first problem, as `models[1] ('name'): key: what is wrong`."""
    error = exc.errors(include_url=False)[0]
    loc = list(error["loc"])
    where = ""
    if len(loc) >= 2 and loc[0] == "models" and isinstance(loc[1], int):
        where = f"models[{loc[1]}]"
        entry = raw["models"][loc[1]] if isinstance(raw, dict) else None
        if isinstance(entry, dict) and isinstance(entry.get("served_model_name"), str):
            where += f" ('{entry['served_model_name']}')"
        loc = loc[2:]
    key = ".".join(str(part) for part in loc)
    if error["type"] == "extra_forbidden" and len(loc) == 1:
        if where and key in Settings.model_fields:
            problem = (
                f"{key} is a server-wide setting, not one model's: set it with --{key.replace('_', '-')}"
                f" or {ENV_PREFIX}{key.upper()}"
            )
        else:
            problem = f"unknown key '{key}'"
    else:
        problem = f"{key}: {error['msg']}" if key else error["msg"]
    return f"{where}: {problem}" if where else problem
