"""One image of a request, from its URL to an RGB array the engine takes.

- `data:` URLs (base64): png, jpeg, webp and gif (its first frame), as OpenAI takes them.
- `http(s):` URLs only when the server allows fetching (`--image-urls`): fetched with a
  timeout, a size cap read as the bytes arrive, no redirect to another scheme, and only
  from public addresses unless allowed (fetch.py). Off by default: a server that fetches
  any URL it is sent can be made to reach addresses only it can (cloud metadata,
  internal services).
- Any other scheme (`file:` among them) is refused.

Decoding runs in a worker thread (Pillow releases the GIL while it decodes), so a large
image never holds the event loop. Images whose longer side exceeds the limit are
resized down (aspect kept), not refused; palette, greyscale, CMYK and images with an
alpha channel are converted to RGB (alpha over white, as a viewer shows it).

What decoding costs in memory is set by the pixels, not the bytes (a few kilobytes of
lossless WebP can decode to gigabytes: docs/models.md#vision-language-models). So the
size an image declares in its header is read first (Pillow reads it without decoding), and an image
that would decode to more than `max_pixels` (a JPEG counted at the reduced scale it is
decoded at) is refused before any of it is decoded; and at most `decodes` images are
decoded at once, so the memory decoding takes is bounded by the two settings.

Every failure is an ImageError naming the request field at fault, for a 400.
"""

from __future__ import annotations

import binascii
import io
import os
import re
import time
from dataclasses import dataclass
from typing import Any

import pybase64
import trio

from ovtrio.errors import FieldError
from ovtrio.images.fetch import FetchRefused, TooLarge, fetch

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
_DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[\w.+-]+)*)(?P<base64>;base64)?,", re.I)


# Images decoded at once, in worker threads: at most `ImageLimits.decodes` (memory, see
# above) and at most one fewer than the CPU's cores (at least one), so that decoding
# leaves a core to the event loop and the engine: on two cores, /health's p99 during a
# burst of requests with images is lower with one decoding thread than with two
# (measured in docs/benchmarks.md#images). One limiter for the process: every model's
# images share it.
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
_DECODING = trio.CapacityLimiter(1)


def _decoding(limits: ImageLimits) -> trio.CapacityLimiter:
    wanted = max(1, min(limits.decodes, _CORES - 1))
    if _DECODING.total_tokens != wanted:
        _DECODING.total_tokens = wanted
    return _DECODING


class ImageError(FieldError):
    """An image the server cannot take; `param` names the field."""

    def __init__(self, message: str, param: str, code: str = "invalid_image") -> None:
        super().__init__(message, param, code)


@dataclass(frozen=True)
class ImageLimits:
    max_images: int = 4  # per request
    max_bytes: int = 10 * 1024 * 1024  # per image, encoded
    max_side: int = 2048  # longer side in pixels; larger images are resized down
    max_pixels: int = 16 * 1024 * 1024  # most pixels an image may decode to; more are refused before decoding
    decodes: int = 2  # images decoded at once (at most one fewer than the cores)
    fetch_urls: bool = False  # http(s) URLs
    fetch_timeout: float = 10.0  # seconds, per image
    fetch_private: bool = False  # fetch from loopback, private and link-local addresses too
    # The model's own preprocessing sizes (vision.py), when its preprocessor names them:
    # images are brought down to them here, off the event loop, so the engine's resize
    # (inside add_request, which holds the GIL) has next to nothing left to do.
    model_short_side: int | None = None
    model_max_pixels: int | None = None


@dataclass(frozen=True)
class LoadedImage:
    pixels: Any  # numpy uint8 array, height x width x 3
    seconds: float  # reading and decoding


async def load_image(url: str, param: str, limits: ImageLimits) -> LoadedImage:
    """The image at `url` as RGB pixels; raises ImageError naming `param`."""
    started = time.perf_counter()
    scheme = _scheme(url)
    if scheme == "data":
        pixels = await trio.to_thread.run_sync(_decode_data_url, url, param, limits, limiter=_decoding(limits))
        return LoadedImage(pixels, time.perf_counter() - started)
    if scheme in ("http", "https"):
        if not limits.fetch_urls:
            raise ImageError(
                f"Invalid value for '{param}': this server takes images as data: URLs (base64) only; it does not"
                " fetch http(s) URLs unless started with --image-urls.",
                param,
                "image_url_not_allowed",
            )
        data = await _fetch(url, param, limits)
    else:
        raise ImageError(
            f"Invalid value for '{param}': images are taken as data: URLs (base64)"
            f"{' or http(s) URLs' if limits.fetch_urls else ''}, not {scheme or 'this'} URLs.",
            param,
            "invalid_image_url",
        )
    pixels = await trio.to_thread.run_sync(_decode, data, param, limits, limiter=_decoding(limits))
    return LoadedImage(pixels, time.perf_counter() - started)


def _scheme(url: str) -> str:
    """The URL's scheme, lower-cased ("" if none), found among its first characters: a
    data URL is megabytes long, and splitting it would copy it on the event loop
    (docs/benchmarks.md#image-decoding)."""
    colon = url.find(":", 0, 64)
    return url[:colon].lower() if colon >= 0 else ""


