"""Images in chat completions and the Responses API, end to end: a real server serving
the tiny VLM fixture (tiny_vlm.py: random weights, so its text is nonsense and never
asserted), through the official SDK, and every way an image can be bad."""

from __future__ import annotations

import base64
import functools
import gzip
import http.server
import io
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import trio
from openai import BadRequestError, OpenAI
from PIL import Image

import loopback
import tiny_vlm
from conftest import sample_value
from helpers import beside_innocent_streams
from server_pool import server_fixture

MODEL = "vlm"


def build_vlm(folder: Path) -> None:
    tiny_vlm.build(folder / "vlm")


vlm_server = server_fixture(
    "vlm_server",
    "--model",
    "{folder}/vlm",
    "--served-model-name",
    MODEL,
    "--max-images-per-request",
    "3",
    "--max-image-bytes",
    "300000",
    prepare=build_vlm,
)
vlm_fetching_server = server_fixture(
    "vlm_fetching_server",
    "--model",
    "{folder}/vlm",
    "--served-model-name",
    MODEL,
    "--image-urls",
    "--image-fetch-private-addresses",  # the test's image host is on loopback
    "--image-fetch-timeout",
    "2",
    prepare=build_vlm,
)
# The same without leave to fetch from private addresses: the default of --image-urls.
vlm_fetching_public_server = server_fixture(
    "vlm_fetching_public_server",
    "--model",
    "{folder}/vlm",
    "--served-model-name",
    MODEL,
    "--image-urls",
    "--image-fetch-timeout",
    "2",
    prepare=build_vlm,
)


def pixels(seed: int, size: tuple[int, int] = (60, 40)) -> np.ndarray:
    width, height = size
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def encoded(image: Image.Image, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def image_url(seed: int, fmt: str = "PNG") -> str:
    return data_url(encoded(Image.fromarray(pixels(seed)), fmt), f"image/{fmt.lower()}")


def user_with_image(url: str, text: str = "Describe this image.") -> list[dict]:
    return [
        {"role": "user", "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]}
    ]


@pytest.fixture(scope="module")
def client(vlm_server) -> OpenAI:
    return OpenAI(base_url=vlm_server.v1, api_key="unused", max_retries=0)


def ask(client: OpenAI, messages: list[dict], **options) -> tuple[str, int]:
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0, **options)
    return reply.choices[0].message.content, reply.usage.prompt_tokens


def test_the_sdk_example_with_a_base64_image_works_and_counts_the_image_tokens(client):
    text, with_image = ask(client, user_with_image(image_url(1)))
    _, without = ask(client, [{"role": "user", "content": "Describe this image."}])
    assert text
    assert with_image - without >= tiny_vlm.IMAGE_TOKENS


def test_different_images_give_different_outputs_and_the_same_image_the_same(client):
    first, _ = ask(client, user_with_image(image_url(1)))
    other, _ = ask(client, user_with_image(image_url(2)))
    again, _ = ask(client, user_with_image(image_url(1)))
    assert first != other
    assert first == again


def test_an_image_in_jpeg_and_webp_reaches_the_model(client):
    for fmt in ("JPEG", "WEBP", "GIF"):
        _, tokens = ask(client, user_with_image(image_url(3, fmt)))
        assert tokens > tiny_vlm.IMAGE_TOKENS


def test_rgba_palette_and_greyscale_images_are_read_as_rgb(client):
    grey = np.random.default_rng(4).integers(0, 256, (40, 60), dtype=np.uint8)
    as_rgb, _ = ask(client, user_with_image(data_url(encoded(Image.fromarray(np.stack([grey] * 3, axis=-1))))))
    as_grey, _ = ask(client, user_with_image(data_url(encoded(Image.fromarray(grey, "L")))))
    assert as_grey == as_rgb
    opaque = Image.fromarray(pixels(5)).convert("RGBA")
    assert (
        ask(client, user_with_image(data_url(encoded(opaque))))[0]
        == ask(client, user_with_image(data_url(encoded(Image.fromarray(pixels(5))))))[0]
    )
    palette = Image.fromarray(pixels(6)).convert("P")
    assert (
        ask(client, user_with_image(data_url(encoded(palette))))[0]
        == ask(client, user_with_image(data_url(encoded(palette.convert("RGB")))))[0]
    )


def test_the_text_around_the_images_is_kept_in_order(client):
    one, two = image_url(1), image_url(2)
    parts = lambda a, b: [  # noqa: E731
        {"role": "user", "content": [
            {"type": "text", "text": "First"}, {"type": "image_url", "image_url": {"url": a}},
            {"type": "text", "text": "then"}, {"type": "image_url", "image_url": {"url": b}},
        ]}
    ]  # fmt: skip
    forward, tokens = ask(client, parts(one, two))
    backward, same_tokens = ask(client, parts(two, one))
    assert forward != backward
    assert tokens == same_tokens
    only_first = parts(one, two)
    del only_first[0]["content"][3]
    _, one_image = ask(client, only_first)
    assert tokens - one_image >= tiny_vlm.IMAGE_TOKENS


def test_the_string_form_of_image_url_and_detail_are_accepted(client):
    url = image_url(1)
    as_string = [{"role": "user", "content": [{"type": "text", "text": "Describe this image."},
                                              {"type": "image_url", "image_url": url}]}]  # fmt: skip
    with_detail = user_with_image(url)
    with_detail[0]["content"][1]["image_url"]["detail"] = "low"
    assert ask(client, as_string) == ask(client, with_detail) == ask(client, user_with_image(url))


def test_streamed_equals_unary(client):
    messages = user_with_image(image_url(7))
    unary, _ = ask(client, messages)
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0, stream=True)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert streamed == unary


