"""GET /v1/models, /v3/models and /v1/models/{id} in OpenAI's list format: every served
model, loaded or still loading."""

from __future__ import annotations

from typing import Any

from quart import Blueprint

from ovtrio.api.context import model_registry, model_service
from ovtrio.audio.service import TranscriptionService
from ovtrio.embedding.service import EncoderService
from ovtrio.serving.service import ModelService

blueprint = Blueprint("models", __name__)


def _model_card(service: ModelService) -> dict[str, Any]:
    card = {"id": service.model_name, "object": "model", "created": int(service.started_at), "owned_by": "ovtrio"}
    # What the model reads (as OpenRouter and the playground read it): a vision-language
    # model takes images too.
    vision = service.source is not None and service.source.vision
    card["input_modalities"] = ["text", "image"] if vision else ["text"]
    card["kind"] = "generation"
    # How its replies are read: the tool-call and reasoning formats, and what chose them.
    serving = service.serving
    if serving is not None:
        card["chat_format"] = serving.chat_format.describe()
    return card


def _encoder_card(encoder: EncoderService | TranscriptionService) -> dict[str, Any]:
    # `kind` says which routes serve the model (generation, embedding, rerank,
    # transcription): a client finds the audio model by it.
    return {
        "id": encoder.name,
        "object": "model",
        "created": int(encoder.started_at),
        "owned_by": "ovtrio",
        "input_modalities": ["audio"] if encoder.kind == "transcription" else ["text"],
        "kind": encoder.kind,
    }


@blueprint.get("/v1/models")
@blueprint.get("/v3/models")
async def list_models() -> Any:
    registry = model_registry()
    cards = [_model_card(service) for service in registry.services]
    return {"object": "list", "data": cards + [_encoder_card(encoder) for encoder in registry.encoders]}


@blueprint.get("/v1/models/<path:model_id>")
@blueprint.get("/v3/models/<path:model_id>")
async def retrieve_model(model_id: str) -> Any:
    for encoder in model_registry().encoders:
        if encoder.name == model_id:
            return _encoder_card(encoder)
    return _model_card(model_service(model_id))
