"""Ollama's native API beside OpenAI's: /api/chat, /api/generate, /api/embed and
/api/embeddings, /api/tags, /api/ps, /api/show, /api/version, and `/` answering
"Ollama is running" to a client that probes it, so that an app written for a local
Ollama works against this server unchanged (on port 11434 if it expects Ollama's).

The same path as every other front end: a request (protocol.py, with its `options` in
options.py and its model names in names.py) is translated into the chat body chat
completions runs (prepare.py); the scheduler and the output stage then feed the Ollama
writer (writer.py), unary or streamed as NDJSON (stream.py). What is served of the
models is described in Ollama's shapes by catalog.py; errors take Ollama's shape,
`{"error": "..."}` (errors.py). The routes are in routes.py."""
