"""The Ollama routes' pure logic, in process: the writer's records from output events
(checked against Ollama's Go types, streamed and unary agreeing), the measures it
takes from the scheduler's timings (which the fake-engine scheduler fills, in order),
the options' translation into sampling fields, the model-name rule and the renaming
of errors to the fields the client sent."""

from __future__ import annotations

import pytest

import ollama_schema
from fake_engine import received, request, start_scheduler
from ovtrio.api.errors import APIError, invalid
from ovtrio.api.ollama.names import listed_name
from ovtrio.api.ollama.options import Options
from ovtrio.api.ollama.prepare import ollama_names
from ovtrio.api.ollama.writer import Clock, OllamaWriter, arguments_object
from ovtrio.output import (
    ChoiceFinished,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallArguments,
    ToolCallDone,
    ToolCallStarted,
)
from ovtrio.scheduler import AdmissionLimits, Completed, Failed, RequestTimings

EVENTS = [
    ReasoningDelta(0, "Let me see."),
    TextDelta(0, "It is "),
    TextDelta(0, ""),
    TextDelta(0, "sunny."),
    ToolCallStarted(0, 0, "call_1", "get_weather"),
    ToolCallArguments(0, 0, '{"city": '),
    ToolCallArguments(0, 0, '"Paris"}'),
    ToolCallDone(0, 0, "call_1", "get_weather", '{"city": "Paris"}'),
    ChoiceFinished(0, "tool_calls"),
    Completed(31, 9, RequestTimings(0.010, 0.250, 0.750)),
]


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "generate"])
def test_records_are_ollamas_and_the_unary_reply_is_their_sum(chat):
    path = "/api/chat" if chat else "/api/generate"
    writer = OllamaWriter("m:latest", chat, Clock(load_seconds=0.002))
    records = writer.write(EVENTS[:4]) + writer.write(EVENTS[4:])
    for record in records:
        ollama_schema.check_record(path, record)
    assert [r["done"] for r in records] == [False] * (len(records) - 1) + [True]
    final = records[-1]
    assert final["done_reason"] == "stop"  # a reply that made calls ends as Ollama says: stop
    assert (final["prompt_eval_count"], final["eval_count"]) == (31, 9)
    # The scheduler's timings: the prefill, from its taking the request to the first token;
    # the decoding, from the first token to the last.
    assert final["prompt_eval_duration"] == 240_000_000 and final["eval_duration"] == 500_000_000
    assert final["load_duration"] == 2_000_000
    assert final["total_duration"] > 0
    reply = ollama_schema.check_record(path, writer.reply())
    call = {"id": "call_1", "function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}}
    if chat:
        assert reply["message"] == {
            "role": "assistant",
            "content": "It is sunny.",
            "thinking": "Let me see.",
            "tool_calls": [call],
        }
        streamed = "".join(r["message"]["content"] for r in records)
    else:
        assert (reply["response"], reply["thinking"], reply["tool_calls"]) == ("It is sunny.", "Let me see.", [call])
        streamed = "".join(r["response"] for r in records)
    assert streamed == "It is sunny."
    assert {k: v for k, v in reply.items() if k not in ("message", "response", "thinking", "tool_calls")} == {
        k: v for k, v in final.items() if k not in ("message", "response")
    }


def test_measures_without_a_figure_are_left_out():
    writer = OllamaWriter("m", True, Clock())
    (final,) = writer.write([ChoiceFinished(0, "length"), Completed(4, 1, RequestTimings(0.01, 0.02, 0.02))])
    ollama_schema.check_record("/api/chat", final)
    assert final["done_reason"] == "length" and "eval_duration" not in final  # one token: no decoding time
    (nothing,) = OllamaWriter("m", True, Clock()).write([Completed(4, 0, None)])
    assert "prompt_eval_duration" not in nothing and "eval_count" not in nothing


def test_logprobs_go_with_the_record_of_their_tokens():
    writer = OllamaWriter("m", True, Clock())
    first = [TokenLogprob(b"\xc3", -0.5, "", 7), TokenLogprob(b"\xa9", -0.25, "\u00e9", 8)]
    records = writer.write([TextDelta(0, "\u00e9", first), TextDelta(0, "", [TokenLogprob(b"", -1.0, "", 2)])])
    for record in records:
        ollama_schema.check_record("/api/chat", record)
    assert records[0]["logprobs"] == [
        {"token": "", "logprob": -0.5, "bytes": [0xC3]},
        {"token": "\u00e9", "logprob": -0.25, "bytes": [0xA9]},
    ]
    assert records[1]["message"]["content"] == "" and records[1]["logprobs"][0]["logprob"] == -1.0
    writer.write([ChoiceFinished(0, "length"), Completed(3, 3, None)])
    reply = ollama_schema.check_record("/api/chat", writer.reply())
    assert [entry["logprob"] for entry in reply["logprobs"]] == [-0.5, -0.25, -1.0]
    assert "logprobs" not in OllamaWriter("m", True, Clock()).write([TextDelta(0, "x")])[0]


def test_a_failure_is_an_error_record():
    (record,) = OllamaWriter("m", True, Clock()).write([Failed("the KV cache is full", "out_of_memory")])
    assert ollama_schema.check_record("/api/chat", record) == {"error": "the KV cache is full"}


def test_arguments_are_an_object_even_when_cut_short():
    assert arguments_object('{"city": "Paris"}') == {"city": "Paris"}
    assert arguments_object('{"city": "Pa') == {} and arguments_object("[1]") == {} and arguments_object("") == {}


async def test_the_scheduler_times_each_stage_in_order(nursery):
    engine = await start_scheduler(nursery, AdmissionLimits(max_running_sequences=1, max_queued_requests=1))
    done = (await received(engine.scheduler, request(5)))[-1]
    assert isinstance(done, Completed) and done.completion_tokens == 5
    timings = done.timings
    assert timings is not None and timings.added is not None and timings.first_token is not None
    assert timings.last_token is not None
    assert 0 <= timings.added <= timings.first_token <= timings.last_token
    assert done == Completed(1, 5)  # the timings do not take part in comparisons


def test_options_become_sampling_fields():
    options = Options.model_validate(
        {
            "num_predict": 32,
            "temperature": 0,
            "top_k": 40.0,
            "repeat_penalty": 1.1,
            "seed": -1,
            "stop": ["\n"],
            "num_ctx": 4096,
            "repeat_last_n": 64,
            "typical_p": 1.0,
            "mirostat": 0,
            "unknown_option": "ignored",
        }
    )
    assert options.sampling_fields() == {
        "max_tokens": 32,
        "temperature": 0,
        "top_k": 40,
        "repetition_penalty": 1.1,
        "stop": ["\n"],
    }
    assert "max_tokens" not in Options.model_validate({"num_predict": -1}).sampling_fields()
    assert Options.model_validate({"seed": 7}).sampling_fields() == {"seed": 7}
    for option, value in (("typical_p", 0.7), ("mirostat", 1), ("tfs_z", 0.5), ("penalize_newline", True)):
        with pytest.raises(APIError) as refused:
            Options.model_validate({option: value}).sampling_fields()
        assert refused.value.status == 400 and refused.value.param == f"options.{option}"


def test_the_model_name_rule_lists_ids_with_a_tag():
    assert listed_name("SmolLM2-135M-Instruct") == "SmolLM2-135M-Instruct:latest"
    assert listed_name("qwen3:4b") == "qwen3:4b"


@pytest.mark.parametrize(
    ("error", "prompt_field", "param", "said"),
    [
        (invalid("Invalid value for 'max_tokens': too many. Reduce max_tokens.", "max_tokens"), "messages",
         "options.num_predict", "Invalid value for 'options.num_predict': too many. Reduce options.num_predict."),
        (invalid("Invalid value for 'temperature': less than 2.", "temperature"), "messages",
         "options.temperature", "Invalid value for 'options.temperature': less than 2."),
        (invalid("tool_choice 'required' needs tools.", "tool_choice"), "messages",
         "options.tool_choice", "options.tool_choice 'required' needs tools."),
        (invalid("Invalid value for 'format.json_schema.schema': not a schema", "format.json_schema.schema"),
         "messages", "format", "Invalid value for 'format': not a schema"),
        (invalid("Invalid value for 'messages': too long.", "messages"), "prompt", "prompt",
         "Invalid value for 'prompt': too long."),
        (invalid("Invalid value for 'messages[0].images[0]': no image.", "messages[0].images[0]"), "messages",
         "messages[0].images[0]", "Invalid value for 'messages[0].images[0]': no image."),
    ],
)  # fmt: skip
def test_errors_name_the_fields_the_client_sent(error, prompt_field, param, said):
    renamed = ollama_names(error, prompt_field)
    assert (renamed.status, renamed.param, renamed.message) == (400, param, said)
