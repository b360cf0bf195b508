"""Text completions: POST /v3/completions (and /v1)."""
