"""A multipart/form-data body (what OpenAI's SDK sends to the audio routes) split into its
text fields and its one file.

Quart's own form parser spools any file over 500 KB to a temporary file, writing to disk
from the event loop; the body is in memory already (ovtrio/api/request_body.py), so it
is split here with Werkzeug's sans-IO decoder, in the thread that decodes the audio next.
Text fields are small (MAX_FIELD_BYTES) and few (MAX_PARTS); the file is the one part
with a file name, and a second one is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from werkzeug.datastructures import MultiDict
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.http import parse_options_header
from werkzeug.sansio.multipart import Data, Epilogue, Field, File, MultipartDecoder, NeedData

from ovtrio.errors import FieldError

MAX_PARTS = 64
MAX_FIELD_BYTES = 64 * 1024
PIECE_BYTES = 64 * 1024
# What a form adds to its file: the other fields, the boundaries and part headers.
AUDIO_FORM_BYTES = 64 * 1024


class FormError(FieldError):
    """The body is not a form this route takes; `param` names the field at fault."""


@dataclass
class Upload:
    name: str  # the form field's name ("file")
    filename: str
    content_type: str | None
    data: bytearray = field(default_factory=bytearray)


@dataclass
class Form:
    fields: MultiDict[str, str]
    upload: Upload | None


def boundary_of(content_type: str | None) -> bytes:
    """The multipart boundary of a Content-Type header; FormError when it is not one."""
    kind, options = parse_options_header(content_type or "")
    if kind != "multipart/form-data" or not options.get("boundary"):
        raise FormError(
            "The body must be multipart/form-data (a file upload, as OpenAI's SDK sends it), with 'file' and 'model'.",
            None,
        )
    return options["boundary"].encode("latin-1")


def parse(body: bytes | bytearray, boundary: bytes) -> Form:
    """The fields and file of a multipart body. Raises FormError."""
    # Werkzeug's own bound on a field's size measures its whole buffer, here the whole
    # body: the fields are measured in _collect instead.
    decoder = MultipartDecoder(boundary, None, max_parts=MAX_PARTS)
    try:
        return _collect(decoder, memoryview(body))
    except RequestEntityTooLarge:
        raise FormError(f"The form has more than {MAX_PARTS} parts.", None) from None
    except ValueError as exc:
        raise FormError(f"The multipart body is malformed: {exc}.", None) from None


def _collect(decoder: MultipartDecoder, body: memoryview) -> Form:
    """The form's parts, the body fed to the decoder PIECE_BYTES at a time, so that the
    event loop runs between pieces: given a whole body at once, the decoder holds the
    GIL while it searches and trims one large buffer (why: docs/benchmarks.md#request-bodies).
    Raises FormError, or the decoder's own errors, which `parse` turns into FormErrors."""
    fields: MultiDict[str, str] = MultiDict()
    fed = 0
    ended = False
    upload: Upload | None = None
    current: Upload | None = None
    name = ""
    text = bytearray()
    while True:
        event = decoder.next_event()
        if isinstance(event, NeedData):
            if ended:
                raise FormError("The multipart body ends before its closing boundary.", None)
            piece = bytes(body[fed : fed + PIECE_BYTES])
            fed += len(piece)
            ended = not piece
            decoder.receive_data(piece or None)  # None: the body's end
            continue
        if isinstance(event, Epilogue):
            return Form(fields, upload)
        if isinstance(event, File):
            if upload is not None:
                raise FormError("The form holds more than one file; send one audio file as 'file'.", event.name)
            current = upload = Upload(event.name, event.filename, event.headers.get("content-type"))
        elif isinstance(event, Field):
            current = None
            name = event.name
            text = bytearray()
        elif isinstance(event, Data):
            if current is not None:
                current.data += event.data
            else:
                text += event.data
                if len(text) > MAX_FIELD_BYTES:
                    raise FormError(f"The form field '{name}' is over {MAX_FIELD_BYTES} bytes.", name)
                if not event.more_data:
                    try:
                        fields.add(name, text.decode("utf-8"))
                    except UnicodeDecodeError:
                        raise FormError(f"The form field '{name}' is not UTF-8 text.", name) from None
