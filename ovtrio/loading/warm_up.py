"""Warming a loaded model up: one tiny request, so that the first client does not pay
for the engine's first compilation of its kernels, and, on the continuous-batching
pipeline, a reading of its KV cache's size, which the engine does not report otherwise."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ovtrio.loading.speculation import apply_defaults

if TYPE_CHECKING:
    from ovtrio.loading.load import LoadedModel


def warm_up(model: LoadedModel) -> int:
    """Run one tiny request and return the KV cache capacity in tokens.

    The first request pays for the engine's first compilation of its kernels (see
    docs/benchmarks.md#loading-a-model), so a warm-up spares the first client that.
    While it holds exactly one cache block, the engine's cache usage (a percentage) also
    tells how many blocks the cache has, which the engine does not report otherwise.
    """
    import openvino_genai

    from ovtrio.engine.tensors import prompt_tensor
    from ovtrio.loading.load import block_tokens  # load.py imports this module

    config = apply_defaults(openvino_genai.GenerationConfig(), model.speculation)
    config.max_new_tokens = 2
    if model.source.vision:  # in VLM mode the engine takes prompts as text only
        config.apply_chat_template = False
        handle = model.pipeline.add_request(0, "Hi there, hello", [], config)
    else:
        # The first run compiles the kernels (seconds): through generate(), which lets go
        # of the GIL, where a step() would hold it throughout and pause the event loop
        # of a server that serves other models meanwhile. The steps below then take
        # milliseconds.
        model.pipeline.generate([prompt_tensor([0] * 4)], [config])
        handle = model.pipeline.add_request(0, prompt_tensor([0] * 4), config)
    model.pipeline.step()
    usage = model.pipeline.get_metrics().cache_usage
    while model.pipeline.has_non_finished_requests():
        model.pipeline.step()
    del handle
    blocks = round(100.0 / usage) if usage > 0 else 0
    return blocks * block_tokens(model.device)


def warm_up_stateful(model: LoadedModel) -> int:
    """Run one tiny generation on the stateful pipeline, for the same reason as warm_up;
    0: it has no paged KV cache whose size would matter."""
    import openvino_genai

    from ovtrio.engine.tensors import prompt_tensor

    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = 2
    config.do_sample = False
    if model.source.vision:
        config.apply_chat_template = False
        model.pipeline.generate("Hi there, hello", images=[], generation_config=config)
    else:
        model.pipeline.generate(prompt_tensor([0] * 4), config)
    return 0
