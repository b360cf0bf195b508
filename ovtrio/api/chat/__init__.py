"""Chat completions: POST /v3/chat/completions (and /v1)."""
