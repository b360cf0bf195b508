"""What kind of model a folder holds, and what an encoder needs to know of it.

Besides generation models, a server serves encoders: embedding models (an IR whose
output is `last_hidden_state` [batch, sequence, hidden], which OpenVINO GenAI's
TextEmbeddingPipeline pools) and rerankers (cross-encoders: an output `logits`
[batch, 1] or [batch, labels], read by TextRerankPipeline). The kind is read off the
IR's XML without loading it (its outputs' names and ranks; a causal LM also has
`logits`, but of rank 3 and beside a KV cache), or named in the config file
(`model_kind`). A Whisper model (ovtrio/audio/) has no openvino_model.xml but an encoder
and a decoder IR beside a config that says whisper; a text-to-speech model
(ovtrio/speech/) has those with a postnet and a vocoder IR, beside a config that says
SpeechT5.

How an embedding model pools its hidden states is part of the model, not of the
engine: the engine pools with the first token (CLS) unless told otherwise, so it is
read from the sentence-transformers files the export keeps (`1_Pooling/config.json`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO, Literal
from xml.etree import ElementTree

from ovtrio.files.json_files import read_json_object
from ovtrio.files.regular_files import open_regular
from ovtrio.settings.server import Settings

ModelKind = Literal["generation", "embedding", "rerank", "transcription", "speech"]
Pooling = Literal["CLS", "MEAN", "LAST_TOKEN"]

# Inputs only a causal LM with a KV cache has.
_GENERATION_INPUTS = ("beam_idx", "position_ids", "past_key_values")


def ir_outputs(xml_path: Path) -> tuple[dict[str, int], set[str]]:
    """The IR's output names with their ranks, and its input names, from its XML."""
    with open_regular(xml_path) as xml:
        root = ElementTree.parse(xml).getroot()
    layers = {layer.get("id"): layer for layer in root.iter("layer")}
    inputs: set[str] = set()
    for layer in layers.values():
        if layer.get("type") == "Parameter":
            for port in layer.iter("port"):
                inputs.update(name.strip() for name in (port.get("names") or layer.get("name") or "").split(","))
    results = {layer_id for layer_id, layer in layers.items() if layer.get("type") == "Result"}
    outputs: dict[str, int] = {}
    for edge in root.iter("edge"):
        if edge.get("to-layer") not in results:
            continue
        source = layers.get(edge.get("from-layer"))
        if source is None:
            continue
        for port in source.iter("port"):
            if port.get("id") == edge.get("from-port"):
                for name in (port.get("names") or "").split(","):
                    if name.strip():
                        outputs[name.strip()] = len(port.findall("dim"))
    return outputs, inputs


def has_generation_inputs(xml_path: Path | BinaryIO) -> bool:
    """Whether the IR has an input only a causal LM with a KV cache has, read off its
    first layers: OpenVINO writes the Parameter layers first, so a language model's
    XML, megabytes long, is told after a few kilobytes (why:
    docs/benchmarks.md#reading-the-models-folder). Raises ElementTree.ParseError on XML
    that is not well formed before the answer is found."""
    for _, element in ElementTree.iterparse(xml_path, events=("end",)):
        if element.tag != "layer":
            continue
        if element.get("type") != "Parameter":
            return False
        for port in element.iter("port"):
            names = (port.get("names") or element.get("name") or "").split(",")
            if any(name.strip().startswith(_GENERATION_INPUTS) for name in names):
                return True
        element.clear()
    return False


def detect_kind(path: Path) -> ModelKind:
    """The kind of the model at `path` (a GGUF file or IR folder) from its IR's outputs."""
    xml_path = path / "openvino_model.xml"
    if path.is_dir() and not xml_path.is_file() and is_speech_folder(path):
        return "speech"
    if path.is_dir() and not xml_path.is_file() and is_whisper_folder(path):
        return "transcription"
    if not path.is_dir() or not xml_path.is_file():
        return "generation"
    try:
        with open_regular(xml_path) as xml:
            if has_generation_inputs(xml):
                return "generation"
        outputs, inputs = ir_outputs(xml_path)
    except (OSError, ElementTree.ParseError):
        return "generation"  # the generation loader says what is wrong with it
    if any(name.startswith(_GENERATION_INPUTS) for name in inputs):
        return "generation"
    if "last_hidden_state" in outputs:
        return "embedding"
    if outputs.get("logits") == 2:
        return "rerank"
    return "generation"


