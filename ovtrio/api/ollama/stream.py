"""Running a prepared Ollama request: to its end for a unary reply, or as a stream of
NDJSON (`application/x-ndjson`: one JSON object a line), Ollama's default.

The stream is submitted before the client is answered (EventStream's default), so what
the engine refuses as the request is added is still an ordinary HTTP error; a failure
after the 200 is a last `{"error": "..."}` line, as Ollama ends a stream that fails.
A client that leaves ends the engine request (the body is closed)."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import orjson
from quart import Response

from ovtrio.api.generation import run_to_end, submitted, written
from ovtrio.api.ollama.prepare import Prepared
from ovtrio.api.ollama.writer import OllamaWriter, Record
from ovtrio.api.sse import HEADERS, EventStream
from ovtrio.scheduler import GenerationScheduler, RequestStream

NDJSON = "application/x-ndjson"


def line(record: Record) -> bytes:
    return orjson.dumps(record) + b"\n"


def ndjson_response(body: EventStream | bytes) -> Response:
    return Response(body, mimetype=NDJSON, headers=HEADERS)


async def record_stream(scheduler: GenerationScheduler, ready: Prepared, writer: OllamaWriter) -> Response:
    """The NDJSON body of a streamed request."""

    async def lines(stream: RequestStream) -> AsyncGenerator[bytes, None]:
        async for records in written(stream, ready.stage, writer):
            yield b"".join(map(line, records))

    return ndjson_response(await EventStream(submitted(scheduler, ready.generation), lines).open())


async def unary_reply(scheduler: GenerationScheduler, ready: Prepared, writer: OllamaWriter) -> Record:
    """Run the request to its end; the reply its events add up to."""
    await run_to_end(scheduler, ready.generation, ready.stage, writer.write)
    return writer.reply()
