"""The reason an engine exception gives, as clients and logs read it: what went wrong
(with the failed check it follows), never the paths the engine was built from, whatever
shape the message has (OpenVINO's nested "Exception from" lines, GenAI's failed checks,
a logger's "[time] path:line:" prefix)."""

from __future__ import annotations

import pytest

from ovtrio.engine.errors import client_reason

GENAI_CHECK = (
    "Check 'prompt_ids.get_size() < max_context' failed at "
    "/home/jenkins/agent/workspace/private-ci/ie/build-linux/b/repos/openvino.genai/src/cpp/src/"
    "continuous_batching/pipeline_impl.cpp:616:\n"
    "Prompt is longer than the model's context\n"
)
NESTED = (
    "Exception from src/inference/src/cpp/infer_request.cpp:223:\n"
    "Exception from src/plugins/intel_cpu/src/node.cpp:812:\n"
    "Check 'shape.rank().is_static()' failed at src/core/src/shape_util.cpp:91:\n"
    "Unsupported dynamic rank of input 0\n"
    "\n"
)


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (GENAI_CHECK, "Prompt is longer than the model's context (Check 'prompt_ids.get_size() < max_context' failed)"),
        (NESTED, "Unsupported dynamic rank of input 0 (Check 'shape.rank().is_static()' failed)"),
        ("Exception from src/inference/src/cpp/core.cpp:109:\nModel file not found\n", "Model file not found"),
        (
            "[2026-11-27 10:00:00.123] /build/genai/src/cpp/src/sampler.cpp:45: stop token id is out of range",
            "stop token id is out of range",
        ),
        ("Check 'false' failed at C:\\jenkins\\ws\\src\\core\\a.cpp:5:\n", "Check 'false' failed"),
        ("Exception from src/a.cpp:1:\nUnsupported dtype\nsee /opt/b/x.hpp:12 for details", "Unsupported dtype"),
        ("stoul", "stoul"),
    ],
)
def test_the_reason_is_kept_and_build_paths_are_dropped(message, reason):
    assert client_reason(RuntimeError(message)) == reason


@pytest.mark.parametrize("message", ["", "\n\n", "Exception from src/inference/src/cpp/core.cpp:223:\n"])
def test_a_message_that_says_nothing_gives_the_exception_type(message):
    assert client_reason(IndexError(message)) == "IndexError"


def test_no_line_of_any_shape_keeps_a_source_path():
    for message in (GENAI_CHECK, NESTED):
        for start in range(len(message.splitlines())):
            text = "\n".join(message.splitlines()[start:])
            assert ".cpp" not in client_reason(RuntimeError(text)), text
