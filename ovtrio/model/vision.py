"""Vision-language models: recognising their folders, and how many prompt tokens an
image costs.

An `optimum-cli export openvino` folder of a VLM (LLaVA, Qwen2-VL, InternVL, Phi-3.5
vision, Gemma 3, MiniCPM-V, ...) holds the language model as
`openvino_language_model.xml`, beside the text embeddings and vision embeddings
models. OpenVINO GenAI's continuous-batching pipeline switches to VLM mode when it finds
the text embeddings model: it then takes every request as a prompt string plus images
(uint8 HWC RGB tensors), never as token ids, and puts each image's features where the
prompt holds its tag (`<ov_genai_image_N>`, the engine's universal tag, which it turns
into the model's own), or before the text when the prompt has none.

How many tokens an image adds depends on the model. It is measured at load, on the
engine itself: the same prompt with one image and without (warm-up, before the scheduler
starts). For models that give every image the same number of tokens (the LLaVA family
and those that resize to a fixed size) that count is exact; for those that tile or keep
the image's own size (Qwen2-VL, MiniCPM-V, InternVL, Phi-3.5 vision) it holds for an
image of the measured size only, which the startup log says.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ovtrio.files.json_files import read_json_object

LANGUAGE_MODEL = "openvino_language_model.xml"
TEXT_EMBEDDINGS_MODEL = "openvino_text_embeddings_model.xml"
VISION_EMBEDDINGS_MODEL = "openvino_vision_embeddings_model.xml"
VISION_FILES = (LANGUAGE_MODEL, TEXT_EMBEDDINGS_MODEL, VISION_EMBEDDINGS_MODEL)

# The engine's own image tag, in the prompt text: N counts the request's images from 0.
IMAGE_TAG = "<ov_genai_image_{}>"

# Model types whose image token count does not depend on the image (it is resized and
# cropped to one size first).
FIXED_IMAGE_TOKENS = frozenset({"llava", "gemma3"})

# Side of the square image measured at load when the preprocessor names no size.
DEFAULT_PROBE_SIDE = 336


def is_vision_folder(path: Path) -> bool:
    """Whether `path` is a VLM folder: language, text embeddings and vision models."""
    return path.is_dir() and all((path / name).is_file() for name in VISION_FILES)


@dataclass(frozen=True)
class VisionModel:
    """What the server knows of a VLM's images."""

    model_type: str
    tokens_per_image: int  # measured at load (see the module docstring)
    fixed: bool  # every image costs tokens_per_image, whatever its size
    probe_side: int  # the side of the square image that was measured
    # What the model's preprocessor brings images down to, when it says (the server
    # does it first, off the event loop).
    short_side: int | None = None
    max_pixels: int | None = None


def model_type(path: Path) -> str:
    return str(read_json_object(path / "config.json").get("model_type") or "unknown")


def preprocessor_sizes(path: Path) -> tuple[int | None, int | None]:
    """(shortest edge, most pixels) the model's preprocessor resizes images to, where
    its preprocessor_config.json says: CLIP-style `size.shortest_edge` (LLaVA), or
    `max_pixels` (Qwen2-VL)."""
    config = read_json_object(path / "preprocessor_config.json")
    size = config.get("size")
    short = size.get("shortest_edge") if isinstance(size, dict) else None
    most = config.get("max_pixels")
    return (
        short if isinstance(short, int) and short > 0 else None,
        most if isinstance(most, int) and most > 0 else None,
    )


def probe_side(path: Path) -> int:
    """The image size the model's preprocessor resizes to, when it says so."""
    config = read_json_object(path / "preprocessor_config.json")
    crop = config.get("crop_size")
    size = config.get("size")
    for value in (crop, size):
        if isinstance(value, dict):
            for key in ("height", "shortest_edge"):
                if isinstance(value.get(key), int) and value[key] > 0:
                    return int(value[key])
        if isinstance(value, int) and value > 0:
            return value
    return DEFAULT_PROBE_SIDE


def measure_image_tokens(pipeline: Any, path: Path, config: Any, stateful: bool = False) -> VisionModel:
    """Run the same tiny prompt with one grey image and without on `pipeline`, holding
    no request (a continuous-batching pipeline in VLM mode, or with `stateful` a
    VLMPipeline), and return what the image cost. `config` is a GenerationConfig for
    one new token, taking the prompt as it is (no chat template)."""
    import numpy as np
    import openvino as ov

    side = probe_side(path)
    image = ov.Tensor(np.full((side, side, 3), 128, dtype=np.uint8))
    counts = []
    for images in ([], [image]):
        if stateful:
            result = pipeline.generate("Hi", images=images, generation_config=config)
            counts.append(result.perf_metrics.get_num_input_tokens())
            continue
        handle = pipeline.add_request(0, "Hi", images, config)
        while pipeline.has_non_finished_requests():
            pipeline.step()
        handle.read_all()
        counts.append(handle.get_perf_metrics().get_num_input_tokens())
    kind = model_type(path)
    short, most = preprocessor_sizes(path)
    return VisionModel(kind, counts[1] - counts[0], kind in FIXED_IMAGE_TOKENS, side, short, most)
