"""The served models in Ollama's shapes: GET /api/tags (every generation and embedding
model, loaded or not), GET /api/ps (those loaded, with when their idle unload is due),
POST /api/show (one model's details, model_info and capabilities), GET /api/version.

What is described is what this server knows: sizes, digests and dates are its files'
(serving/model_facts.py: the digest is of their paths, sizes and times, not Ollama's
manifest digest); the architecture is its files' and the context length what it serves
(the model's, or a KV cache too small for it). parameter_size and quantization_level
are left empty: the engine reads the weights, this server does not. A model's template,
and whether it thinks and which tool-call format is read, are known once it is loaded:
/api/show of a model not loaded lists what its files tell (completion, vision,
embedding) and no template; it loads no model."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import trio

from ovtrio.api.context import model_registry
from ovtrio.api.errors import model_not_found
from ovtrio.api.ollama.names import listed_name
from ovtrio.embedding.embedded import EMBEDDED_EMBEDDER_NAME, embedded_embedder_zip
from ovtrio.lifecycle.resident import ModelState, Resident
from ovtrio.serving.kinds import Encoder, is_generation
from ovtrio.serving.model_facts import ModelFacts, model_facts
from ovtrio.serving.service import ModelService

# The Ollama release whose API (api/types.go at v0.33.0-rc2, commit fb30760) these
# routes answer as: clients that check the server's version for a feature find it.
OLLAMA_VERSION = "0.32.15"

# Where Ollama's keep_alive of "forever" puts a model's expiry (its largest duration).
_FOREVER = timedelta(days=365 * 292)


def _timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _served(registry: Any) -> list[ModelService | Encoder]:
    """The models Ollama's clients can use: generation and embedding ones."""
    return [*registry.services, *(e for e in registry.encoders if e.kind == "embedding")]


def _path(model: ModelService | Encoder) -> Any:
    if is_generation(model):
        return model.source.path if model.source is not None else None
    if model.folder is None and model.name == EMBEDDED_EMBEDDER_NAME:
        return embedded_embedder_zip()  # what the embedded embedder's IR is converted from
    return model.folder


def _facts(model: ModelService | Encoder) -> ModelFacts:
    return model_facts(_path(model))


def details(model: ModelService | Encoder, facts: ModelFacts) -> dict[str, Any]:
    family = facts.architecture or ("bert" if not is_generation(model) else "")
    return {
        "parent_model": "",
        "format": facts.format,
        "family": family,
        "families": [family] if family else None,
        "parameter_size": "",
        "quantization_level": "",
    }


def _listed(model: ModelService | Encoder) -> dict[str, Any]:
    facts = _facts(model)
    name = listed_name(model.name)
    return {
        "name": name,
        "model": name,
        "modified_at": _timestamp(facts.modified or time.time()),
        "size": facts.size,
        "digest": facts.digest,
        "details": details(model, facts),
    }


async def tags() -> dict[str, Any]:
    registry = model_registry()
    await registry.rescan()
    return {"models": [_listed(model) for model in _served(registry)]}


def _expires_at(model: Resident, idle_unload: float | None) -> str:
    """When the model's idle unload is due, if no request comes meanwhile (a model in
    use: its keep-alive time from now)."""
    keep = model.keep_alive if model.keep_alive is not None else idle_unload
    if keep is None or keep < 0:
        return (datetime.now(UTC) + _FOREVER).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    now = trio.current_time()
    since = now if model.leases.held or not model.idle else model.last_used
    return _timestamp(time.time() + (since + keep - now))


def _context_length(model: ModelService | Encoder) -> int:
    if is_generation(model):
        serving = model.serving
        if serving is not None:
            return serving.sequence_limit.tokens
        return model.source.context_length if model.source is not None else 0
    return 0


def processes() -> dict[str, Any]:
    registry = model_registry()
    idle_unload = registry.residency.rules.idle_unload
    loaded = [model for model in _served(registry) if model.state == ModelState.LOADED]
    return {
        "models": [
            {
                **{key: value for key, value in _listed(model).items() if key != "modified_at"},
                "expires_at": _expires_at(model, idle_unload),
                "size_vram": 0,
                "context_length": _context_length(model),
            }
            for model in loaded
        ]
    }


def capabilities(model: ModelService | Encoder) -> list[str]:
    """What the model does, as this server knows it (see the module's docstring)."""
    if not is_generation(model):
        return ["embedding"]
    found = ["completion"]
    serving = model.serving
    if serving is not None and serving.tool_parser is not None:
        found.append("tools")
    if serving is not None and serving.reasoning:
        found.append("thinking")
    if (model.source is not None and model.source.vision) or (serving is not None and serving.vision is not None):
        found.append("vision")
    return found


async def show(name: str) -> dict[str, Any]:
    registry = model_registry()
    model = await registry.lookup(name)
    if model is None or not (is_generation(model) or model.kind == "embedding"):
        raise model_not_found(name)
    facts = _facts(model)
    architecture = details(model, facts)["family"] or "unknown"
    info: dict[str, Any] = {"general.architecture": architecture}
    context = _context_length(model)
    if context:
        info[f"{architecture}.context_length"] = context
    reply: dict[str, Any] = {
        "details": details(model, facts),
        "model_info": info,
        "capabilities": capabilities(model),
        "modified_at": _timestamp(facts.modified or time.time()),
    }
    if is_generation(model) and model.serving is not None:
        template = model.serving.prompts.special_tokens().get("chat_template")
        if template:
            reply["template"] = template
    return reply


def version() -> dict[str, str]:
    return {"version": OLLAMA_VERSION}
