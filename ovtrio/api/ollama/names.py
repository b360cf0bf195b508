"""Model names as Ollama's clients send them, `name:tag`, and this server's model ids.

The one rule: a name is the id it spells; failing that, a name ending in ":latest"
is the id without that tag. So `X` and `X:latest` both name the model X, and an id that
itself holds a ':' (`qwen3:4b`) is reached by its own name. A model is listed (GET
/api/tags, /api/ps) as `X:latest`, or by its id alone when that already has a tag."""

from __future__ import annotations

from ovtrio.api.context import model_registry

LATEST = ":latest"


def listed_name(model_id: str) -> str:
    """The name /api/tags and /api/ps give the model `model_id`."""
    return model_id if ":" in model_id else model_id + LATEST


async def model_id(name: str) -> str:
    """The id of the model `name` names (the name itself when none does: the lookup
    that follows answers 404 for it)."""
    registry = model_registry()
    if await registry.lookup(name) is not None or not name.endswith(LATEST):
        return name
    bare = name.removesuffix(LATEST)
    return bare if bare and await registry.lookup(bare) is not None else name
