"""The HTTP and WebSocket layer: OpenAI requests in, OpenAI objects out. Never touches
the engine; reaches the model only through ServingModel (ovtrio/serving/service.py).

* Requests are parsed and validated by the pydantic models of protocol/ (and
  responses/protocol.py), taken in by generation.accept; output formats are checked in
  formats.py, sampling settings in sampling.py.
* conversation.py (chat and Responses) and the completions route build the prompt
  with ovtrio/text/prompts.py; generation.generation_request makes the scheduler's
  request.
* Output events (ovtrio/output) are written by one writer per shape: chat/writer.py,
  completions/writer.py, responses/events.py (streamed) and responses/body.py (unary
  Response objects), messages/writer.py (Anthropic's) and ollama/writer.py (Ollama's);
  sse.py frames them as server-sent events (ollama/stream.py as NDJSON lines),
  responses/socket.py as WebSocket messages.
* errors.py maps every failure to OpenAI's error shape; context.py is the one way to
  the app's shared objects; ovtrio/parsing/ids.py mints every id.
"""
