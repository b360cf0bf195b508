"""The tiny Whisper fixture (tiny_whisper.py) is what the audio tests need: OpenVINO
GenAI's WhisperPipeline loads it from optimum's layout and runs it, with segment and word
timestamps, in both tasks, and every window's output ends within max_new_tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tiny_whisper


@pytest.fixture(scope="session")
def tiny_whisper_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_whisper.build(tmp_path_factory.mktemp("tiny-whisper"))


@pytest.fixture(scope="module")
def pipeline(tiny_whisper_folder):
    import openvino_genai

    return openvino_genai.WhisperPipeline(str(tiny_whisper_folder), "CPU", word_timestamps=True)


def tone(hertz: float, seconds: float) -> np.ndarray:
    t = np.arange(int(16000 * seconds)) / 16000
    return (0.3 * np.sin(2 * np.pi * hertz * t)).astype(np.float32)


def test_the_fixture_has_optimums_layout(tiny_whisper_folder):
    names = {path.name for path in tiny_whisper_folder.iterdir()}
    assert {
        "openvino_encoder_model.xml",
        "openvino_decoder_model.xml",
        "openvino_tokenizer.xml",
        "openvino_detokenizer.xml",
        "config.json",
        "generation_config.json",
        "preprocessor_config.json",
    } <= names
    assert "openvino_model.xml" not in names


def test_the_decoder_keeps_its_cache_in_state(tiny_whisper_folder):
    import openvino as ov

    model = ov.Core().read_model(tiny_whisper_folder / "openvino_decoder_model.xml")
    assert {port.any_name for port in model.inputs} == {"input_ids", "encoder_hidden_states", "beam_idx"}
    assert [port.any_name for port in model.outputs] == ["logits"]
    assert len(model.get_sinks()) == 2 * tiny_whisper.LAYERS


def test_the_pipeline_transcribes_with_timestamps(pipeline):
    audio = tone(440, 4.5)
    plain = pipeline.generate(audio, return_timestamps=False, word_timestamps=False)
    assert plain.texts[0].strip()
    timed = pipeline.generate(audio, return_timestamps=True, word_timestamps=True)
    assert timed.chunks and timed.words
    for chunk in timed.chunks:
        assert 0 <= chunk.start_ts <= chunk.end_ts <= 4.5
    assert all(0 <= word.start_ts <= word.end_ts <= 4.5 for word in timed.words)
    other = pipeline.generate(tone(1000, 4.5), return_timestamps=False, word_timestamps=False)
    assert other.texts[0] != plain.texts[0], "the audio reaches the decoder"


def test_generation_stops_within_max_new_tokens(pipeline):
    short = pipeline.generate(tone(440, 4.5), max_new_tokens=3, return_timestamps=False, word_timestamps=False)
    assert len(short.texts[0]) <= 3
    translated = pipeline.generate(tone(440, 4.5), language="<|de|>", task="translate", word_timestamps=False)
    assert translated.texts[0].strip()
