"""Which web pages may use the server through their visitors' browsers: the Host and
Origin checks, and CORS.

A browser lets any page send requests to any address, loopback included, and opens
WebSockets anywhere (CORS does not apply to them); what it withholds from the page is
the answer, unless the server allows the page's origin. Without checks, a page from
anywhere could spend the visitor's compute and, over a WebSocket or by rebinding its
own name to 127.0.0.1 (DNS rebinding, which makes the page same-origin), read what the
model writes. So, before routing and before the API key:

- **Host.** The Host header must name this server: on a connection that arrived at a
  loopback address, one of the loopback names (localhost, 127.0.0.1, [::1], any port),
  which a rebinding page cannot send (its Host is its own name); on other addresses
  any host, since a server reached over the network is addressed by names the app
  cannot know. `allowed_hosts` replaces that default ('*' allows every host). Deciding
  from the connection's own address, not from the address the server was told to
  bind, gives the same answer under `ovtrio serve` and `hypercorn ovtrio.app:app`,
  and guards loopback connections to a server bound to 0.0.0.0 as well.
- **Origin.** A request with an Origin header (browsers send one with cross-origin
  requests, POSTs and WebSocket handshakes) must come from the server's own origin (the Origin's host:port equals
  the Host header; the scheme is not compared, so a TLS proxy in front does not
  matter) or from one of `allowed_origins` ('*' allows every page). Requests without
  Origin (curl, the SDKs, servers) pass. The WebSocket handshake is checked alike.
- **CORS.** A preflight (OPTIONS with Access-Control-Request-Method) from an allowed
  origin is answered here with the Access-Control-Allow-* headers; answers to allowed
  cross-origin requests carry Access-Control-Allow-Origin, errors included.

A refusal is a 403 in OpenAI's error shape (a refused handshake is that HTTP answer).
The probes answer any Host and Origin: they say nothing a page could use, and health
checkers address the server by whatever name they have.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from quart import Quart, Response, request, websocket

from ovtrio.api.auth import OPEN_PATHS
from ovtrio.api.errors import APIError, error_response

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})

ALLOWED_METHODS = "GET, POST, DELETE, OPTIONS"
# Headers a page may read from an allowed cross-origin answer, beyond the safelisted ones.
EXPOSED_HEADERS = "Retry-After, WWW-Authenticate"
# Seconds a browser may reuse a preflight's answer.
PREFLIGHT_MAX_AGE = "600"


def _split_host(host: str) -> tuple[str, str | None]:
    """'Example.com:8000' -> ('example.com', '8000'); '[::1]' -> ('[::1]', None)."""
    host = host.strip().lower()
    if host.startswith("["):
        name, _, rest = host.partition("]")
        name += "]"
        port = rest[1:] if rest.startswith(":") else None
    else:
        name, colon, port_text = host.rpartition(":")
        if not colon:
            name, port_text = host, ""
        port = port_text or None
    return name.rstrip("."), port


def _is_loopback_address(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.partition("%")[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def _normal_origin(origin: str) -> str:
    return origin.strip().lower().rstrip("/")


@dataclass(frozen=True)
class OriginPolicy:
    """The allowed hosts and origins, as set (empty: the defaults above)."""

    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, hosts: Iterable[str], origins: Iterable[str]) -> OriginPolicy:
        return cls(tuple(host.strip().lower() for host in hosts), tuple(_normal_origin(o) for o in origins))

    def host_allowed(self, host: str | None, local_address: str | None) -> bool:
        """Whether a request with Host header `host`, on a connection that arrived at
        `local_address` (None: not an IP socket), may be answered."""
        if host is None:
            return True  # no browser sends a request without Host (HTTP/1.0 clients may)
        if self.allowed_hosts:
            allowed: Iterable[str] = self.allowed_hosts
        elif local_address is not None and _is_loopback_address(local_address):
            allowed = LOOPBACK_NAMES
        else:
            return True
        if "*" in allowed:
            return True
        name, port = _split_host(host)
        for entry in allowed:
            entry_name, entry_port = _split_host(entry)
            if entry_name == name and (entry_port is None or entry_port == port):
                return True
        return False

    def same_origin(self, origin: str, host: str | None) -> bool:
        """Whether `origin` names the server itself, as its request's Host header does."""
        _scheme, separator, authority = _normal_origin(origin).partition("://")
        return bool(separator) and host is not None and authority == host.strip().lower()

    def cross_origin_allowed(self, origin: str) -> bool:
        """Whether pages of `origin`, another origin than the server's, may use it."""
        return "*" in self.allowed_origins or _normal_origin(origin) in self.allowed_origins

    def refusal(self, path: str, host: str | None, origin: str | None, local_address: str | None) -> APIError | None:
        """None if the request may go on, else the 403 to answer with."""
        if path in OPEN_PATHS:
            return None
        if not self.host_allowed(host, local_address):
            return APIError(
                403,
                f"The Host header {host!r} is not one this server answers; start it with --allowed-hosts"
                " (OVTRIO_ALLOWED_HOSTS) to allow it.",
                code="host_not_allowed",
            )
        if origin is not None and not self.same_origin(origin, host) and not self.cross_origin_allowed(origin):
            return APIError(
                403,
                f"Requests from the web origin {origin!r} are not allowed; start the server with --allowed-origins"
                " (OVTRIO_ALLOWED_ORIGINS) to allow that origin's pages.",
                code="origin_not_allowed",
            )
        return None

    def allow_origin_header(self, origin: str) -> str:
        """The Access-Control-Allow-Origin value for an allowed cross-origin request."""
        return "*" if "*" in self.allowed_origins else origin


