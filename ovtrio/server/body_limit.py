"""The request body limit (Quart's MAX_CONTENT_LENGTH), kept to the models served.

--max-body-bytes bounds a text request. A vision-language model needs room beside it for
the images a request may carry, a Whisper model for an audio file and its form, so the
limit is that much larger while such a model is served. It is set at start from the
flags, the config file and what models_dir holds, and set again each time the registry
reads models_dir (ModelRegistry.rescan: on a model listing, and for a model name it does
not know): a vision or Whisper model copied into the folder raises it. It falls back
once no served model needs it (the model's file gone and the model unloaded, when the
registry forgets it), never below its value at start: a larger limit lets any client
make the server hold a larger body, so it is kept only while a model can use one.

Quart checks a body's Content-Length against the limit when it makes the request, before
any of the body is read (a larger one is refused with 413). So that the first request to
a model just copied in is not refused for want of a listing, a request declaring a body
over the limit, but within the largest the limit could become, has the folder read
first: at most once per RESCAN_INTERVAL seconds, so a client sending such bodies over
and over makes the server list the folder no more often than that, and one declaring
more than any limit could be never does. A body sent without a Content-Length (chunked)
is checked as it arrives, against the limit when it began, and reads nothing again.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from quart_trio import QuartTrio

from ovtrio.api.audio_form import AUDIO_FORM_BYTES
from ovtrio.model.vision import is_vision_folder
from ovtrio.serving.discovery import FolderModel
from ovtrio.settings.server import Settings

log = logging.getLogger("ovtrio")

# Seconds between two readings of models_dir for bodies over the limit. A listing is a
# directory read and a stat or two per entry: cheap, not free.
RESCAN_INTERVAL = 1.0


def body_bytes(settings: Settings, vision: bool = False, audio: bool = False) -> int:
    """The largest request body: --max-body-bytes, plus room for the most images a
    request may carry (as base64, 4 characters for 3 bytes) when a vision-language model
    is served; at least an audio file and its form's fields when a transcription model is."""
    limit = settings.max_body_bytes
    if vision:
        limit += settings.max_images_per_request * (settings.max_image_bytes * 4 // 3 + 4)
    if audio:
        limit = max(limit, settings.audio_max_bytes + AUDIO_FORM_BYTES)
    return limit


def takes_images_at_start(each_model: Sequence[Settings], in_folder: Sequence[FolderModel]) -> bool:
    """Whether a model configured (`each_model`), or one of models_dir at start, is a
    vision-language model."""
    configured = any(model.model and is_vision_folder(Path(model.model).expanduser()) for model in each_model)
    return configured or any(model.kind == "generation" and is_vision_folder(model.path) for model in in_folder)


class BodyLimit:
    def __init__(
        self,
        settings: Settings,
        config: dict[str, Any],
        vision: bool,
        audio: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """The limit of the app whose `config` it keeps, serving at start a vision-language
        model (`vision`) or a Whisper model (`audio`). `rescan`, once set, reads models_dir
        again (and calls `follow`)."""
        self._settings = settings
        self._config = config
        self._clock = clock
        self.at_start = body_bytes(settings, vision, audio)
        self._audio_at_start = audio
        # Whether the limit makes room for audio now: the 413's message says so.
        self.audio = audio
        # The largest the limit can become: a body over it is refused without a listing.
        self.largest = body_bytes(settings, vision=True, audio=True)
        self.rescan: Callable[[], Awaitable[None]] | None = None
        self._next_rescan = -math.inf
        config["MAX_CONTENT_LENGTH"] = self.at_start

    def keep_in(self, config: dict[str, Any]) -> None:
        """Keep the limit in `config` from now on (the app's, once it is built)."""
        config["MAX_CONTENT_LENGTH"] = self.bytes
        self._config = config

    @property
    def bytes(self) -> int:
        value = self._config["MAX_CONTENT_LENGTH"]
        assert isinstance(value, int)
        return value

    def follow(self, vision: bool, audio: bool) -> None:
        """Set the limit for the models served now: whether one is a vision-language model
        (`vision`), one a Whisper model (`audio`)."""
        limit = max(self.at_start, body_bytes(self._settings, vision, audio))
        self.audio = audio or self._audio_at_start
        if limit != self.bytes:
            served = [kind for kind, serves in (("a vision-language", vision), ("a Whisper", audio)) if serves]
            log.info(
                "request bodies up to %d bytes accepted now (%s)",
                limit,
                " and ".join(served) + " model served" if served else "back to the limit at start",
            )
        self._config["MAX_CONTENT_LENGTH"] = limit

    async def before_request(self, content_length: int | None) -> None:
        """Read models_dir again, when allowed, if a request declares a body over the limit
        that a model newly found could make fit."""
        if self.rescan is None or content_length is None or not self.bytes < content_length <= self.largest:
            return
        now = self._clock()
        if now < self._next_rescan:
            return
        self._next_rescan = now + RESCAN_INTERVAL
        log.debug("a body of %d bytes is over the %d-byte limit: models folder read again", content_length, self.bytes)
        await self.rescan()


def declared_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    """The Content-Length of an ASGI request's `headers`; None when absent or not a number
    (the HTTP server refuses such a request itself)."""
    for name, value in headers:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def install(app: QuartTrio, limit: BodyLimit) -> None:
    """Let `limit` see each request's Content-Length before Quart makes the request, which
    reads the limit then (ASGI middleware, as Quart's asgi_app is meant to be wrapped)."""
    serve = app.asgi_app

    async def asgi_app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await limit.before_request(declared_length(scope["headers"]))
        await serve(scope, receive, send)

    app.asgi_app = asgi_app  # type: ignore[method-assign]
