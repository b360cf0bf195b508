"""The model: finding and checking it (source.py, gguf.py), loading it into the engine
(loading.py), and everything that knows its tokenizer: the byte-level vocabulary
(vocabulary.py), prompt building (prompts.py), the formats its chat template teaches
(chat_format.py), and the limits and defaults requests get (limits.py)."""

from ovtrio.model.load_thread import ModelLoad, start_loading, start_loading_in_order
from ovtrio.model.loading import LoadedModel, load_and_warm_up, load_model
from ovtrio.model.source import EMBEDDED_NAME, ModelLoadError, ModelSource, embedded_model_path, resolve_model
from ovtrio.model.warm_up import warm_up

__all__ = [
    "EMBEDDED_NAME",
    "LoadedModel",
    "ModelLoad",
    "ModelLoadError",
    "ModelSource",
    "embedded_model_path",
    "load_and_warm_up",
    "load_model",
    "resolve_model",
    "start_loading",
    "start_loading_in_order",
    "warm_up",
]
