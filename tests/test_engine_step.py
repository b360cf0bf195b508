"""The GIL-free engine step against the real engine and the embedded model, in-process:
it is verified on this build, it computes what the binding's step computes, and any
doubt (a setting, an object that is not the expected one) gives the binding's step."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

from ovtrio.scheduler.engine_step import choose_step, gil_free_step


@pytest.fixture
def pipeline(embedded_pipeline):
    assert not embedded_pipeline.has_non_finished_requests()
    return embedded_pipeline


def greedy_ids(pipeline, step, prompt: list[int], tokens: int = 12) -> list[int]:
    import openvino as ov
    import openvino_genai

    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = tokens
    config.ignore_eos = True
    handle = pipeline.add_request(7, ov.Tensor(np.asarray([prompt], dtype=np.int64)), config)
    ids: list[int] = []
    while pipeline.has_non_finished_requests():
        step()
        while handle.can_read():
            for output in handle.read().values():
                ids.extend(output.generated_ids)
    return ids


def test_the_gil_free_step_is_verified_on_this_build(pipeline, caplog):
    with caplog.at_level(logging.INFO, logger="ovtrio.scheduler"):
        step = choose_step(pipeline)
    assert step.releases_gil, caplog.text
    assert "release the GIL" in caplog.text
    assert not pipeline.has_non_finished_requests()


def test_both_routes_compute_the_same_tokens(pipeline):
    prompt = pipeline.get_tokenizer().encode("The capital of France is").input_ids.data[0].tolist()
    through_ctypes = greedy_ids(pipeline, gil_free_step(pipeline).run, prompt)
    through_binding = greedy_ids(pipeline, pipeline.step, prompt)
    assert len(through_ctypes) == 12
    assert through_ctypes == through_binding


def test_the_gil_free_step_keeps_its_pipeline_alive(pipeline):
    import sys

    before = sys.getrefcount(pipeline)
    step = gil_free_step(pipeline)
    # The step holds a reference: the C++ object behind its raw address cannot be
    # freed while the step exists.
    assert sys.getrefcount(pipeline) == before + 1
    del step
    assert sys.getrefcount(pipeline) == before


def test_other_python_threads_run_during_a_gil_free_step(pipeline):
    """A thread that needs the GIL makes progress while one long prefill step runs.

    With a step that holds the GIL the loop below gets one pass, two at most, before
    the step takes the GIL until its end; here it keeps running through the step.
    """
    step = gil_free_step(pipeline)
    prompt = list(range(1000, 1800))  # 800 tokens: prefilled in one step
    import openvino as ov
    import openvino_genai

    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = 1
    handle = pipeline.add_request(8, ov.Tensor(np.asarray([prompt], dtype=np.int64)), config)
    inside = threading.Event()
    finished = threading.Event()
    progress_inside = 0

    def run_step() -> None:
        inside.set()
        step.run()
        finished.set()

    worker = threading.Thread(target=run_step)
    worker.start()
    inside.wait()
    while not finished.is_set():
        progress_inside += 1  # bytecode: needs the GIL
        finished.wait(0.0005)
    worker.join()
    while pipeline.has_non_finished_requests():
        pipeline.step()
    del handle
    assert progress_inside >= 3


class NotAPipeline:
    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 12345

    def step(self) -> None:
        pass

    def has_non_finished_requests(self) -> bool:
        return False


def test_an_unexpected_object_falls_back_to_the_binding(caplog):
    stand_in = NotAPipeline()
    with caplog.at_level(logging.WARNING, logger="ovtrio.scheduler"):
        step = choose_step(stand_in)
    assert not step.releases_gil
    assert step.run == stand_in.step
    assert "hold the GIL" in caplog.text


def test_the_setting_turns_it_off(pipeline, caplog):
    with caplog.at_level(logging.INFO, logger="ovtrio.scheduler"):
        step = choose_step(pipeline, gil_free=False)
    assert not step.releases_gil
    assert step.run == pipeline.step
    assert "turned off" in caplog.text
