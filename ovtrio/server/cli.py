"""`ovtrio serve [flags]`: the same app as `hypercorn -k trio ovtrio.app:app`, with flags."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import signal
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

from ovtrio import __version__
from ovtrio.embedding.kinds import served_models
from ovtrio.loading import ModelLoad, start_loading_in_order
from ovtrio.loading.convert_cache import convert_into_cache
from ovtrio.loading.thread import import_engine
from ovtrio.model import ModelLoadError, ModelSource, resolve_model
from ovtrio.server.early_signals import EarlySignals
from ovtrio.server.logs import configure_logging
from ovtrio.settings.model import ModelSettings
from ovtrio.settings.server import (
    ENV_PREFIX,
    ServerSettings,
    Settings,
    SettingsError,
    api_keys,
    is_list_setting,
    settings_from_env,
)

if TYPE_CHECKING:
    import trio

log = logging.getLogger("ovtrio")

SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """A flag for each setting, in two groups: one model's settings (which a config file's
    entry may set too), then the server's."""
    groups = (
        (ModelSettings, "model settings (also keys of a --config file's model entries)"),
        (ServerSettings, "server settings"),
    )
    for fields_of, title in groups:
        group = parser.add_argument_group(title)
        for name, field in fields_of.model_fields.items():
            flag = "--" + name.replace("_", "-")
            default = field.get_default(call_default_factory=True)
            shown = "none" if default is None or default == [] else default
            help_text = f"{field.description} [env {ENV_PREFIX}{name.upper()}; default {shown}]"
            if field.annotation is bool:
                group.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
            elif is_list_setting(name):
                group.add_argument(flag, dest=name, action="append", default=None, help=help_text)
            else:
                group.add_argument(flag, dest=name, default=None, help=help_text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ovtrio", description="OpenAI-compatible LLM server on OpenVINO GenAI")
    parser.add_argument("--version", action="version", version=f"ovtrio {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a model over the OpenAI API")
    _add_setting_flags(serve)
    convert = commands.add_parser(
        "convert",
        help="convert the GGUF model (each GGUF model of --config) into the model cache and exit, so that the"
        " next start loads the cached entry (an image's build does this)",
    )
    _add_setting_flags(convert)
    return parser


async def serve(
    settings: Settings, loading: Sequence[ModelLoad] | None = None, early: EarlySignals | None = None
) -> int:
    """Serve until a shutdown signal (or one that came before, in `early`) or until every
    model failed; the exit code."""
    import trio
    from hypercorn.config import Config
    from hypercorn.trio import serve as hypercorn_serve

    from ovtrio.api.context import registry_of
    from ovtrio.server.app import create_app

    app = create_app(settings, loading)
    models = registry_of(app)
    models.set_base_url(f"http://{settings.host}:{settings.port}")
    # The listen backlog, keep-alive and graceful timeouts that the hypercorn command
    # gets from the same module (it says why each).
    config = Config.from_object("ovtrio.server.hypercorn_config")
    config.bind = [f"{settings.host}:{settings.port}"]
    config.accesslog = None
    config.errorlog = "-"
    config.loglevel = "WARNING"
    failed = False

    # Installed before Hypercorn starts, so a signal that comes while the model loads waits
    # here for the trigger instead of killing the process (SIGTERM) or raising
    # KeyboardInterrupt (SIGINT) in whatever task runs.
    with trio.open_signal_receiver(*SHUTDOWN_SIGNALS) as signals:

        async def shutdown_trigger() -> None:
            """Returns, and so has Hypercorn stop listening and wind down, once every model
            failed to load or a signal came and the drain that follows it is over."""
            nonlocal failed
            received = early.received if early is not None and early.received else None
            received = received or await _signal_or_failure(signals, models.failed)
            if received is None:
                failed = True
                return
            async with trio.open_nursery() as draining:
                draining.start_soon(_hurry_on_next_signal, signals, models.shutdown.hurry)
                await models.drain(received)
                draining.cancel_scope.cancel()

        await hypercorn_serve(app, config, shutdown_trigger=shutdown_trigger)
    code = 1 if failed else 0
    log.info("exiting with code %d", code)
    return code


async def _signal_or_failure(signals: AsyncIterator[int], failed: trio.Event) -> str | None:
    """The name of the first shutdown signal, or None if `failed` is set first."""
    import trio

    received: str | None = None
    async with trio.open_nursery() as waiting:

        async def on_failure() -> None:
            await failed.wait()
            waiting.cancel_scope.cancel()

        waiting.start_soon(on_failure)
        async for number in signals:
            received = signal.Signals(number).name
            waiting.cancel_scope.cancel()
            break
    return received


async def _hurry_on_next_signal(signals: AsyncIterator[int], hurry: Callable[[], None]) -> None:
    """A second signal during the drain (a second Ctrl-C) ends it at once: what still runs
    is cut with an error, and the server exits."""
    async for _ in signals:
        log.warning("second signal: ending the drain now")
        hurry()
        return


def is_loopback(host: str) -> bool:
    """Whether `host` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def convert(sources: Sequence[ModelSource], each_model: Sequence[Settings]) -> int:
    """`ovtrio convert`: each model into the model cache, one line each; 1 if any failed."""
    code = 0
    for source, settings in zip(sources, each_model):
        try:
            print(f"{source.name}: {convert_into_cache(source, settings)}", flush=True)
        except ModelLoadError as exc:
            print(f"ovtrio: {exc}", file=sys.stderr)
            code = 1
    return code


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    overrides: dict[str, Any] = {k: v for k, v in vars(args).items() if k in Settings.model_fields}
    try:
        settings = settings_from_env(**overrides)
        each_model, _ = served_models(settings)
        sources = [resolve_model(model) for model in each_model]  # fail fast, before binding the port
        api_keys(settings)
    except (SettingsError, ModelLoadError) as exc:
        print(f"ovtrio: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    configure_logging(settings.log_level)
    if args.command == "convert":
        raise SystemExit(convert(sources, each_model))
    if not api_keys(settings) and not is_loopback(settings.host):
        log.warning(
            "listening on %s without an API key: anyone who can reach it can use the model"
            " (set --api-key, OVTRIO_API_KEY or --api-key-file)",
            settings.host,
        )
    import_engine()  # before the load thread starts (its docstring says why)
    # Before the load: a start that hangs can still be stopped (early_signals.py).
    early = EarlySignals(SHUTDOWN_SIGNALS)
    loading = start_loading_in_order(list(zip(sources, each_model)))  # while the web framework is imported
    # Trio too is imported only now: before the load begins, every import is the load's
    # delay (docs/benchmarks.md#loading-a-model). So is the web framework's, inside serve.
    import trio

    try:
        code = trio.run(serve, settings, loading, early)
    except KeyboardInterrupt:
        code = 0
    raise SystemExit(code)