def test_an_image_in_an_earlier_turn_stays_in_the_prompt(client):
    earlier = user_with_image(image_url(1)) + [{"role": "assistant", "content": "A picture."}]
    question = {"role": "user", "content": "What else?"}
    _, with_image = ask(client, [*earlier, question])
    _, without = ask(client, [{"role": "user", "content": "Describe this image."}, earlier[1], question])
    assert with_image - without >= tiny_vlm.IMAGE_TOKENS


def test_responses_input_image_and_a_previous_response_chain(client):
    def create(url: str, **options):
        return client.responses.create(
            model=MODEL,
            input=[{"role": "user", "content": [{"type": "input_text", "text": "Describe this image."},
                                                {"type": "input_image", "image_url": url}]}],
            max_output_tokens=8,
            temperature=0,
            **options,
        )  # fmt: skip

    first = create(image_url(1))
    chat_text, chat_tokens = ask(client, user_with_image(image_url(1)))
    assert first.output_text == chat_text
    assert first.usage.input_tokens == chat_tokens
    follow_up = client.responses.create(
        model=MODEL, previous_response_id=first.id, input="And what else?", max_output_tokens=8, temperature=0
    )
    # The continued conversation holds the earlier turn's image: it is the same prompt
    # as the whole conversation sent to chat completions.
    whole = [*user_with_image(image_url(1)), {"role": "assistant", "content": first.output_text},
             {"role": "user", "content": "And what else?"}]  # fmt: skip
    assert (follow_up.output_text, follow_up.usage.input_tokens) == ask(client, whole)


def test_responses_stream_with_an_image(client):
    events = list(client.responses.create(
        model=MODEL, stream=True, max_output_tokens=8, temperature=0,
        input=[{"role": "user", "content": [{"type": "input_image", "image_url": image_url(1)}]}],
    ))  # fmt: skip
    assert events[-1].type in ("response.completed", "response.incomplete")  # max_output_tokens may end it
    assert events[-1].response.usage.input_tokens > tiny_vlm.IMAGE_TOKENS


def test_batched_image_and_text_requests_each_get_their_own_output(client):
    urls = [image_url(seed) for seed in (1, 2, 3)]
    alone = {i: ask(client, user_with_image(url))[1] for i, url in enumerate(urls)}
    _, text_alone = ask(client, [{"role": "user", "content": "Describe this image."}])
    results: dict[object, tuple[str, int]] = {}

    async def one(key: object, messages: list[dict]) -> None:
        results[key] = await trio.to_thread.run_sync(ask, client, messages)

    async def all_at_once() -> None:
        async with trio.open_nursery() as nursery:
            for i, url in enumerate(urls):
                nursery.start_soon(one, i, user_with_image(url))
            nursery.start_soon(one, "text", [{"role": "user", "content": "Describe this image."}])

    trio.run(all_at_once)
    for i in range(len(urls)):
        assert results[i][1] == alone[i]
    assert results["text"][1] == text_alone
    assert len({results[i][0] for i in range(len(urls))}) == len(urls)


