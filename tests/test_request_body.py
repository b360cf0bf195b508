"""Request bodies read into one buffer (ovtrio/api/request_body.py): what awaiting or
iterating a body gives is what arrived, in order, whether its buffer was allocated at
its Content-Length or grew as the chunks came."""

from __future__ import annotations

import os

import pytest
import trio
from werkzeug.exceptions import RequestEntityTooLarge

from ovtrio.api.request_body import PREALLOCATED_FROM_BYTES, UncopiedBody

LARGE = PREALLOCATED_FROM_BYTES + 12_345


def chunks(data: bytes, size: int) -> list[bytes]:
    return [data[start : start + size] for start in range(0, len(data), size)]


@pytest.mark.parametrize("length", [10_000, LARGE], ids=["grown", "preallocated"])
@pytest.mark.parametrize("size", [1, 4096, 65_536, 10**9], ids=["1", "4K", "64K", "whole"])
async def test_awaiting_gives_the_chunks_in_order(length, size):
    data = os.urandom(length)
    body = UncopiedBody(len(data), None)
    for chunk in chunks(data, size if size > 1 else 997):
        body.append(chunk)
        body.append(b"")  # Hypercorn sends empty chunks too
    body.set_complete()
    assert bytes(await body) == data


async def test_a_preallocated_buffer_is_the_content_length_and_written_in_place():
    data = os.urandom(LARGE)
    body = UncopiedBody(len(data), None)
    buffer = body._data
    assert len(buffer) == len(data)
    for chunk in chunks(data, 65_536):
        body.append(chunk)
    body.set_complete()
    received = await body
    assert received is buffer  # no copy, no new buffer
    assert bytes(received) == data


async def test_a_client_stopping_short_of_its_content_length_gives_what_it_sent():
    data = os.urandom(LARGE)
    body = UncopiedBody(len(data) + 1000, None)
    body.append(data)
    body.set_complete()
    assert bytes(await body) == data


async def test_more_than_the_content_length_is_kept_too():
    data = os.urandom(LARGE)
    body = UncopiedBody(len(data) - 100, None)
    for chunk in chunks(data, 65_536):
        body.append(chunk)
    body.set_complete()
    assert bytes(await body) == data


@pytest.mark.parametrize("length", [10_000, LARGE], ids=["grown", "preallocated"])
async def test_iterating_gives_the_whole_body(length):
    data = os.urandom(length)
    body = UncopiedBody(len(data), None)
    received = bytearray()

    async def read() -> None:
        async for chunk in body:
            received.extend(chunk)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await trio.lowlevel.checkpoint()
        for chunk in chunks(data, 65_536):
            body.append(chunk)
            await trio.lowlevel.checkpoint()
        body.set_complete()
    assert bytes(received) == data


async def test_a_content_length_over_the_limit_is_refused_before_any_buffer():
    body = UncopiedBody(10 * LARGE, LARGE)
    assert len(body._data) == 0
    with pytest.raises(RequestEntityTooLarge):
        await body


def test_only_bodies_that_will_be_read_count_as_large_requests(monkeypatch):
    from ovtrio.serving import memory

    monkeypatch.setattr(memory, "_large_requests", memory._LargeRequests())
    monkeypatch.setattr(memory, "keep_freed_memory", lambda: True)
    megabytes = 4 * memory.LARGE_REQUEST_BYTES
    UncopiedBody(megabytes, megabytes // 2)  # refused by its Content-Length
    UncopiedBody(None, megabytes)  # chunked: its size is not known yet
    assert not memory._large_requests.pending
    UncopiedBody(megabytes, 2 * megabytes)
    assert memory._large_requests.pending
