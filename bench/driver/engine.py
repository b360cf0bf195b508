"""The engine alone, on the load's prompts: the limit a server is measured against."""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.driver.requests import prompts


class RawEngine:
    """ContinuousBatchingPipeline.generate() on the same chat prompts and settings as
    requests.load() (greedy, ignore_eos), with no HTTP."""

    def __init__(self, model_path: str, tokens: int, pipeline: Any = None) -> None:
        """The embedded model's own pipeline, or `pipeline` (one the server built)."""
        import openvino_genai

        if pipeline is None:
            config = openvino_genai.SchedulerConfig()
            config.cache_size = 1
            config.enable_prefix_caching = True
            pipeline = openvino_genai.ContinuousBatchingPipeline(model_path, config, "CPU")
        self.pipe = pipeline
        self.tokenizer = self.pipe.get_tokenizer()
        self.gen = openvino_genai.GenerationConfig()
        self.gen.max_new_tokens = tokens
        self.gen.ignore_eos = True
        self.gen.do_sample = False
        self.tokens = tokens
        self.pipe.generate([self.chat_ids("Hello")], [self.gen])  # warm-up

    def chat_ids(self, text: str):
        prompt = self.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        return self.tokenizer.encode(prompt, add_special_tokens=False).input_ids

    def throughput(self, concurrency: int) -> float:
        """Output tok/s of generate() on `concurrency` prompts at once."""
        inputs = [self.chat_ids(p) for p in prompts(concurrency)]
        started = time.perf_counter()
        self.pipe.generate(inputs, [self.gen] * concurrency)
        return concurrency * self.tokens / (time.perf_counter() - started)

    def ttft_ms(self) -> float:
        """Median first step (the prefill) of a lone chat request."""
        first_steps = []
        for i, text in enumerate(prompts(10)):
            handle = self.pipe.add_request(10_000 + i, self.chat_ids(text), self.gen)
            started = time.perf_counter()
            self.pipe.step()
            first_steps.append(time.perf_counter() - started)
            handle.cancel()
            while self.pipe.has_non_finished_requests():
                self.pipe.step()
        return statistics.median(first_steps) * 1e3
