"""GET /v1/models, /v3/models and /v1/models/{id} in OpenAI's list format: every served
model, loaded or not, each with its state as llama-server's router lists it
(`status.value`: unloaded, loading, loaded, failed with the reason, unloading); and
POST /models/load and /models/unload, the router's routes to load and unload a model by
hand (ovtrio/serving/residency.py), a generation model or an encoder (embedding,
rerank, transcription). The list looks in --models-dir again first, so a
model copied in since shows up."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from quart import Blueprint
from werkzeug.routing import PathConverter

from ovtrio.api.context import model_registry, model_service, ready_model
from ovtrio.api.errors import APIError, model_not_found, shutting_down
from ovtrio.api.generation import parse_body
from ovtrio.constraints.check import structured_output_missing
from ovtrio.serving.kinds import KINDS, Encoder, is_generation
from ovtrio.serving.residency import Busy
from ovtrio.serving.service import ModelService, ServingModel

blueprint = Blueprint("models", __name__)


class ModelIdConverter(PathConverter):
    """A model id in a path: any text, slashes included (a config file may name a model
    "org/model") and newlines too (a file name may hold one; werkzeug's path converter
    stops at it)."""

    regex = "[^/](?s:.*?)"


@blueprint.record_once
def _add_converter(state: Any) -> None:  # before the routes below are added
    state.app.url_map.converters["model_id"] = ModelIdConverter


def _status(service: ModelService) -> dict[str, Any]:
    state = service.state
    status: dict[str, Any] = {"value": state}
    if state == "failed":
        status["failed"] = True
        status["reason"] = service.failure
    if service.load_seconds is not None:
        status["load_seconds"] = round(service.load_seconds, 3)
    return status


def _model_card(service: ModelService) -> dict[str, Any]:
    card = {"id": service.model_name, "object": "model", "created": int(service.started_at), "owned_by": "ovtrio"}
    # What the model reads (as OpenRouter and the playground read it): a vision-language
    # model takes images too.
    vision = service.source is not None and service.source.vision
    card["input_modalities"] = ["text", "image"] if vision else ["text"]
    card["kind"] = "generation"
    card["status"] = _status(service)
    # How its replies are read: the tool-call and reasoning formats, and what chose them.
    serving = service.serving
    if serving is not None:
        card["chat_format"] = serving.chat_format.describe()
    card["structured_output"] = _structured_output(serving)
    return card


def _structured_output(serving: ServingModel | None) -> dict[str, Any]:
    """Whether the model's output can be constrained (response_format json_schema or
    json_object, forced tool calls: tool_choice required or named), and why not: a
    client can tell before it sends one that would be refused."""
    missing = structured_output_missing()
    if missing is None and serving is not None and not serving.capabilities.structured_output:
        missing = "this server's stateful engine backend does not constrain output"
    return {"available": False, "reason": missing} if missing is not None else {"available": True}


def _encoder_status(encoder: Encoder) -> dict[str, Any]:
    status: dict[str, Any] = {"value": encoder.state}
    if encoder.failure:
        status.update(failed=True, reason=encoder.failure)
    if encoder.load_seconds is not None:
        status["load_seconds"] = round(encoder.load_seconds, 3)
    return status


def _encoder_card(encoder: Encoder) -> dict[str, Any]:
    # `kind` says which routes serve the model (generation, embedding, rerank,
    # transcription): a client finds the audio model by it.
    status = _encoder_status(encoder)
    return {
        "id": encoder.name,
        "object": "model",
        "created": int(encoder.started_at),
        "owned_by": "ovtrio",
        "input_modalities": list(KINDS[encoder.kind].input_modalities),
        "kind": encoder.kind,
        "status": status,
    }


@blueprint.get("/v1/models")
@blueprint.get("/v3/models")
@blueprint.get("/models")
async def list_models() -> Any:
    registry = model_registry()
    await registry.rescan()
    cards = [_model_card(service) for service in registry.services]
    return {"object": "list", "data": cards + [_encoder_card(encoder) for encoder in registry.encoders]}


@blueprint.get("/v1/models/<model_id:model_id>")
@blueprint.get("/v3/models/<model_id:model_id>")
async def retrieve_model(model_id: str) -> Any:
    model = await _named(model_id)
    return _model_card(model) if is_generation(model) else _encoder_card(model)


async def _named(name: str) -> ModelService | Encoder:
    """The model served as `name`, of whatever kind; a 404 if there is none."""
    model = await model_registry().lookup(name)
    if model is None:
        raise model_not_found(name)
    return model


class LoadRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    model: str


class UnloadRequest(LoadRequest):
    # False: refuse (409) while the model runs requests, instead of letting them finish.
    drain: bool = True


@blueprint.post("/models/load")
async def load_model() -> Any:
    """Load the model (wait for it) unless it is loaded; as a request naming it would,
    whether or not the server loads models on demand."""
    body = await parse_body(LoadRequest)
    model = await _named(body.model)
    registry = model_registry()
    if not is_generation(model):
        if registry.shutdown.draining.is_set():
            raise shutting_down()
        refused = await model.settled()
        if refused is not None:
            raise APIError(503, str(refused), code="model_unavailable", retry_after=refused.retry_after)
        if model.failure is not None:
            raise APIError(
                503,
                f"The model '{model.name}' failed to load: {model.failure}",
                code="model_unavailable",
                retry_after=model.retry_after,
            )
        return {"success": True, "model": model.name, "status": _encoder_status(model)}
    service = await model_service(body.model)
    if registry.shutdown.draining.is_set():
        if service.state != "loaded":  # no load begins during the drain
            raise shutting_down()
        return {"success": True, "model": service.model_name, "status": _status(service)}
    if service.state in ("unloaded", "failed"):
        await registry.residency.load(service)
    await ready_model(body.model)
    return {"success": True, "model": service.model_name, "status": _status(service)}


@blueprint.post("/models/unload")
async def unload_model() -> Any:
    """Unload the model: its requests finish first (up to the drain timeout), or with
    `"drain": false` the unload is refused while it runs any."""
    body = await parse_body(UnloadRequest)
    registry = model_registry()
    encoder = await _named(body.model)
    if not is_generation(encoder):
        if encoder.state == "loading":  # as a generation model's: its load ends, then it unloads
            await encoder.settled()
        if encoder.state == "failed":
            encoder.unload()  # forgets the failure: the next request tries again
        elif encoder.state in ("loaded", "unloading") and not await registry.residency.unload_encoder(
            encoder, "request", drain=body.drain
        ):
            raise APIError(
                409,
                f"The model '{encoder.name}' is computing requests. Retry once they end, or unload with \"drain\":"
                " true to let them finish first.",
                param="drain",
                code="model_busy",
            )
        return {"success": True, "model": encoder.name, "status": _encoder_status(encoder), "ended_requests": 0}
    service = await model_service(body.model)
    try:
        cut = await model_registry().residency.unload(service, "request", wait=body.drain)
    except Busy as exc:
        raise APIError(
            409,
            f'{exc} Retry once they end, or unload with "drain": true to let them finish first.',
            param="drain",
            code="model_busy",
        ) from None
    return {"success": True, "model": service.model_name, "status": _status(service), "ended_requests": cut}