def is_whisper_folder(path: Path) -> bool:
    """Whether `path` is a Whisper model exported by optimum: its encoder and decoder IRs
    beside a config that says whisper."""
    if not (path / "openvino_encoder_model.xml").is_file() or not (path / "openvino_decoder_model.xml").is_file():
        return False
    if read_json_object(path / "config.json").get("model_type") == "whisper":
        return True
    return (
        read_json_object(path / "preprocessor_config.json").get("feature_extractor_type") == "WhisperFeatureExtractor"
    )


def is_speech_folder(path: Path) -> bool:
    """Whether `path` is a SpeechT5 text-to-speech model exported by optimum: its decoder
    and vocoder IRs beside a config that says speecht5 (or SpeechT5ForTextToSpeech, which
    OpenVINO GenAI's pipeline reads)."""
    if not (path / "openvino_decoder_model.xml").is_file() or not (path / "openvino_vocoder.xml").is_file():
        return False
    config = read_json_object(path / "config.json")
    architectures = config.get("architectures")
    return config.get("model_type") == "speecht5" or (
        isinstance(architectures, list) and "SpeechT5ForTextToSpeech" in architectures
    )


def model_kind(settings: Settings) -> ModelKind:
    """The kind the settings name, or the one their model's IR shows."""
    if settings.model_kind != "auto":
        return settings.model_kind
    if settings.model is None:
        return "generation"  # the embedded LLM
    return detect_kind(Path(settings.model).expanduser())


def split_by_kind(each_model: Sequence[Settings]) -> tuple[list[Settings], list[tuple[Settings, ModelKind]]]:
    """The generation models, and the encoders with their kind, of the models to serve."""
    generation: list[Settings] = []
    encoders: list[tuple[Settings, ModelKind]] = []
    for settings in each_model:
        kind = model_kind(settings)
        if kind == "generation":
            generation.append(settings)
        else:
            encoders.append((settings, kind))
    return generation, encoders


def pooling_of(folder: Path) -> Pooling:
    """How the sentence-transformers files of `folder` pool: mean, first token or last
    token; CLS (the engine's default, and BERT's) when the folder does not say."""
    config = read_json_object(folder / "1_Pooling" / "config.json")
    if config.get("pooling_mode_mean_tokens"):
        return "MEAN"
    if config.get("pooling_mode_lasttoken"):
        return "LAST_TOKEN"
    return "CLS"


def normalizes(folder: Path) -> bool:
    """Whether the model's vectors are unit length (a Normalize module in modules.json);
    True when the folder does not say: OpenAI's embeddings are, and clients compare them
    with dot products."""
    try:
        with open(folder / "modules.json", encoding="utf-8") as file:
            modules = json.load(file)
    except (OSError, ValueError):
        return True
    if not isinstance(modules, list):
        return True
    return any(isinstance(m, dict) and str(m.get("type", "")).endswith("Normalize") for m in modules)


def max_input_tokens(folder: Path) -> int:
    """The longest input the model takes, in tokens: sentence-transformers' max_seq_length,
    else the tokenizer's model_max_length, else the model's positions."""
    sentence = read_json_object(folder / "sentence_bert_config.json").get("max_seq_length")
    if isinstance(sentence, int) and sentence > 0:
        return sentence
    tokenizer = read_json_object(folder / "tokenizer_config.json").get("model_max_length")
    positions = read_json_object(folder / "config.json").get("max_position_embeddings")
    candidates = [value for value in (tokenizer, positions) if isinstance(value, int) and 0 < value < 1_000_000]
    return min(candidates) if candidates else 512


def served_models(settings: Settings) -> tuple[list[Settings], list[tuple[Settings, ModelKind]]]:
    """The generation models and the encoders of the config file (or of the flags' one
    model); none with a models_dir and neither. Raises SettingsError when no generation
    model is left."""
    from ovtrio.settings.config_file import model_settings
    from ovtrio.settings.server import SettingsError

    if settings.models_dir and settings.model is None and settings.config is None:
        return [], []  # only the folder's models (ovtrio/serving/discovery.py), not the embedded one
    generation, encoders = split_by_kind(model_settings(settings))
    if not generation:
        raise SettingsError(
            "no generation model to serve: every model configured is an embedding, rerank, transcription or speech"
            " model (serve those beside one with --embedding-model, --rerank-model, --transcription-model,"
            " --speech-model or a config file entry)"
        )
    return generation, encoders
