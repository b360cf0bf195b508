"""Request bodies read into one buffer, without copies.

Quart keeps a body's chunks in a bytearray that grows as they arrive, and awaiting the
body returns `bytes(bytearray)`. Both cost the event loop a copy of the whole body:

- Awaiting: here it returns the bytearray itself; the readers (pydantic's JSON reader,
  bytes.find, .decode) take it as they take bytes. For a body of images the copy is
  milliseconds of the event loop's time, more on a virtual machine, where every fresh
  page faults on first touch (measured in docs/benchmarks.md#request-bodies).
- Growing: a bytearray grows by an eighth at a time, and each time it cannot grow in
  place its whole content is copied, about eight copies of the body in all. A body
  whose Content-Length is at least PREALLOCATED_FROM_BYTES gets its whole buffer when
  its headers arrive, and each chunk is copied once, into place.

The buffer is only as large as the Content-Length, which Quart has already checked
against the server's body limit (a larger one is refused with 413 before it is read).
It is allocated without being filled (`bytearray(n)` writes n zeros at once, faulting
every page in, in one step of the event loop), so its pages are
touched only as the body arrives, and nothing of it is read beyond what arrived.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Generator
from typing import Any

from quart_trio.wrappers.request import TrioBody, TrioRequest

from ovtrio.serving import memory

PREALLOCATED_FROM_BYTES = 256 * 1024


@functools.cache
def _bytearray_from_string_and_size() -> Any:
    """CPython's PyByteArray_FromStringAndSize, which copies nothing into a bytearray
    made from a NULL string; None elsewhere."""
    try:
        make = ctypes.pythonapi.PyByteArray_FromStringAndSize
    except AttributeError:
        return None
    make.restype = ctypes.py_object
    make.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
    return make


def _unfilled_bytearray(size: int) -> bytearray:
    """A bytearray of `size` bytes left as the allocator gave them."""
    make = _bytearray_from_string_and_size()
    buffer = bytearray(size) if make is None else make(None, size)
    assert isinstance(buffer, bytearray)
    return buffer


# The fields of Quart-Trio's TrioBody (0.12) that UncopiedBody reads and writes.
TRIO_BODY_FIELDS = ("_data", "_must_raise", "_has_data", "_complete")


def fits_quart_trio() -> bool:
    """Whether the installed Quart-Trio's body keeps the fields UncopiedBody fills in
    place; without them the app keeps Quart-Trio's own request class."""
    body = TrioBody(None, None)
    return all(hasattr(body, name) for name in TRIO_BODY_FIELDS) and isinstance(body._data, bytearray)


class UncopiedBody(TrioBody):
    def __init__(self, expected_content_length: int | None, max_content_length: int | None) -> None:
        super().__init__(expected_content_length, max_content_length)
        # Bytes written into a preallocated buffer; None while the buffer grows as Quart's.
        self._filled: int | None = None
        if self._must_raise is not None or expected_content_length is None:
            return  # refused before it is read (413), or of unknown length
        memory.note_request_size(expected_content_length)
        if expected_content_length >= PREALLOCATED_FROM_BYTES:
            self._data = _unfilled_bytearray(expected_content_length)
            self._filled = 0

    def append(self, data: bytes) -> None:
        if self._filled is None:
            super().append(data)
            return
        if not data or self._must_raise is not None:
            return
        end = self._filled + len(data)
        # A slice of the same length is copied into place; past the declared length
        # (which the HTTP layer does not let a client send) the buffer grows.
        self._data[self._filled : min(end, len(self._data))] = data
        self._filled = end
        self._has_data.set()

    def set_complete(self) -> None:
        if self._filled is not None and self._filled < len(self._data):
            del self._data[self._filled :]  # the client stopped short of its Content-Length
        super().set_complete()

    async def __anext__(self) -> bytes:
        if self._filled is None:
            return await super().__anext__()
        # A preallocated body is handed out whole, once.
        if self._must_raise is not None:
            raise self._must_raise
        await self._complete.wait()
        if self._must_raise is not None:
            raise self._must_raise
        if not self._data:
            raise StopAsyncIteration()
        data = bytes(self._data)
        self._data.clear()
        return data

    def __await__(self) -> Generator[Any, None, Any]:
        if self._must_raise is not None:
            raise self._must_raise
        yield from self._complete.wait().__await__()
        if self._must_raise is not None:  # set while the body arrived: too large
            raise self._must_raise
        return self._data


class UncopiedRequest(TrioRequest):
    body_class = UncopiedBody
