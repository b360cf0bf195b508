"""Reading one image (ovtrio/images/load.py), without a server: what it makes of the
formats and modes it takes, its size limits, and the refusals, each naming the field."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from ovtrio.images import ImageError, ImageLimits, load, load_image

PARAM = "messages[0].content[1].image_url"


def data_url(image: Image.Image, fmt: str = "PNG") -> str:
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buffer.getvalue()).decode()


async def test_a_large_image_is_resized_down_keeping_its_aspect():
    image = Image.fromarray(np.zeros((300, 900, 3), dtype=np.uint8))
    loaded = await load_image(data_url(image), PARAM, ImageLimits(max_side=120))
    assert loaded.pixels.shape == (40, 120, 3)
    assert loaded.pixels.dtype == np.uint8


async def test_a_small_image_keeps_its_size():
    image = Image.fromarray(np.full((30, 50, 3), 7, dtype=np.uint8))
    loaded = await load_image(data_url(image), PARAM, ImageLimits())
    assert loaded.pixels.shape == (30, 50, 3)
    assert (loaded.pixels == 7).all()


async def test_transparency_is_laid_over_white():
    rgba = np.zeros((4, 4, 4), dtype=np.uint8)  # fully transparent black
    loaded = await load_image(data_url(Image.fromarray(rgba, "RGBA")), PARAM, ImageLimits())
    assert (loaded.pixels == 255).all()


async def test_a_gif_gives_its_first_frame():
    frames = [Image.fromarray(np.full((8, 8, 3), value, dtype=np.uint8)) for value in (10, 200)]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:])
    url = "data:image/gif;base64," + base64.b64encode(buffer.getvalue()).decode()
    loaded = await load_image(url, PARAM, ImageLimits())
    assert abs(int(loaded.pixels.mean()) - 10) <= 2


async def test_an_image_declaring_a_huge_canvas_is_refused_before_it_is_decoded():
    buffer = io.BytesIO()
    Image.new("L", (20000, 20000)).save(buffer, "PNG")  # about 400 megapixels, a few hundred kB compressed
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    with pytest.raises(ImageError) as caught:
        await load_image(url, PARAM, ImageLimits())
    assert caught.value.param == PARAM and caught.value.code == "image_too_large"


async def test_base64_longer_than_the_limit_is_refused_before_decoding():
    url = "data:image/png;base64," + "A" * 4000
    with pytest.raises(ImageError) as caught:
        await load_image(url, PARAM, ImageLimits(max_bytes=1000))
    assert caught.value.code == "image_too_large"


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "javascript:alert(1)", "no-scheme-at-all", "HTTP://example.com/a.png"]
)
async def test_urls_other_than_data_urls_are_refused_by_default(url):
    with pytest.raises(ImageError) as caught:
        await load_image(url, PARAM, ImageLimits())
    assert caught.value.param == PARAM


async def test_an_image_is_brought_down_to_the_models_own_preprocessing_size():
    image = Image.fromarray(np.zeros((300, 600, 3), dtype=np.uint8))
    loaded = await load_image(data_url(image), PARAM, ImageLimits(model_short_side=100))
    assert loaded.pixels.shape == (100, 200, 3)
    loaded = await load_image(data_url(image), PARAM, ImageLimits(model_max_pixels=200 * 100))
    assert loaded.pixels.shape == (100, 200, 3)
    small = Image.fromarray(np.zeros((50, 80, 3), dtype=np.uint8))
    assert (await load_image(data_url(small), PARAM, ImageLimits(model_short_side=100))).pixels.shape == (50, 80, 3)


async def test_a_large_reduction_stays_within_a_few_levels_of_one_bicubic_pass():
    # Brought down in two steps (a box filter by a whole factor, then bicubic): compared
    # with one bicubic pass over the whole image, on a smooth image.
    x = np.linspace(0.0, 1.0, 1024)
    smooth = np.stack([np.outer(np.sin(6 * x), np.cos(4 * x)), np.outer(x, x), np.outer(np.cos(9 * x), x)], -1)
    image = Image.fromarray((smooth * 127 + 128).astype(np.uint8))
    loaded = await load_image(data_url(image), PARAM, ImageLimits(model_short_side=32))
    one_pass = np.asarray(image.resize((32, 32), Image.Resampling.BICUBIC)).astype(int)
    assert loaded.pixels.shape == (32, 32, 3)
    assert np.abs(loaded.pixels.astype(int) - one_pass).max() <= 3


async def test_the_data_scheme_is_read_in_any_case():
    image = Image.fromarray(np.full((8, 8, 3), 200, dtype=np.uint8))
    url = "DATA" + data_url(image)[len("data") :]
    assert (await load_image(url, PARAM, ImageLimits())).pixels.shape == (8, 8, 3)


async def test_pixels_are_bounded_by_the_setting_and_a_jpeg_counted_at_its_reduced_scale():
    small = Image.new("RGB", (300, 200), (1, 2, 3))
    with pytest.raises(ImageError) as caught:
        await load_image(data_url(small), PARAM, ImageLimits(max_pixels=300 * 200 - 1))
    assert caught.value.code == "image_too_large" and "300x200" in str(caught.value)
    assert (await load_image(data_url(small), PARAM, ImageLimits(max_pixels=300 * 200))).pixels.shape == (200, 300, 3)
    # A JPEG over the pixels is decoded at a reduced scale (an eighth at most): counted so.
    photo = Image.new("RGB", (4000, 3000), (9, 9, 9))
    loaded = await load_image(data_url(photo, "JPEG"), PARAM, ImageLimits(max_side=500, max_pixels=1_000_000))
    assert loaded.pixels.shape == (375, 500, 3)
    with pytest.raises(ImageError):
        await load_image(data_url(photo, "PNG"), PARAM, ImageLimits(max_side=500, max_pixels=1_000_000))


def test_images_decoded_at_once_are_bounded_by_the_setting_and_the_cores():
    assert load._decoding(ImageLimits(decodes=1)).total_tokens == 1
    assert load._decoding(ImageLimits(decodes=64)).total_tokens == max(1, load._CORES - 1)


@pytest.fixture
def redirecting_host():
    """A loopback HTTP server: /one.png an image, /away a redirect to 127.0.0.2's /one.png."""
    import http.server
    import threading

    png = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(png, "PNG")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/away":
                self.send_response(302)
                self.send_header("Location", f"http://127.0.0.2:{self.server.server_address[1]}/one.png")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(png.getvalue())))
            self.end_headers()
            self.wfile.write(png.getvalue())

        def log_message(self, *args) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1]
    httpd.shutdown()


