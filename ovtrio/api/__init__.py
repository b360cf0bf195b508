"""HTTP layer: OpenAI request parsing, validation, formatting and sinks."""
