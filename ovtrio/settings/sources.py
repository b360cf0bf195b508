"""Where settings come from, beside their defaults, and which code reads each source.

- The environment: OVTRIO_* variables, read by pydantic-settings' env source
  (`EnvironmentSource` below), lower in precedence than the command line.
- The command line: flags that ovtrio.server.cli builds with argparse from the fields.
  pydantic-settings' CLI source is not used because it would change what flags do:
  it splits `--api-key a,b` into two keys, takes `--plugin-config A=1` as an object
  where ours refuses what is not JSON (with a message of its own where ours names the
  flag and its variable), and its --help names no environment variable.
- The config file: read by ovtrio.settings.config_file. pydantic-settings' JSON and TOML
  sources are not used because they read a file as one set of top-level settings (ours
  lists models, each overriding the defaults, with paths relative to the file) and take a
  missing file for an empty one, where ours stops startup naming the file and the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import EnvSettingsSource

from ovtrio.settings.server import ENV_PREFIX, Settings, is_list_setting


class EnvironmentSource(EnvSettingsSource):
    """The OVTRIO_* variables of `environ` (upper case only, as the settings' names are
    spelled there), an empty one as if unset.

    A variable holds one value as it is written, not JSON: a list setting's variable
    holds one item (OVTRIO_API_KEY, one key; OVTRIO_ALLOWED_HOSTS, items separated by
    commas, which the setting's validator splits), and OVTRIO_PLUGIN_CONFIG's JSON text
    is parsed by the setting's validator, so a bad value gets the same message from a
    variable as from a flag."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(
            Settings,  # type: ignore[arg-type]  # a plain model: Settings() itself reads no variable
            case_sensitive=False,
            env_prefix=ENV_PREFIX,
        )

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # The source matches names in lower case (case_sensitive=False); only the upper-case
        # spelling is a setting's variable, and an empty one is left out (unset).
        return {name.lower(): value for name, value in self._environ.items() if name.isupper() and value != ""}

    def prepare_field_value(self, field_name: str, field: FieldInfo, value: Any, value_is_complex: bool) -> Any:
        if value is None:
            return None
        return [value] if is_list_setting(field_name) else value


def environment_values(environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings `environ` sets, by field name, not yet validated."""
    return EnvironmentSource(environ)()
