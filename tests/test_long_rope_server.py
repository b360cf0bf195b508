"""A LongRoPE model served for real (ovtrio/model/long_rope.py): its engine prefills a
prompt past the default step budget in one step. A real Phi-3 cannot be made here (no
network, no torch to export one): the model is a tiny llama IR whose config.json says
LongRoPE, so this shows how the engine is set up, not that the rope factors come out
right (transformers' own comparison is in docs/models.md)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import tiny_vlm
from helpers import post
from server_pool import server_fixture

# Phi-3 128k's rope settings, with a context of 2,048 and an original one of 64.
CONFIG = {
    "model_type": "phi3",
    "max_position_embeddings": 2048,
    "original_max_position_embeddings": 64,
    "rope_scaling": {"type": "longrope", "long_factor": [1.0, 1.2], "short_factor": [1.0, 1.0]},
}


def write_long_rope_model(folder: Path) -> None:
    """A tiny llama IR (tiny_vlm.py's random language model, converted by the engine)
    whose config.json says LongRoPE with an original context of 64 tokens: the engine
    computes plain rope, but the server sets it up as for Phi-3."""
    import openvino_genai

    folder.mkdir()
    with tempfile.TemporaryDirectory(prefix="long-rope-") as scratch:
        converted = Path(scratch)
        tiny_vlm.write_language_gguf(converted / "model.gguf")
        openvino_genai.LLMPipeline(str(converted / "model.gguf"), "CPU", enable_save_ov_model=True)
        for name in ("openvino_model", "openvino_tokenizer", "openvino_detokenizer"):
            for suffix in (".xml", ".bin"):
                shutil.copy(converted / (name + suffix), folder / (name + suffix))
    (folder / "config.json").write_text(json.dumps(CONFIG))


# The step budget the server is given, which the engine's is raised past for this model.
STEP_BUDGET = 256
long_rope_server = server_fixture(
    "long_rope_server",
    "--model",
    "{folder}/phi",
    "--served-model-name",
    "phi",
    "--max-num-batched-tokens",
    str(STEP_BUDGET),
    prepare=lambda folder: write_long_rope_model(folder / "phi"),
)


def steps_for(server, prompt: str) -> tuple[int, int]:
    """Engine steps one request of one generated token takes (its prefill), and its
    prompt's tokens."""
    before = server.metric("ovtrio_engine_steps_total", model_name="phi")
    reply = post(server.base_url, "/v1/completions", {"model": "phi", "prompt": prompt, "max_tokens": 1})
    assert reply.status_code == 200, reply.text
    return int(server.metric("ovtrio_engine_steps_total", model_name="phi") - before), reply.json()["usage"][
        "prompt_tokens"
    ]


def test_a_prompt_past_the_engines_default_budget_prefills_in_one_step(long_rope_server):
    short_steps, _ = steps_for(long_rope_server, "Hi")
    long_steps, long_tokens = steps_for(long_rope_server, "word " * 400)
    # Past the original context, and past the configured step budget (256 tokens), which
    # would prefill it in two steps or more.
    assert long_tokens > STEP_BUDGET > 64
    assert long_steps == short_steps
    assert "LongRoPE: prompts longer than 64 tokens are prefilled in one step" in long_rope_server.log_path.read_text()
