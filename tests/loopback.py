"""httpx's one-off request functions (`get`, `post`, `request`, `stream`, `delete`)
over one client for the whole session.

`httpx.get()` and its siblings build a new client per call, and with it a TLS context
that loads the CA bundle: about 20 ms of CPU each, which added up to over a minute of
the suite's CPU for servers that speak plain HTTP on loopback. This client keeps no idle
connection, so each request still opens and closes its own, as those functions do, and
no test's connection leaks into another's.
"""

from __future__ import annotations

import httpx

_CLIENT = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))

get = _CLIENT.get
post = _CLIENT.post
delete = _CLIENT.delete
request = _CLIENT.request
stream = _CLIENT.stream
