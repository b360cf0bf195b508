"""Servers with the browser-facing settings set, shared by the Host/Origin and the
Responses WebSocket limit tests, and the port of the pages that play another site.

PAGE_PORT is picked when the tests are collected, so that `origin_server` can name the
pages' origin in its flags before either starts.
"""

from __future__ import annotations

from conftest import free_port
from in_process import in_process_server
from server_pool import server_fixture

PAGE_PORT = free_port()
PAGE_ORIGIN = f"http://127.0.0.1:{PAGE_PORT}"

# Small WebSocket limits, so the tests see them act within seconds.
SOCKET_IDLE_SECONDS = 3
SOCKET_MAX_MESSAGE_BYTES = 65536

# `ovtrio serve`'s app allowing the pages' origin by name, in process over the fake
# engine (the origins and the socket's limits are the HTTP layer's).
origin_server = in_process_server(
    "origin_server",
    "--allowed-origins",
    PAGE_ORIGIN,
    "--websocket-idle-timeout",
    str(SOCKET_IDLE_SECONDS),
    "--websocket-max-message-bytes",
    str(SOCKET_MAX_MESSAGE_BYTES),
)

# `hypercorn -k trio ovtrio.app:app` allowing every origin, configured by environment.
open_hypercorn = server_fixture(
    "open_hypercorn",
    env={
        "OVTRIO_ALLOWED_ORIGINS": "*",
        "OVTRIO_WEBSOCKET_IDLE_TIMEOUT": str(SOCKET_IDLE_SECONDS),
        "OVTRIO_WEBSOCKET_MAX_MESSAGE_BYTES": str(SOCKET_MAX_MESSAGE_BYTES),
    },
    hypercorn=True,
)
