"""Output constraints (structured output): compiled before admission in a worker
(check.py, worker.py), and the engine's cache of compiled grammars bounded (cache.py)."""
