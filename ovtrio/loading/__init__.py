"""A model's load into the engine: the load itself (load.py), in a thread of its own started
before the web framework is imported (thread.py), held to a deadline (deadline.py), with its
Python work beside the engine's compile (tables.py); the GGUF file the engine is handed
(gguf_converted.py) or the model built from it (gguf_built.py), the cache entry built in a
child process (cache_build.py) and `ovtrio convert` (convert_cache.py); speculative decoding
(speculation.py), the warm-up (warm_up.py), and what a request may ask of the loaded model
(limits.py)."""

from ovtrio.loading.load import LoadedModel, load_and_warm_up, load_model
from ovtrio.loading.thread import ModelLoad, start_loading, start_loading_in_order
from ovtrio.loading.warm_up import warm_up

__all__ = [
    "LoadedModel",
    "ModelLoad",
    "load_and_warm_up",
    "load_model",
    "start_loading",
    "start_loading_in_order",
    "warm_up",
]
