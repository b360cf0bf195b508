"""Ollama's response bodies checked against its Go types (tests/data/ollama_types.schema.json,
written from api/types.go): a body by the route that answered it, a stream record by
record, an error as Ollama's StatusError. `CheckingTransport` checks everything an
httpx client (the `ollama` package's) receives, as it arrives, and counts what it
checked, so a test can tell the checks ran."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema

SCHEMA = json.loads((Path(__file__).parent / "data" / "ollama_types.schema.json").read_text())

KINDS = {
    "/api/chat": "ChatResponse",
    "/api/generate": "GenerateResponse",
    "/api/embed": "EmbedResponse",
    "/api/embeddings": "EmbeddingResponse",
    "/api/tags": "ListResponse",
    "/api/ps": "ProcessResponse",
    "/api/show": "ShowResponse",
    "/api/version": "VersionResponse",
}

_VALIDATORS = {
    kind: jsonschema.Draft202012Validator({"$ref": f"#/$defs/{kind}", "$defs": SCHEMA["$defs"]})
    for kind in [*KINDS.values(), "StatusError"]
}


def check(kind: str, body: Any) -> Any:
    """`body` valid as Ollama's `kind`; returns it."""
    _VALIDATORS[kind].validate(body)
    return body


def check_record(path: str, record: Any) -> Any:
    """One body or stream record of `path`: its route's type, or an error."""
    if isinstance(record, dict) and set(record) == {"error"}:
        return check("StatusError", record)
    return check(KINDS[path], record)


def records(reply: httpx.Response) -> list[dict[str, Any]]:
    """A streamed reply's records (NDJSON), each checked."""
    assert reply.headers["content-type"].startswith("application/x-ndjson"), reply.headers
    lines = [line for line in reply.text.split("\n") if line]
    assert reply.text.endswith("\n")
    return [check_record(reply.request.url.path, json.loads(line)) for line in lines]


def body(reply: httpx.Response) -> dict[str, Any]:
    """A unary reply's body, checked (an error as StatusError)."""
    if reply.status_code >= 400:
        return check("StatusError", reply.json())
    assert reply.headers["content-type"].startswith("application/json"), reply.headers
    return check_record(reply.request.url.path, reply.json())


class _CheckedStream(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, path: str, status: int, checked: list[str]) -> None:
        self._inner, self._path, self._status, self._checked = inner, path, status, checked
        self._held = b""

    def _check(self, line: bytes) -> None:
        if line.strip():
            record = json.loads(line)
            check("StatusError", record) if self._status >= 400 else check_record(self._path, record)
            self._checked.append(self._path)

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            self._held += chunk
            *lines, self._held = self._held.split(b"\n")
            for line in lines:
                self._check(line)
            yield chunk
        self._check(self._held)
        self._held = b""

    def close(self) -> None:
        self._inner.close()


class CheckingTransport(httpx.HTTPTransport):
    """Checks every JSON body and NDJSON record under /api against Ollama's types;
    `checked` lists the path of each one checked."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.checked: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        path = request.url.path
        if not path.startswith("/api/") or (path not in KINDS and response.status_code < 400):
            return response
        assert isinstance(response.stream, httpx.SyncByteStream)
        stream = _CheckedStream(response.stream, path, response.status_code, self.checked)
        return httpx.Response(
            response.status_code, headers=response.headers, stream=stream, extensions=response.extensions
        )