def _decode_data_url(url: str, param: str, limits: ImageLimits) -> Any:
    return _decode(_data_url_bytes(url, param, limits), param, limits)


def _data_url_bytes(url: str, param: str, limits: ImageLimits) -> bytes:
    match = _DATA_URL.match(url)
    if match is None or not match.group("base64"):
        raise ImageError(
            f"Invalid value for '{param}': expected a base64 data URL such as data:image/png;base64,...",
            param,
            "invalid_image_url",
        )
    mime = (match.group("mime") or "").lower()
    if mime and not mime.startswith("image/"):
        raise ImageError(f"Invalid value for '{param}': {mime} is not an image type.", param, "invalid_image_format")
    encoded = url[match.end() :]
    # Base64 is 4 characters for 3 bytes: refuse by length before decoding anything.
    if len(encoded) * 3 // 4 > limits.max_bytes + 3:
        raise _too_large(param, limits)
    try:
        # pybase64 decodes with SIMD, without the GIL, 50 times faster than binascii
        # (docs/benchmarks.md#image-decoding).
        data = pybase64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError(
            f"Invalid value for '{param}': the data URL is not valid base64.", param, "invalid_image_url"
        ) from None
    if len(data) > limits.max_bytes:
        raise _too_large(param, limits)
    return data


def _too_large(param: str, limits: ImageLimits) -> ImageError:
    return ImageError(
        f"Invalid value for '{param}': the image is larger than this server's limit of {limits.max_bytes} bytes"
        " (--max-image-bytes).",
        param,
        "image_too_large",
    )


async def _fetch(url: str, param: str, limits: ImageLimits) -> bytes:
    try:
        return await fetch(url, limits.max_bytes, limits.fetch_timeout, limits.fetch_private)
    except TooLarge:
        raise _too_large(param, limits) from None
    except FetchRefused:
        raise ImageError(
            f"Invalid value for '{param}': the image URL could not be fetched (this server fetches images from"
            " public http(s) addresses that answer with one, within its time and size limits).",
            param,
            "image_url_unreachable",
        ) from None
    except FieldError as exc:
        raise ImageError(f"Invalid value for '{param}': {exc}", param, exc.code) from None


def _decode(data: bytes, param: str, limits: ImageLimits) -> Any:
    """Decoded, RGB, at most `limits.max_side` pixels on its longer side, and no larger
    than the model's preprocessing makes it (in a worker thread)."""
    max_side = limits.max_side
    import numpy as np
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data), formats=FORMATS) as image:
            image.seek(0)  # a GIF's first frame
            if max(image.size) > max_side:
                image.draft("RGB", (max_side, max_side))  # JPEG: decode at a reduced scale
            # Bound the decode itself, by the size the header declares (what `size` is
            # until load; after draft, the reduced one): a tiny file can declare a huge
            # canvas.
            if image.width * image.height > limits.max_pixels:
                raise ImageError(
                    f"Invalid value for '{param}': the image is {image.width}x{image.height} pixels, more than this"
                    f" server decodes ({limits.max_pixels} pixels, --max-image-pixels).",
                    param,
                    "image_too_large",
                )
            image.load()
            rgb = _to_rgb(ImageOps.exif_transpose(image) or image)
    except ImageError:
        raise
    except Image.DecompressionBombError:
        raise ImageError(
            f"Invalid value for '{param}': the image has more pixels than can be decoded safely.",
            param,
            "image_too_large",
        ) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        reason = "is not an image in a format this server reads (png, jpeg, webp, gif)"
        if not isinstance(exc, UnidentifiedImageError):
            reason = "could not be decoded (truncated or corrupt)"
        raise ImageError(f"Invalid value for '{param}': the image {reason}.", param, "invalid_image_format") from None
    size = _fitted(rgb.size, limits)
    if size != rgb.size:
        # In two steps when it shrinks much: first by a whole factor (box filter), then
        # bicubic from at most 3x the target; a fourth of one pass's time, within a few
        # levels of its result (docs/benchmarks.md#image-decoding).
        rgb = rgb.resize(size, Image.Resampling.BICUBIC, reducing_gap=3.0)
    return np.asarray(rgb, dtype=np.uint8)


def _fitted(size: tuple[int, int], limits: ImageLimits) -> tuple[int, int]:
    """The size to bring an image down to (never up): the server's longest side, then the
    model's shortest side and pixel count."""
    width, height = size
    scale = min(1.0, limits.max_side / max(width, height))
    if limits.model_short_side:
        scale = min(scale, limits.model_short_side / min(width, height))
    if limits.model_max_pixels:
        scale = min(scale, (limits.model_max_pixels / (width * height)) ** 0.5)
    if scale >= 1.0:
        return size
    return max(1, round(width * scale)), max(1, round(height * scale))


def _to_rgb(image: Any) -> Any:
    from PIL import Image

    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    return image.convert("RGB")