def test_a_client_that_leaves_frees_its_request(client, vlm_server):
    stream = client.chat.completions.create(
        model=MODEL, messages=user_with_image(image_url(1)), max_tokens=1500, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    generated = vlm_server.metric("ovtrio_generated_tokens_total", model_name=MODEL)
    next(iter(stream))
    stream.close()
    until = time.monotonic() + 300  # a cap for a hang
    while vlm_server.metric("ovtrio_requests_running", model_name=MODEL) and time.monotonic() < until:
        time.sleep(0.05)
    assert vlm_server.metric("ovtrio_requests_running", model_name=MODEL) == 0
    # Ended when its client left, not once its 1500 tokens were made.
    assert vlm_server.metric("ovtrio_generated_tokens_total", model_name=MODEL) - generated < 750


def test_images_are_counted_in_the_metrics(client, vlm_server):
    before = vlm_server.metric("ovtrio_images_total", model_name=MODEL)
    ask(client, [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": image_url(1)}},
        {"type": "image_url", "image_url": {"url": image_url(2)}},
    ]}])  # fmt: skip
    assert vlm_server.metric("ovtrio_images_total", model_name=MODEL) == before + 2
    exposition = loopback.get(vlm_server.base_url + "/metrics").text
    assert sample_value(exposition, "ovtrio_image_preprocess_seconds_count", model_name=MODEL) >= 2


# ---- bad images: each a 400 naming the part, and no engine work --------------------------


def bad_request(client: OpenAI, url: str, part: dict | None = None) -> dict:
    content = [{"type": "text", "text": "Describe"}, part or {"type": "image_url", "image_url": {"url": url}}]
    with pytest.raises(BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=4)
    return caught.value.body


TRUNCATED = data_url(encoded(Image.fromarray(pixels(1)))[:200])


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("data:image/png;base64,not base64 at all!", "invalid_image_url"),
        ("data:image/png," + "x" * 10, "invalid_image_url"),
        (data_url(b"this is plain text, not an image"), "invalid_image_format"),
        (data_url(b"hello", "text/plain"), "invalid_image_format"),
        (TRUNCATED, "invalid_image_format"),
        (data_url(encoded(Image.fromarray(pixels(1)), "BMP"), "image/bmp"), "invalid_image_format"),
        ("file:///etc/passwd", "invalid_image_url"),
        ("http://127.0.0.1:9/image.png", "image_url_not_allowed"),
        ("ftp://example.com/a.png", "invalid_image_url"),
    ],
    ids=["not-base64", "not-base64-encoded", "not-an-image", "not-an-image-type", "truncated", "unread-format",
         "file-scheme", "http-not-allowed", "ftp-scheme"],
)  # fmt: skip
def test_a_bad_image_is_a_400_naming_its_part(client, vlm_server, url, code):
    steps = vlm_server.metric("ovtrio_engine_steps_started_total", model_name=MODEL)
    body = bad_request(client, url)
    assert body["param"] == "messages[0].content[1].image_url"
    assert body["code"] == code
    assert body["type"] == "invalid_request_error"
    assert vlm_server.metric("ovtrio_engine_steps_started_total", model_name=MODEL) == steps


def test_an_image_over_the_byte_limit_is_refused(client):
    noise = Image.fromarray(pixels(1, (400, 400)))  # about 480 kB as PNG, over the server's 300 kB
    body = bad_request(client, data_url(encoded(noise)))
    assert body["code"] == "image_too_large" and body["param"] == "messages[0].content[1].image_url"


def peak_rss_mb(server) -> float:
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) / 1024


@functools.cache
def canvases() -> list[tuple[str, str]]:
    """Images of 9400x9400 pixels, small as files: a 3.4 KB lossless WebP, and PNGs."""
    flat = Image.new("RGB", (9400, 9400), (40, 90, 200))
    webp = io.BytesIO()
    flat.save(webp, "WEBP", lossless=True)
    return [
        ("webp", data_url(webp.getvalue(), "image/webp")),
        ("png", data_url(encoded(flat), "image/png")),
        ("png-grey", data_url(encoded(Image.new("L", (9400, 9400), 7)), "image/png")),
    ]


def test_an_image_of_too_many_pixels_is_refused_before_it_is_decoded(client, vlm_server):
    before = peak_rss_mb(vlm_server)
    bodies = []

    def hostile() -> None:
        for _, url in canvases():
            bodies.append(bad_request(client, url))

    beside_innocent_streams(vlm_server, hostile, model=MODEL)
    for body in bodies:
        assert body["code"] == "image_too_large" and body["param"] == "messages[0].content[1].image_url"
        assert "9400x9400" in body["message"] and "--max-image-pixels" in body["message"]
    # Decoding any one of them took a process to a peak of 0.8-1.5 GB.
    assert peak_rss_mb(vlm_server) - before < 200


def test_more_images_than_the_limit_are_refused(client):
    url = image_url(1)
    content = [{"type": "image_url", "image_url": {"url": url}} for _ in range(4)]
    with pytest.raises(BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=4)
    assert caught.value.body["code"] == "too_many_images"
    assert caught.value.body["param"] == "messages[0].content[3].image_url"


