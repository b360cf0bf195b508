"""Anthropic's Messages API: POST /v1/messages (and /v3) and /v1/messages/count_tokens,
a third front end on the chat path. Its request (protocol.py) is translated into the
chat body and conversation chat completions runs (prepare.py); the same scheduler and
output events then feed its writer (writer.py), unary or streamed as named events with
pings (stream.py); errors take Anthropic's shape (errors.py)."""
