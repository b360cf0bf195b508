"""Bodies of megabytes of images, whose data URLs are lifted out before the JSON is
parsed (ovtrio/api/lifted_strings.py), on a real server with the tiny VLM fixture: the
model sees the same images as when the body is parsed whole, and what is stored of a
Responses turn holds the images themselves. Large bodies under the hypercorn command:
test_launcher_parity.py."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import httpx
import numpy as np
from openai import OpenAI
from PIL import Image

import tiny_vlm
from server_pool import server_fixture

MODEL = "vlm"


def build_vlm(folder: Path) -> None:
    tiny_vlm.build(folder / "vlm")


vlm_large_server = server_fixture(
    "vlm_large_server", "--model", "{folder}/vlm", "--served-model-name", MODEL, prepare=build_vlm
)


def large_image_url(seed: int, side: int = 640) -> str:
    """A noise PNG of about 1.2 MB: two make a body larger than the 1 MiB from which
    data URLs are lifted."""
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def chat_body(urls: list[str]) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    content = [{"type": "text", "text": "Compare"}, *parts]
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0}


def post(base_url: str, raw: bytes) -> dict:
    reply = httpx.post(
        f"{base_url}/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"}, timeout=120
    )
    assert reply.status_code == 200, reply.text
    return reply.json()


def lifted_and_parsed_whole_agree(base_url: str) -> None:
    urls = [large_image_url(1), large_image_url(2)]
    raw = json.dumps(chat_body(urls)).encode()
    assert len(raw) > 2 * 1024 * 1024
    # The same JSON with its slashes escaped (as some JSON writers do) is parsed whole:
    # a string with a backslash is never lifted.
    escaped = raw.replace(b"/", b"\\/")
    lifted, parsed_whole = post(base_url, raw), post(base_url, escaped)
    assert lifted["usage"]["prompt_tokens"] >= 2 * tiny_vlm.IMAGE_TOKENS
    assert lifted["choices"][0]["message"] == parsed_whole["choices"][0]["message"]
    assert lifted["usage"] == parsed_whole["usage"]


def test_a_large_body_gives_the_model_the_images_a_whole_parse_does(vlm_large_server):
    lifted_and_parsed_whole_agree(vlm_large_server.base_url)


def test_the_data_urls_of_a_large_body_are_read_apart_from_its_json(vlm_large_server):
    """Seen from outside by a raw tab inside a data URL: JSON forbids it, so a whole parse
    refuses the body as JSON, while a lifted data URL is refused as an image, naming it."""
    urls = [large_image_url(1), large_image_url(2)]
    urls[1] = urls[1][:5000] + "\t" + urls[1][5000:]
    raw = json.dumps(chat_body(urls)).encode().replace(b"\\t", b"\t")
    reply = httpx.post(
        f"{vlm_large_server.base_url}/v1/chat/completions",
        content=raw,
        headers={"Content-Type": "application/json"},
        timeout=120,
    )
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "messages[0].content[2].image_url"


def test_a_stored_responses_turn_keeps_its_large_image(vlm_large_server):
    client = OpenAI(base_url=vlm_large_server.v1, api_key="unused", max_retries=0)
    url = large_image_url(3, side=760)
    first = client.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Describe"},
                                            {"type": "input_image", "image_url": url}]}],
        max_output_tokens=4,
        temperature=0,
    )  # fmt: skip
    stored = client.responses.input_items.list(first.id).data
    assert [part.image_url for part in stored[0].content if part.type == "input_image"] == [url]
    follow_up = client.responses.create(
        model=MODEL, previous_response_id=first.id, input="And?", max_output_tokens=4, temperature=0
    )
    assert follow_up.usage.input_tokens > first.usage.input_tokens


def test_the_responses_websocket_reads_a_large_frame_as_http_reads_its_body(vlm_large_server):
    client = OpenAI(base_url=vlm_large_server.v1, api_key="unused", max_retries=0)
    content = [{"type": "input_text", "text": "Compare"}]
    content += [{"type": "input_image", "image_url": large_image_url(seed)} for seed in (4, 5)]
    request = {
        "model": MODEL,
        "max_output_tokens": 8,
        "temperature": 0,
        "input": [{"role": "user", "content": content}],
    }
    with client.responses.connect() as connection:
        connection.response.create(**request)
        for event in connection:
            assert event.type != "error", event
            if event.type in ("response.completed", "response.incomplete"):
                over_the_socket = event.response
                break
    over_http = client.responses.create(**request)
    assert over_the_socket.usage.input_tokens == over_http.usage.input_tokens >= 2 * tiny_vlm.IMAGE_TOKENS
    assert over_the_socket.output_text == over_http.output_text
