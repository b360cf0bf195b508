"""The table of model kinds (ovtrio/serving/kinds.py) covers every kind a model may be,
and the routes it names for each are routes the app serves. Pure logic: the app is built,
not served."""

from __future__ import annotations

from typing import get_args

from ovtrio.embedding.kinds import ModelKind
from ovtrio.serving.kinds import KINDS, is_generation, is_speaker, is_text_encoder, is_transcriber


def test_every_kind_has_one_entry():
    assert set(KINDS) == set(get_args(ModelKind))
    assert all(kind.name == name for name, kind in KINDS.items())
    # Only generation models are run by the registry's ModelService; every other kind
    # is an encoder the table builds and checks.
    assert [name for name, kind in KINDS.items() if kind.build is None] == ["generation"]
    assert all(kind.check is not None for name, kind in KINDS.items() if name != "generation")


def test_each_kinds_routes_are_served_by_the_app():
    from ovtrio.server import app as startup
    from ovtrio.server.body_limit import BodyLimit
    from ovtrio.serving.metrics import ServerMetrics
    from ovtrio.settings.server import Settings

    # create_app's phases but its logging (configured for the process, which would take
    # the log away from the tests that come after).
    settings = Settings()
    served = startup.ServedModels.read(settings)
    metrics = ServerMetrics()
    limit = BodyLimit(settings, {}, vision=False, audio=False)
    registry = startup.build_registry(settings, served, metrics, None, limit)
    app = startup.app_over(registry, settings, metrics, limit, startup.response_store_of(Settings(data_dir=None)))
    posts = {rule.rule for rule in app.url_map.iter_rules() if "POST" in (rule.methods or ())}
    for kind in KINDS.values():
        assert kind.routes and set(kind.routes) <= posts, (kind.name, set(kind.routes) - posts)


def test_the_encoders_built_are_told_apart_by_the_table(tmp_path):
    from ovtrio.serving.kinds import build_encoder
    from ovtrio.settings.server import Settings

    embedder = build_encoder("e", "embedding", Settings(), tmp_path, None)
    reranker = build_encoder("r", "rerank", Settings(), tmp_path, None)
    whisper = build_encoder("w", "transcription", Settings(), tmp_path, None)
    speaker = build_encoder("s", "speech", Settings(), tmp_path, None)
    assert (embedder.kind, reranker.kind, whisper.kind, speaker.kind) == (
        "embedding",
        "rerank",
        "transcription",
        "speech",
    )
    assert is_text_encoder(embedder) and is_text_encoder(reranker) and not is_text_encoder(whisper)
    assert is_transcriber(whisper) and not is_transcriber(embedder) and not is_transcriber(speaker)
    assert is_speaker(speaker) and not any(is_speaker(model) for model in (embedder, reranker, whisper))
    assert not any(is_generation(model) for model in (embedder, reranker, whisper, speaker))