def test_a_bad_input_image_names_its_responses_field(client):
    with pytest.raises(BadRequestError) as caught:
        client.responses.create(
            model=MODEL,
            input=[{"role": "user", "content": [{"type": "input_text", "text": "Describe"},
                                                {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}],
        )  # fmt: skip
    assert caught.value.body["param"] == "input[0].content[1].image_url"


def test_a_text_only_model_refuses_images_naming_the_part(server):
    response = httpx.post(
        server.v1 + "/chat/completions",
        json={"model": "SmolLM2-135M-Instruct", "messages": user_with_image(image_url(1)), "max_tokens": 4},
        timeout=30,
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages[0].content[1].image_url"
    response = httpx.post(
        server.v1 + "/responses",
        json={"model": "SmolLM2-135M-Instruct", "max_output_tokens": 4,
              "input": [{"role": "user", "content": [{"type": "input_image", "image_url": image_url(1)}]}]},
        timeout=30,
    )  # fmt: skip
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "input[0].content[0].image_url"


def test_a_vlm_takes_completions_prompts_as_text_and_refuses_token_ids(client):
    text = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4, temperature=0)
    assert text.usage.prompt_tokens > 0
    with pytest.raises(BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=4)
    assert caught.value.body["param"] == "prompt"


# ---- image URLs, on a server that fetches them -------------------------------------------


class CompressingHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the folder; /gzip/NAME and /deflate/NAME send NAME compressed so, and
    /bomb.png a gzip body of 64 MB of zeros (64 kB sent)."""

    def do_GET(self) -> None:
        encoding, _, name = self.path.lstrip("/").partition("/")
        if self.path == "/bomb.png":
            encoding, body = "gzip", BOMB
        elif encoding in ("gzip", "deflate"):
            raw = (Path(self.directory) / name).read_bytes()
            body = gzip.compress(raw) if encoding == "gzip" else zlib.compress(raw)
        else:
            super().do_GET()
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Encoding", encoding)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


BOMB = gzip.compress(bytes(64 * 1024 * 1024), compresslevel=9)


@pytest.fixture(scope="module")
def image_host(tmp_path_factory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("images")
    (root / "one.png").write_bytes(encoded(Image.fromarray(pixels(1))))
    (root / "text.png").write_bytes(b"not an image")
    handler = functools.partial(CompressingHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_a_fetching_server_reads_http_image_urls(vlm_fetching_server, image_host):
    client = OpenAI(base_url=vlm_fetching_server.v1, api_key="unused", max_retries=0)
    fetched, tokens = ask(client, user_with_image(f"{image_host}/one.png"))
    inline, inline_tokens = ask(client, user_with_image(image_url(1)))
    assert (fetched, tokens) == (inline, inline_tokens)
    for url, code in (
        (f"{image_host}/missing.png", "image_url_unreachable"),
        (f"{image_host}/text.png", "invalid_image_format"),
        ("http://127.0.0.1:9/refused.png", "image_url_unreachable"),
        ("file:///etc/hostname", "invalid_image_url"),
    ):
        assert bad_request(client, url)["code"] == code


def test_compressed_image_bodies_are_read_and_bounded(vlm_fetching_server, image_host):
    client = OpenAI(base_url=vlm_fetching_server.v1, api_key="unused", max_retries=0)
    plain = ask(client, user_with_image(f"{image_host}/one.png"))
    assert ask(client, user_with_image(f"{image_host}/gzip/one.png")) == plain
    assert ask(client, user_with_image(f"{image_host}/deflate/one.png")) == plain
    bodies = []
    beside_innocent_streams(
        vlm_fetching_server, lambda: bodies.append(bad_request(client, f"{image_host}/bomb.png")), model=MODEL
    )
    assert bodies[0]["code"] == "image_too_large"


def test_compressed_bodies_are_decompressed_off_the_event_loop(vlm_fetching_server, image_host):
    client = OpenAI(base_url=vlm_fetching_server.v1, api_key="unused", max_retries=0)
    latencies: list[float] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            started = time.perf_counter()
            loopback.get(vlm_fetching_server.base_url + "/health", timeout=30)
            latencies.append(time.perf_counter() - started)
            time.sleep(0.005)

    prober = threading.Thread(target=probe)
    prober.start()
    bombs = [threading.Thread(target=bad_request, args=(client, f"{image_host}/bomb.png")) for _ in range(8)]
    try:
        for bomb in bombs:
            bomb.start()
        for bomb in bombs:
            bomb.join(timeout=120)
    finally:
        done.set()
        prober.join()
    # Each bomb inflated on the event loop held it for tens of milliseconds.
    assert max(latencies) < 0.25, sorted(latencies)[-5:]


def test_a_server_fetches_from_public_addresses_only_by_default(vlm_fetching_public_server, image_host):
    client = OpenAI(base_url=vlm_fetching_public_server.v1, api_key="unused", max_retries=0)
    port = image_host.rsplit(":", 1)[1]
    refused = [
        f"{image_host}/one.png",  # an image is there
        f"http://localhost:{port}/one.png",
        f"http://[::1]:{port}/one.png",
        f"http://127.0.0.2:{port}/one.png",
        f"{image_host}/missing.png",  # nothing is there
        "http://127.0.0.1:9/refused.png",  # no one listens
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/a.png",
        "http://192.168.0.1/a.png",
        "http://0.0.0.0:9/a.png",
    ]
    bodies = []
    beside_innocent_streams(
        vlm_fetching_public_server, lambda: bodies.extend(bad_request(client, url) for url in refused), model=MODEL
    )
    # One answer for all: the reply does not tell what is at an address.
    assert {(body["code"], body["message"], body["param"]) for body in bodies} == {
        (bodies[0]["code"], bodies[0]["message"], "messages[0].content[1].image_url")
    }
    assert bodies[0]["code"] == "image_url_unreachable"
    credentials = bad_request(client, "http://user:secret@example.com/a.png")
    assert credentials["code"] == "invalid_image_url" and "user name or password" in credentials["message"]


def test_the_responses_websocket_takes_input_images(client):
    def over_the_socket(url: str) -> tuple[str, int]:
        with client.responses.connect() as connection:
            connection.response.create(
                model=MODEL, max_output_tokens=8, temperature=0,
                input=[{"role": "user", "content": [{"type": "input_text", "text": "Describe this image."},
                                                    {"type": "input_image", "image_url": url}]}],
            )  # fmt: skip
            for event in connection:
                assert event.type != "error", event
                if event.type in ("response.completed", "response.incomplete"):
                    return event.response.output_text, event.response.usage.input_tokens
        raise AssertionError("the socket closed before the response ended")

    assert over_the_socket(image_url(1)) == ask(client, user_with_image(image_url(1)))
    assert over_the_socket(image_url(2)) != over_the_socket(image_url(1))


vlm_stateful_server = server_fixture(
    "vlm_stateful_server",
    "--model",
    "{folder}/vlm",
    "--served-model-name",
    MODEL,
    "--backend",
    "stateful",
    prepare=build_vlm,
)


def test_the_stateful_backend_serves_images_through_the_vlm_pipeline(vlm_stateful_server, client):
    stateful = OpenAI(base_url=vlm_stateful_server.v1, api_key="unused", max_retries=0)
    first, tokens = ask(stateful, user_with_image(image_url(1)))
    other, _ = ask(stateful, user_with_image(image_url(2)))
    again, _ = ask(stateful, user_with_image(image_url(1)))
    assert first == again != other
    # Both backends count the same prompt.
    assert tokens == ask(client, user_with_image(image_url(1)))[1]
    stream = stateful.chat.completions.create(
        model=MODEL, messages=user_with_image(image_url(1)), max_tokens=8, temperature=0, stream=True
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == first


def test_the_model_list_says_the_vlm_takes_images(client, server):
    assert client.models.retrieve(MODEL).model_extra["input_modalities"] == ["text", "image"]
    text_only = httpx.get(server.v1 + "/models/SmolLM2-135M-Instruct", timeout=10).json()
    assert text_only["input_modalities"] == ["text"]


def test_the_messages_api_takes_image_blocks(vlm_server, client):
    import anthropic

    claude = anthropic.Anthropic(base_url=vlm_server.base_url, api_key="unused", max_retries=0)

    def ask_claude(seed: int) -> tuple[str, int]:
        data = base64.b64encode(encoded(Image.fromarray(pixels(seed)))).decode()
        reply = claude.messages.create(
            model=MODEL, max_tokens=8, extra_body={"temperature": 0},
            messages=[{"role": "user", "content": [
                {"type": "text", "text": "Describe this image."},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}},
            ]}],
        )  # fmt: skip
        return "".join(block.text for block in reply.content if block.type == "text"), reply.usage.input_tokens

    first, tokens = ask_claude(1)
    assert ask_claude(1) == (first, tokens)
    assert ask_claude(2)[0] != first
    # The same conversation as chat completions' (same template, same image).
    assert (first, tokens) == ask(client, user_with_image(image_url(1)))
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(
            model=MODEL, max_tokens=4,
            messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}],
        )  # fmt: skip
    assert "messages[0].content[0].source" in caught.value.message
