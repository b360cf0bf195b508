"""The model a server serves, found and checked before the engine loads it (source.py): the
devices it is to run on (devices.py), a rotary embedding that changes with the length run
at (long_rope.py), a vision-language model's folder (vision.py), and its path as a client
may see it (shown_paths.py). Loading it is ovtrio.loading's."""

from ovtrio.model.source import EMBEDDED_NAME, ModelLoadError, ModelSource, embedded_model_path, resolve_model

__all__ = [
    "EMBEDDED_NAME",
    "ModelLoadError",
    "ModelSource",
    "embedded_model_path",
    "resolve_model",
]
