"""GET / and GET /playground/<file>: the playground's page and its files.

The files are read once, when the app is built (the page's own weigh about 150 KB, the
libraries it loads only when needed, under static/vendor/, about 2.4 MB), and
served from memory with an ETag. Every answer carries a Content-Security-Policy that
lets the page load and connect to its own origin only (images also from data: URLs,
the ones a user attaches; fonts: KaTeX's; audio from blob: URLs, a reply read aloud
that the page fetched from its own origin), and run no inline script: the
page inserts model and user text as text, and the policy is the second line of defence
should a bug ever let markup through. The microphone (recorded for transcription) needs
no source in the policy: the recording is posted to the page's own origin, never played;
no Permissions-Policy is sent, so the browser's default lets the page's own origin ask.
"""

from __future__ import annotations

import hashlib
import mimetypes
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

from quart import Blueprint, Response, request
from werkzeug.exceptions import NotFound

STATIC_PREFIX = "/playground/"

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",  # the images a user attaches, shown as data: URLs
        "font-src 'self'",  # KaTeX's fonts, shipped in static/vendor/katex/
        "media-src blob:",  # a reply read aloud: /v1/audio/speech's answer, played from memory
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)

SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Revalidated on every load (a 304 when unchanged), so an upgraded server never
    # runs with last version's scripts.
    "Cache-Control": "no-cache",
}

TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".woff2": "font/woff2",
}


@dataclass(frozen=True)
class StaticFile:
    body: bytes
    content_type: str
    etag: str


def load_files() -> dict[str, StaticFile]:
    """Every file under static/, by its URL path ("/" for index.html)."""
    files: dict[str, StaticFile] = {}
    root = resources.files(__package__) / "static"

    def walk(folder, prefix: str) -> None:
        for entry in folder.iterdir():
            if entry.is_dir():
                walk(entry, f"{prefix}{entry.name}/")
                continue
            body = entry.read_bytes()
            suffix = "." + entry.name.rpartition(".")[2]
            content_type = TYPES.get(suffix) or mimetypes.guess_type(entry.name)[0] or "application/octet-stream"
            if content_type == "text/html":
                content_type += "; charset=utf-8"
            etag = hashlib.sha256(body).hexdigest()[:20]
            files[STATIC_PREFIX + prefix + entry.name] = StaticFile(body, content_type, etag)

    walk(root, "")
    files["/"] = files.pop(STATIC_PREFIX + "index.html")
    return files


def create_blueprint(probe: Callable[[], Response] | None = None) -> tuple[Blueprint, frozenset[str]]:
    """The playground's routes, and the paths they serve (open without an API key).
    `probe`: what `/` answers a client that does not ask for a page (its Accept header
    does not name text/html, as every browser's does): Ollama's clients and apps probe
    `/` for "Ollama is running"."""
    blueprint = Blueprint("playground", __name__)
    files = load_files()

    async def serve(path: str) -> Response:
        found = files.get(path)
        if found is None:
            raise NotFound()  # the app's 404, in OpenAI's error shape
        headers = {**SECURITY_HEADERS, "ETag": f'"{found.etag}"'}
        if request.headers.get("If-None-Match") == f'"{found.etag}"':
            return Response(b"", status=304, headers=headers)
        return Response(found.body, content_type=found.content_type, headers=headers)

    @blueprint.get("/")
    async def page() -> Response:
        if probe is not None and "text/html" not in request.headers.get("Accept", ""):
            return probe()
        return await serve("/")

    @blueprint.get(STATIC_PREFIX + "<path:name>")
    async def static_file(name: str) -> Response:
        return await serve(STATIC_PREFIX + name)

    return blueprint, frozenset(files)
