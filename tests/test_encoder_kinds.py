"""Which models are encoders, and what an encoder folder says of itself: the kind read
off the IR's outputs (the embedded embedder as the server converts it, the test
cross-encoder), or named in the config file; the pooling and the input limit read from
the sentence-transformers files."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from encoder_fixtures import write_reranker
from ovtrio.embedding.embedded import embedded_embedder_folder
from ovtrio.embedding.kinds import (
    detect_kind,
    has_generation_inputs,
    max_input_tokens,
    normalizes,
    pooling_of,
    served_models,
)
from ovtrio.settings.server import Settings, SettingsError


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return embedded_embedder_folder(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_reranker(tmp_path_factory.mktemp("models") / "reranker")


def test_kinds_are_read_off_the_ir(converted: Path, reranker: Path, tmp_path: Path) -> None:
    assert detect_kind(converted) == "embedding"
    assert detect_kind(reranker) == "rerank"
    assert detect_kind(tmp_path) == "generation"  # no IR: the generation loader says what is wrong
    assert detect_kind(tmp_path / "model.gguf") == "generation"


def test_the_converted_embedder_pools_by_mean_over_256_tokens(converted: Path) -> None:
    assert pooling_of(converted) == "MEAN"
    assert normalizes(converted)
    assert max_input_tokens(converted) == 256
    # A second call finds the entry: nothing is converted again.
    modified = (converted / "openvino_model.bin").stat().st_mtime_ns
    assert embedded_embedder_folder(converted.parent.parent) == converted
    assert (converted / "openvino_model.bin").stat().st_mtime_ns == modified


@pytest.mark.parametrize(
    ("pooling", "expected"),
    [({"pooling_mode_cls_token": True}, "CLS"), ({"pooling_mode_lasttoken": True}, "LAST_TOKEN"), (None, "CLS")],
)
def test_pooling_comes_from_the_model(tmp_path: Path, pooling: dict | None, expected: str) -> None:
    if pooling is not None:
        (tmp_path / "1_Pooling").mkdir()
        (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    assert pooling_of(tmp_path) == expected


def test_the_config_file_serves_encoders_beside_generation_models(
    reranker: Path, converted: Path, tmp_path: Path
) -> None:
    config = tmp_path / "models.json"
    config.write_text(
        json.dumps(
            {
                "models": [
                    {"served_model_name": "chat"},
                    {"served_model_name": "vectors", "model": str(converted)},
                    {"served_model_name": "scores", "model": str(reranker), "model_kind": "rerank"},
                ]
            }
        )
    )
    generation, encoders = served_models(Settings(config=str(config)))
    assert [model.served_model_name for model in generation] == ["chat"]
    assert [(model.served_model_name, kind) for model, kind in encoders] == [
        ("vectors", "embedding"),
        ("scores", "rerank"),
    ]
    config.write_text(json.dumps({"models": [{"served_model_name": "vectors", "model": str(converted)}]}))
    with pytest.raises(SettingsError, match="no generation model"):
        served_models(Settings(config=str(config)))


class CountingReader(io.BytesIO):
    """The bytes of an XML, counting how many were read."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.read_bytes = 0

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        self.read_bytes += len(chunk)
        return chunk


def _ir_xml(first_inputs: list[str], layers: int) -> bytes:
    parameters = "".join(
        f'<layer id="{i}" name="{name}" type="Parameter"><output><port id="0" names="{name}"/></output></layer>'
        for i, name in enumerate(first_inputs)
    )
    body = "".join(
        f'<layer id="{i}" name="add_{i}" type="Add"><output><port id="0"/></output></layer>'
        for i in range(len(first_inputs), len(first_inputs) + layers)
    )
    return f'<?xml version="1.0"?><net name="m" version="11"><layers>{parameters}{body}</layers></net>'.encode()


def test_a_language_models_ir_is_told_by_its_first_layers() -> None:
    """A language model's XML is megabytes; its KV-cache inputs come first, and the
    listing of a models folder reads no further."""
    language_model = CountingReader(_ir_xml(["input_ids", "attention_mask", "beam_idx"], layers=50_000))
    assert has_generation_inputs(language_model)
    assert language_model.read_bytes < 100_000 < len(language_model.getvalue())
    encoder = CountingReader(_ir_xml(["input_ids", "attention_mask"], layers=100))
    assert not has_generation_inputs(encoder)
