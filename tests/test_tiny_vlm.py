"""The tiny VLM fixture (tiny_vlm.py) is what the image tests need: both of the
engine's pipelines load it in VLM mode, images change the output, the same image gives
the same output, and each image adds its tokens to the prompt."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tiny_vlm


@pytest.fixture(scope="session")
def tiny_vlm_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_vlm.build(tmp_path_factory.mktemp("tiny-vlm"))


def image(seed: int):
    import openvino as ov

    return ov.Tensor(np.random.default_rng(seed).integers(0, 256, (48, 64, 3), dtype=np.uint8))


def greedy(pipeline, prompt: str, images: list) -> tuple[list[int], int]:
    import openvino_genai

    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = 6
    config.ignore_eos = True
    result = pipeline.generate(prompt, images=images, generation_config=config)
    return result.texts[0], result.perf_metrics.get_num_input_tokens()


def test_the_fixture_holds_a_vlm_and_no_plain_language_model(tiny_vlm_folder):
    names = {path.name for path in tiny_vlm_folder.iterdir()}
    assert {
        "openvino_language_model.xml",
        "openvino_text_embeddings_model.xml",
        "openvino_vision_embeddings_model.xml",
        "config.json",
        "preprocessor_config.json",
    } <= names
    assert "openvino_model.xml" not in names


def test_images_reach_the_model_and_add_their_tokens(tiny_vlm_folder):
    import openvino_genai

    pipeline = openvino_genai.VLMPipeline(str(tiny_vlm_folder), "CPU")
    first, with_image = greedy(pipeline, "Describe this", [image(1)])
    other, _ = greedy(pipeline, "Describe this", [image(2)])
    again, _ = greedy(pipeline, "Describe this", [image(1)])
    _, text_only = greedy(pipeline, "Describe this", [])
    _, two_images = greedy(pipeline, "Describe this", [image(1), image(2)])
    assert first != other
    assert first == again
    assert with_image - text_only >= tiny_vlm.IMAGE_TOKENS
    assert two_images - with_image >= tiny_vlm.IMAGE_TOKENS


def test_the_continuous_batching_pipeline_takes_images(tiny_vlm_folder):
    import openvino_genai

    pipeline = openvino_genai.ContinuousBatchingPipeline(str(tiny_vlm_folder), openvino_genai.SchedulerConfig(), "CPU")
    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = 6
    config.ignore_eos = True
    outputs = []
    for seed in (1, 2, 1):
        handle = pipeline.add_request(seed, "Describe this", [image(seed)], config)
        while pipeline.has_non_finished_requests():
            pipeline.step()
        outputs.append([list(output.generated_ids) for output in handle.read_all()])
    assert outputs[0] != outputs[1]
    assert outputs[0] == outputs[2]