def _local_address(scope: Mapping[str, Any]) -> str | None:
    server = scope.get("server")
    return server[0] if server else None


def install(app: Quart, policy: OriginPolicy) -> None:
    """Check every HTTP request and WebSocket handshake, and answer CORS; installed
    before the API-key check, so a preflight (which carries no key) gets its answer."""

    @app.before_request
    async def check_origin() -> Response | None:
        host, origin = request.headers.get("Host"), request.headers.get("Origin")
        error = policy.refusal(request.path, host, origin, _local_address(request.scope))
        if error is not None:
            return error_response(error)
        preflight = request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers
        granted = origin is not None and (policy.same_origin(origin, host) or policy.cross_origin_allowed(origin))
        if preflight and granted and origin is not None:
            return _preflight(policy, origin)
        return None  # the probes answer any origin, but grant none

    @app.after_request
    async def allow_origin(response: Response) -> Response:
        origin = request.headers.get("Origin")
        if (
            origin is not None
            and request.path not in OPEN_PATHS
            and not policy.same_origin(origin, request.headers.get("Host"))
            and policy.cross_origin_allowed(origin)
        ):
            _add_allow_origin(response, policy, origin)
            response.headers["Access-Control-Expose-Headers"] = EXPOSED_HEADERS
        return response

    @app.before_websocket
    async def check_socket_origin() -> Response | None:
        # A response before accept() becomes the HTTP answer to the handshake.
        host, origin = websocket.headers.get("Host"), websocket.headers.get("Origin")
        error = policy.refusal(websocket.path, host, origin, _local_address(websocket.scope))
        return None if error is None else error_response(error)


def _add_allow_origin(response: Response, policy: OriginPolicy, origin: str) -> None:
    value = policy.allow_origin_header(origin)
    response.headers["Access-Control-Allow-Origin"] = value
    if value != "*":
        response.vary.add("Origin")


def _preflight(policy: OriginPolicy, origin: str) -> Response:
    """The answer to an allowed origin's preflight: the methods, and the headers it asked
    for (the SDKs send their own, which a fixed list would miss; '*' would not cover
    Authorization)."""
    response = Response(status=204)
    _add_allow_origin(response, policy, origin)
    response.headers["Access-Control-Allow-Methods"] = ALLOWED_METHODS
    requested = request.headers.get("Access-Control-Request-Headers")
    if requested:
        response.headers["Access-Control-Allow-Headers"] = requested
    response.headers["Access-Control-Max-Age"] = PREFLIGHT_MAX_AGE
    # Chrome's Private Network Access: a public page reaching a loopback or private
    # address asks for this too; an allowed origin gets it.
    if request.headers.get("Access-Control-Request-Private-Network", "").lower() == "true":
        response.headers["Access-Control-Allow-Private-Network"] = "true"
    response.vary.update(("Access-Control-Request-Method", "Access-Control-Request-Headers"))
    return response
