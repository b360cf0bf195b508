"""Data URLs lifted out of large bodies before parsing (ovtrio/api/lifted_strings.py):
the body parsed from the lifted JSON, with the strings put back, is the body the whole
JSON parses to, whatever the strings hold; only whole, unescaped ASCII strings that
open with `data:` are lifted."""

from __future__ import annotations

import base64
import json
import random

import pytest
import trio

from ovtrio.api import lifted_strings
from ovtrio.api.lifted_strings import LIFTED_MIN_BYTES, lift_data_urls

LONG = "data:image/png;base64," + base64.b64encode(random.Random(0).randbytes(LIFTED_MIN_BYTES)).decode()


@pytest.fixture(autouse=True)
def lift_from_any_size(monkeypatch):
    """These documents are smaller than the bodies lifting starts at (1 MiB)."""
    monkeypatch.setattr(lifted_strings, "LIFTED_FROM_BODY_BYTES", 0)


def test_a_body_under_the_size_is_parsed_whole(monkeypatch):
    monkeypatch.setattr(lifted_strings, "LIFTED_FROM_BODY_BYTES", 1024 * 1024)
    raw = json.dumps({"url": LONG}).encode()
    assert trio.run(lift_data_urls, raw).json is raw


def lifted(raw: bytes):
    body = trio.run(lift_data_urls, raw)
    # A WebSocket text frame (a str) is lifted the same way.
    as_text = trio.run(lift_data_urls, raw.decode())
    assert (as_text.json.encode() if as_text.strings else raw) == body.json
    assert list(as_text.strings.values()) == list(body.strings.values())
    return body


def parsed_after_lifting(raw: bytes):
    body = lifted(raw)
    value = json.loads(body.json)
    body.restore(value)
    return value


def test_long_data_urls_are_lifted_and_put_back_where_they_were():
    other = LONG.replace("png", "jpeg")
    document = {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "two"}, {"type": "image_url", "image_url": {"url": LONG}}],
            },
            {"role": "user", "content": [{"type": "image_url", "image_url": other}]},
        ],
        "tuple_like": [LONG, "data:short", 1],
        "nested": {"url": other},
    }
    raw = json.dumps(document).encode()
    body = lifted(raw)
    assert len(body.strings) == 4  # the short one stays
    assert len(body.json) < 1024
    assert parsed_after_lifting(raw) == document


@pytest.mark.parametrize(
    "text",
    [
        "data:short",  # below the size worth lifting
        LONG.replace("/", "\\/", 1),  # an escape inside: the parser must read it
        LONG + "\u00e9",  # not ASCII
        'he wrote "' + LONG + '" there',  # a quoted data URL inside other text: its quote is escaped
        '\\\\"' + LONG,  # a backslash, then an escaped quote, then data:
    ],
    ids=["short", "escaped-slash", "non-ascii", "quoted-inside-text", "escaped-quote-after-backslash"],
)
def test_strings_that_are_not_plain_whole_data_urls_stay_in_the_json(text):
    raw = json.dumps({"text": text}, ensure_ascii=False).encode().replace(b"\\\\/", b"\\/")
    body = lifted(raw)
    assert body.strings == {} and body.json is raw
    assert parsed_after_lifting(raw) == json.loads(raw)


def test_invalid_json_stays_invalid():
    # A closing quote followed by data: is not JSON; lifting must not make it so.
    raw = b'{"a": "x"' + LONG.encode() + b'"}'
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw)
    with pytest.raises(json.JSONDecodeError):
        json.loads(lifted(raw).json)


def test_an_unterminated_string_is_left_alone():
    raw = b'{"a": "' + LONG.encode()
    assert lifted(raw).json is raw


def test_random_documents_parse_the_same_after_lifting():
    rng = random.Random(7)
    pieces = [LONG, LONG, LONG, LONG[:100], "\\", '"', "data:", '"data:', '\\"data:', "é", "/", "\n", "x"]

    def string() -> str:
        return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 4)))

    def value(depth: int):
        kind = rng.randrange(4 if depth < 3 else 2)
        if kind == 0:
            return string()
        if kind == 1:
            return rng.choice([1, 2.5, None, True])
        if kind == 2:
            return [value(depth + 1) for _ in range(rng.randint(0, 3))]
        return {f"k{i}": value(depth + 1) for i in range(rng.randint(0, 3))}

    lifted_some = 0
    for _ in range(300):
        document = {"root": value(0)}
        raw = json.dumps(document, ensure_ascii=rng.random() < 0.5).encode()
        lifted_some += bool(lifted(raw).strings)
        assert parsed_after_lifting(raw) == document
    assert lifted_some > 30  # the cases exercised the lifting, not only the fallback


def test_bodies_arriving_together_are_read_one_at_a_time(monkeypatch):
    # Each string read is a pass of the event loop; two bodies lifted at once take turns
    # by body, not by string, so that one pass never reads two.
    bodies = {name: json.dumps({"urls": [LONG + name * i for i in range(1, 4)]}).encode() for name in "AB"}
    reads: list[str] = []
    ascii_read = lifted_strings._ascii

    def recorded(text):
        reads.append(next(name for name, raw in bodies.items() if text.obj is raw))
        return ascii_read(text)

    monkeypatch.setattr(lifted_strings, "_ascii", recorded)
    results: dict[str, lifted_strings.LiftedBody] = {}

    async def lift(name: str) -> None:
        results[name] = await lift_data_urls(bodies[name])

    async def both() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lift, "A")
            nursery.start_soon(lift, "B")

    trio.run(both)
    assert reads in (list("AAABBB"), list("BBBAAA"))
    for name, raw in bodies.items():
        assert len(results[name].strings) == 3
        parsed = json.loads(results[name].json)
        results[name].restore(parsed)
        assert parsed == json.loads(raw)


def test_restore_says_whether_every_string_was_in_a_field_that_may_hold_one():
    from pydantic import BaseModel

    from ovtrio.api.protocol.chat_messages import ImagePart, ImageURL

    class Body(BaseModel):
        parts: list[ImagePart]
        metadata: dict[str, str] = {}

    in_image = lifted(json.dumps({"parts": [{"type": "image_url", "image_url": {"url": LONG}}]}).encode())
    body = Body.model_validate_json(in_image.json)
    assert in_image.restore(body) and body.parts[0].image_url == ImageURL(url=LONG)
    as_string = lifted(json.dumps({"parts": [{"type": "image_url", "image_url": LONG}]}).encode())
    body = Body.model_validate_json(as_string.json)
    assert as_string.restore(body) and body.parts[0].image_url == LONG
    in_metadata = lifted(json.dumps({"parts": [], "metadata": {"k": LONG}}).encode())
    body = Body.model_validate_json(in_metadata.json)
    assert not in_metadata.restore(body)
    as_key = lifted(json.dumps({"parts": [], "metadata": {LONG: "v"}}).encode())
    body = Body.model_validate_json(as_key.json)
    assert not as_key.restore(body)


def test_a_lifted_key_is_put_back_in_a_plain_document():
    # The WebSocket restores its frame's parsed JSON before validating it.
    document = {"metadata": {"a": "1", LONG: "2", "z": [{LONG: LONG}]}}
    frame = lifted(json.dumps(document).encode())
    parsed = json.loads(frame.json)
    assert LONG not in json.dumps(parsed)
    frame.restore(parsed)
    assert parsed == document and list(parsed["metadata"]) == ["a", LONG, "z"]
