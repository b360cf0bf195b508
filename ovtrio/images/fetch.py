"""Fetching an image URL (with `--image-urls`), so that a client cannot use the server to
reach what only the server can reach.

- Every connection, the first and each redirect's, goes to an address checked after the
  name is resolved: loopback, private, link-local, shared and reserved addresses (every
  address that is not globally routable, `localhost` among them) are refused unless
  `image_fetch_private_addresses` allows them. The connection is made to the very
  address checked, so a name that resolves differently a moment later changes nothing.
  No proxy from the environment is used: a proxy would resolve the name itself.
- URLs with a user name or password are refused.
- Every failure to fetch (refused address, unreachable host, error status, timeout,
  redirect to another scheme) gets the same message: the reply never tells the client
  what answers at an address.
- The body is read as sent, bounded by the byte limit; a gzip or deflate body is
  decompressed in a worker thread (decompressing a large body on the event loop stalls
  it for that long), bounded by the same limit.
"""

from __future__ import annotations

import ipaddress
import zlib
from collections.abc import Iterable
from typing import Any

import trio

from ovtrio.errors import FieldError

_DECOMPRESSED_IN_CHUNKS = 64 * 1024


class FetchRefused(Exception):
    """The URL cannot be fetched; the caller says so in one uniform message."""


class TooLarge(Exception):
    """The body (or what it decompresses to) is over the byte limit."""


# IPv6 prefixes whose last 32 bits are an IPv4 address that the packet reaches: IPv4-
# compatible (::/96, deprecated), IPv4-translated (::ffff:0:0:0/96), and NAT64 (the
# well-known 64:ff9b::/96 and the local-use 64:ff9b:1::/48), which on an IPv6-only
# network reach whatever the IPv4 address is, private ones included.
_EMBEDDING_IPV4 = tuple(
    ipaddress.IPv6Network(prefix) for prefix in ("::/96", "::ffff:0:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48")
)


def _reached_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address stands for (mapped, compatible, translated,
    NAT64, 6to4, Teredo's client and server); none for a plain IPv6 address."""
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    if ip.teredo is not None:
        return list(ip.teredo)
    if any(ip in network for network in _EMBEDDING_IPV4) and ip not in (
        ipaddress.IPv6Address("::"),
        ipaddress.IPv6Address("::1"),
    ):
        return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    return []


def is_public(address: str) -> bool:
    """Whether an IP address is globally routable: an IPv6 address that stands for an
    IPv4 one (mapped, NAT64, 6to4, ...) only if that IPv4 address is too."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _reached_ipv4(ip)
        if embedded:
            return all(is_public(str(each)) for each in embedded)
    return ip.is_global and not ip.is_multicast


def _checked_backend(allow_private: bool) -> Any:
    import httpcore

    class CheckedBackend(httpcore.AsyncNetworkBackend):
        """trio's network backend, connecting only to checked addresses."""

        def __init__(self) -> None:
            self._trio = httpcore.TrioBackend()

        async def connect_tcp(
            self,
            host: str,
            port: int,
            timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
            local_address: str | None = None,
            socket_options: Iterable[Any] | None = None,
        ) -> Any:
            try:
                infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
            except OSError:
                raise httpcore.ConnectError("cannot resolve") from None
            addresses = [str(info[4][0]) for info in infos]
            if not addresses or (not allow_private and not all(is_public(address) for address in addresses)):
                raise httpcore.ConnectError("address refused")
            return await self._trio.connect_tcp(addresses[0], port, timeout, local_address, socket_options)

        async def connect_unix_socket(
            self,
            path: str,
            timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
            socket_options: Any = None,
        ) -> Any:
            raise httpcore.ConnectError("unix sockets are not fetched")

        async def sleep(self, seconds: float) -> None:
            await self._trio.sleep(seconds)

    return CheckedBackend()


_TLS: list[Any] = []  # the TLS context every fetch shares, made once


async def _tls_context() -> Any:
    """The TLS context, with the CA certificates loaded: once, in a worker thread (loading
    them takes tens of milliseconds, which each fetch spent on the event loop)."""
    if not _TLS:
        import httpx

        context = await trio.to_thread.run_sync(httpx.create_ssl_context)
        if not _TLS:
            _TLS.append(context)
    return _TLS[0]


async def fetch(url: str, max_bytes: int, seconds: float, allow_private: bool) -> bytes:
    """The body at `url`, decoded if gzip or deflate. Raises FetchRefused (for a uniform
    reply), TooLarge, or FieldError for a URL with credentials."""
    import httpx

    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        raise FetchRefused("url") from None
    if parsed.userinfo:
        raise FieldError("image URLs with a user name or password are not fetched.", None, "invalid_image_url")

    async def redirect_check(response: httpx.Response) -> None:
        target = response.next_request if response.is_redirect else None
        if target is not None and (target.url.scheme not in ("http", "https") or target.url.userinfo):
            raise FetchRefused("redirect")

    transport = httpx.AsyncHTTPTransport(verify=await _tls_context(), trust_env=False)
    # httpx has no public way to give its transport a network backend: its pool's is set.
    assert hasattr(transport._pool, "_network_backend")
    transport._pool._network_backend = _checked_backend(allow_private)
    try:
        with trio.fail_after(seconds):
            async with (
                httpx.AsyncClient(
                    transport=transport,
                    trust_env=False,
                    follow_redirects=True,
                    max_redirects=3,
                    timeout=seconds,
                    headers={"Accept-Encoding": "gzip, deflate"},
                    event_hooks={"response": [redirect_check]},
                ) as client,
                client.stream("GET", url) as response,
            ):
                if response.status_code != 200:
                    raise FetchRefused("status")
                declared = response.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > max_bytes:
                    raise TooLarge()
                encoding = response.headers.get("content-encoding", "identity").strip().lower()
                if encoding not in ("identity", "gzip", "x-gzip", "deflate"):
                    raise FetchRefused("encoding")
                chunks = bytearray()
                async for chunk in response.aiter_raw():  # as sent: decompressed below, off the loop
                    chunks += chunk
                    if len(chunks) > max_bytes:
                        raise TooLarge()
    except trio.TooSlowError:
        raise FetchRefused("timeout") from None
    except (httpx.HTTPError, httpx.InvalidURL):
        raise FetchRefused("http") from None
    if encoding == "identity":
        return bytes(chunks)
    return await trio.to_thread.run_sync(_decompressed, bytes(chunks), encoding, max_bytes)


def _decompressed(data: bytes, encoding: str, max_bytes: int) -> bytes:
    """`data` decompressed, stopping once more than `max_bytes` come out (TooLarge)."""
    # A zlib or gzip header is read from the data; raw deflate (no header) as some servers send it.
    wbits = -zlib.MAX_WBITS if encoding == "deflate" and data[:1] != b"\x78" else zlib.MAX_WBITS | 32
    inflater = zlib.decompressobj(wbits)
    out = bytearray()
    pending = data
    try:
        while pending:
            out += inflater.decompress(pending, _DECOMPRESSED_IN_CHUNKS)
            if len(out) > max_bytes:
                raise TooLarge()
            pending = inflater.unconsumed_tail
        out += inflater.flush()
    except zlib.error:
        raise FetchRefused("encoding") from None
    if len(out) > max_bytes:
        raise TooLarge()
    return bytes(out)