async def test_a_redirect_to_an_address_not_allowed_is_refused(monkeypatch, redirecting_host):
    from ovtrio.images import fetch

    # 127.0.0.1 stands for a public address here, 127.0.0.2 for a private one.
    monkeypatch.setattr(fetch, "is_public", lambda address: address == "127.0.0.1")
    limits = ImageLimits(fetch_urls=True, fetch_timeout=5)
    loaded = await load_image(f"http://127.0.0.1:{redirecting_host}/one.png", PARAM, limits)
    assert loaded.pixels.shape == (8, 8, 3)
    with pytest.raises(ImageError) as caught:
        await load_image(f"http://127.0.0.1:{redirecting_host}/away", PARAM, limits)
    assert caught.value.code == "image_url_unreachable"
    direct = ImageError("", PARAM)
    try:
        await load_image(f"http://127.0.0.2:{redirecting_host}/one.png", PARAM, limits)
    except ImageError as exc:
        direct = exc
    assert str(direct) == str(caught.value)  # the same words whatever stopped it
    allowed = ImageLimits(fetch_urls=True, fetch_timeout=5, fetch_private=True)
    assert (await load_image(f"http://127.0.0.1:{redirecting_host}/away", PARAM, allowed)).pixels.shape == (8, 8, 3)


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("2606:4700:4700::1111", True),
        ("64:ff9b::808:808", True),  # NAT64 of a public IPv4 address
        ("2002:808:808::1", True),  # 6to4 of a public IPv4 address
        ("10.0.0.1", False),
        ("::1", False),
        ("fe80::1%eth0", False),
        ("::ffff:127.0.0.1", False),  # IPv4-mapped
        ("::127.0.0.1", False),  # IPv4-compatible
        ("::ffff:0:7f00:1", False),  # IPv4-translated
        ("64:ff9b::a00:1", False),  # NAT64 of 10.0.0.1
        ("64:ff9b:1::a00:1", False),  # local-use NAT64
        ("2002:7f00:1::1", False),  # 6to4 of 127.0.0.1
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", False),  # Teredo, its client in a reserved range
    ],
)
def test_an_ipv6_address_that_stands_for_an_ipv4_one_is_as_public_as_that_address(address, public):
    from ovtrio.images.fetch import is_public

    assert is_public(address) is public


@pytest.mark.parametrize("url", ["http://[::1", "http://exa mple.com:99999999/x.png"])
async def test_a_url_that_does_not_parse_is_refused_as_any_other_fetch(url):
    limits = ImageLimits(fetch_urls=True, fetch_timeout=5)
    with pytest.raises(ImageError) as caught:
        await load_image(url, PARAM, limits)
    assert caught.value.code in ("image_url_unreachable", "invalid_image_url")
