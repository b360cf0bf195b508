"""The model families' tool-call and reasoning formats through a real server: each
family's own chat template (tests/data/templates) renders the conversation, and the
engine writes what that family writes, scripted (tests/scripted_server.py: the real
server and tokenizer, an engine that replays text). The official SDK's tool loop (call,
`tool` message, answer) runs over every family, and the Agents SDK's Runner completes a
tool call on gpt-oss's harmony format."""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import loopback
from conftest import RunningServer, free_port, stop_server, wait_until_ready
from ovtrio.model.source import embedded_model_path
from special_tokens_model import HARMONY_TOKENS, build

TEMPLATES = Path(__file__).parent / "data" / "templates"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ANSWER = "It is sunny in Paris."


def harmony(*messages: str) -> str:
    return "".join(messages)


# family: (template, expected tool-call format, the call as the family writes it, the
# answer after the tool's result as it writes it, the reasoning it shows before the call)
FAMILIES: dict[str, tuple[str, str | None, str, str, str]] = {
    "gpt-oss": (
        "openai-gpt-oss-120b.jinja",
        "harmony",
        "<|channel|>analysis<|message|>Need the weather tool.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city": "Paris"}<|call|>',
        "<|channel|>analysis<|message|>The tool says sunny.<|end|>"
        f"<|start|>assistant<|channel|>final<|message|>{ANSWER}<|return|>",
        "Need the weather tool.",
    ),
    # The prompt ends with "<|start|>assistant": a call as the reply's first message goes
    # on with that header, its recipient before the channel, as the template renders calls.
    "harmony-call-first": (
        "openai-gpt-oss-120b.jinja",
        "harmony",
        ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>',
        f"<|channel|>final<|message|>{ANSWER}<|return|>",
        "",
    ),
    "qwen3-coder": (
        "Qwen3-Coder.jinja",
        "qwen3_coder",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
        ANSWER,
        "",
    ),
    "qwen3": (
        "Qwen-Qwen3-0.6B.jinja",
        "hermes",
        "<think>\nNeed the weather tool.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        f"<think>\nThe tool says sunny.\n</think>\n\n{ANSWER}",
        "\nNeed the weather tool.\n",
    ),
    "phi4-mini": (
        "microsoft-Phi-4-mini-instruct.jinja",
        "phi4_mini",
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|/tool_call|>',
        ANSWER,
        "",
    ),
    "llama3.2": (
        "meta-llama-Llama-3.2-3B-Instruct.jinja",
        "llama3_json",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        ANSWER,
        "",
    ),
    "llama4": (
        "vllm-llama4-pythonic.jinja",
        "pythonic",
        '<|python_start|>[get_weather(city="Paris")]<|python_end|>',
        ANSWER,
        "",
    ),
    "gemma3": ("vllm-gemma3-pythonic-minja.jinja", "pythonic", "[get_weather(city='Paris')]", ANSWER, ""),
    "mistral-small-3.2": (
        "mistralai-Mistral-Small-3.2-24B-Instruct-2506.jinja",
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        ANSWER,
        "",
    ),
}
# DeepSeek-R1's distills: the template opens <think> in the prompt.
R1 = "deepseek-r1"
R1_REPLY = "The user greets me.\n</think>\n\nHello!"
EFFORT_REPLY = "<|channel|>final<|message|>EFFORT-HIGH"


# Replies that write the format out of place, as the families do (openai/harmony's,
# OVMS's and vLLM's own tests): (served model, reply, content, reasoning, calls). A request
# whose question is OUT-OF-PLACE-<key> gets the reply.
PARIS = '{"city": "Paris"}'
OUT_OF_PLACE: dict[str, tuple[str, str, str, str, list[tuple[str, Any]]]] = {
    "harmony-text-before-the-first-header": (
        "gpt-oss",
        "... Let's use the tool.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json"
        f"<|message|>{PARIS}<|call|>",
        "... Let's use the tool.",
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    "harmony-header-without-message": (
        "gpt-oss",
        "<|channel|>analysis I must refuse<|end|><|start|>assistant<|channel|>analysis<|message|>We must refuse"
        "<|end|><|start|>assistant<|channel|>final<|message|>I'm sorry, but I can't help with that.<|return|>",
        "I'm sorry, but I can't help with that.",
        "I must refuseWe must refuse",
        [],
    ),
    "llama3-python-tag-after-text": (
        "llama3.2",
        "This is a content part and next will be a tool call."
        f'<|python_tag|>{{"name": "get_weather", "parameters": {PARIS}}}',
        "This is a content part and next will be a tool call.",
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    "llama3-calls-after-text": (
        "llama3.2",
        f'Here are the results: {{"name": "get_weather", "parameters": {PARIS}}}; '
        '{"name": "get_weather", "parameters": {"city": "Rome"}} Would you like to know more? {"name": "Bob"}',
        'Here are the results:  Would you like to know more? {"name": "Bob"}',
        "",
        [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})],
    ),
}


def question(family: str) -> str:
    return f"QUESTION-{family}: what is the weather in Paris?"


def result(family: str) -> str:
    return f"RESULT-{family}: sunny, 22 C"


def script() -> list[dict[str, str]]:
    rules = [{"when": f"QUESTION-{name}", "reply": call} for name, (_, _, call, _, _) in FAMILIES.items()]
    rules += [{"when": f"RESULT-{name}", "reply": answer} for name, (_, _, _, answer, _) in FAMILIES.items()]
    rules += [{"when": f"QUESTION-{R1}", "reply": R1_REPLY}, {"when": "Reasoning: high", "reply": EFFORT_REPLY}]
    rules += [{"when": f"OUT-OF-PLACE-{key}", "reply": reply} for key, (_, reply, *_) in OUT_OF_PLACE.items()]
    return rules


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    folder = tmp_path_factory.mktemp("scripted")
    # The engine runs no model (its replies are scripted): a small KV cache each.
    small = {"model": str(embedded_model_path()), "num_kv_blocks": 64}
    models = [
        {"served_model_name": name, **small, "chat_template": str(TEMPLATES / template)}
        for name, (template, *_) in FAMILIES.items()
    ]
    r1_template = str(TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")
    models.append({"served_model_name": R1, **small, "chat_template": r1_template})
    gemma = str(TEMPLATES / "vllm-gemma3-pythonic.jinja")
    models.append({"served_model_name": "gemma3-unchanged", **small, "chat_template": gemma})
    (folder / "models.json").write_text(json.dumps({"models": models}))
    (folder / "script.json").write_text(json.dumps(script()))
    server = launch_scripted(folder, "--config", str(folder / "models.json"))
    try:
        yield server
    finally:
        stop_server(server)


def launch_scripted(folder: Path, *args: str) -> RunningServer:
    """scripted_server.py serving with `args`, its script in folder/script.json."""
    port = free_port()
    log_path = folder / f"server-{port}.log"
    command = [
        sys.executable,
        str(Path(__file__).parent / "scripted_server.py"),
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-enable-prefix-caching",
        *args,
    ]
    env = {**os.environ, "OVTRIO_TEST_SCRIPT": str(folder / "script.json")}
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    return wait_until_ready(RunningServer(f"http://127.0.0.1:{port}", process, log_path))


# Families whose markers are special tokens in their own vocabularies (which the server
# leaves out of replies unless a format's reader asks for them), and those tokens.
SPECIAL_TOKENS = {
    "gpt-oss": HARMONY_TOKENS,
    "mistral-small-3.2": (
        "[TOOL_CALLS]",
        "[ARGS]",
        "[CALL_ID]",
        "[INST]",
        "[/INST]",
        "[SYSTEM_PROMPT]",
        "[/SYSTEM_PROMPT]",
        "[AVAILABLE_TOOLS]",
        "[/AVAILABLE_TOOLS]",
        "[TOOL_RESULTS]",
        "[/TOOL_RESULTS]",
    ),
    "phi4-mini": ("<|tool_call|>", "<|/tool_call|>", "<|tool|>", "<|/tool|>", "<|system|>", "<|user|>", "<|end|>"),
    "llama4": ("<|python_start|>", "<|python_end|>", "<|header_start|>", "<|header_end|>", "<|eot|>"),
}


@pytest.fixture(scope="module")
def special_tokens(scripted: RunningServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The families of SPECIAL_TOKENS, each with its template over a tokenizer whose
    vocabulary has its special tokens (special_tokens_model.py), scripted as `scripted`
    is. It needs the embedded model converted into the model cache, which `scripted` has
    done."""
    folder = tmp_path_factory.mktemp("special-tokens")
    models = []
    for family, tokens in SPECIAL_TOKENS.items():
        template = (TEMPLATES / FAMILIES[family][0]).read_text()
        build(folder / family, tokens, template)
        models.append({"served_model_name": family, "model": str(folder / family), "num_kv_blocks": 64})
    (folder / "models.json").write_text(json.dumps({"models": models}))
    (folder / "script.json").write_text(json.dumps(script()))
    server = launch_scripted(folder, "--config", str(folder / "models.json"))
    try:
        yield server
    finally:
        stop_server(server)


def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)


def test_each_family_gets_its_format_by_its_template(scripted):
    cards = {card["id"]: card for card in loopback.get(scripted.base_url + "/v1/models").json()["data"]}
    for name, (_, expected, *_) in FAMILIES.items():
        chosen = cards[name]["chat_format"]
        assert chosen["tool_calls"] == expected, name
        assert chosen["chosen_by"].startswith("the chat template writes "), chosen
    assert cards["gpt-oss"]["chat_format"]["reasoning"] == "harmony"
    assert cards["qwen3"]["chat_format"]["reasoning"] == "think"
    assert cards[R1]["chat_format"]["reasoning"] == "think"
    assert "the tool calls are read in the harmony format" not in scripted.log_path.read_text()
    assert "tool calls are read in the harmony format, reasoning in the harmony format" in scripted.log_path.read_text()


@pytest.mark.parametrize("family", FAMILIES)
def test_the_sdk_tool_loop_runs_over_each_family(scripted, family):
    tool_loop(scripted, family)


def tool_loop(server: RunningServer, family: str) -> None:
    """Call, `tool` message, answer, with the official SDK."""
    _, _, _, _, reasoning = FAMILIES[family]
    sdk = client(server)
    messages: list[Any] = [{"role": "user", "content": question(family)}]
    first = sdk.chat.completions.create(model=family, messages=messages, tools=[WEATHER_TOOL], max_tokens=300)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert calls and [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert not choice.message.content
    assert (getattr(choice.message, "reasoning_content", None) or "") == reasoning
    messages.append(choice.message.model_dump(exclude_none=True, exclude={"reasoning", "reasoning_content"}))
    messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": result(family)})
    second = sdk.chat.completions.create(model=family, messages=messages, tools=[WEATHER_TOOL], max_tokens=300)
    assert second.choices[0].message.content == ANSWER
    assert second.choices[0].finish_reason == "stop"
    assert not second.choices[0].message.tool_calls


@pytest.mark.parametrize("family", FAMILIES)
def test_streamed_calls_are_the_unary_ones(scripted, family):
    sdk = client(scripted)
    request: dict[str, Any] = {
        "model": family,
        "messages": [{"role": "user", "content": question(family)}],
        "tools": [WEATHER_TOOL],
        "max_tokens": 300,
    }
    unary = sdk.chat.completions.create(**request).choices[0]
    calls: dict[int, list[str]] = {}
    content = reasoning = ""
    finish = None
    for chunk in sdk.chat.completions.create(**request, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += getattr(delta, "reasoning_content", None) or ""
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, ["", ""])
            if call.function.name:
                entry[0] = call.function.name
            entry[1] += call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == unary.finish_reason == "tool_calls"
    assert [tuple(calls[i]) for i in sorted(calls)] == [
        (c.function.name, c.function.arguments) for c in unary.message.tool_calls or []
    ]
    assert content == (unary.message.content or "")
    assert reasoning == (getattr(unary.message, "reasoning_content", None) or "")


@pytest.mark.parametrize("key", OUT_OF_PLACE)
def test_a_format_written_out_of_place_reads_as_its_own_parsers_read_it(scripted, key):
    """No marker reaches the client, text that is not a call stays content, and the
    stream adds up to the unary reply."""
    model, _, content, reasoning, calls = OUT_OF_PLACE[key]
    sdk = client(scripted)
    request: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": f"OUT-OF-PLACE-{key}: go"}],
        "tools": [WEATHER_TOOL],
        "max_tokens": 300,
    }
    unary = sdk.chat.completions.create(**request).choices[0]
    assert unary.finish_reason == ("tool_calls" if calls else "stop")
    assert (unary.message.content or "") == content
    assert (getattr(unary.message, "reasoning_content", None) or "") == reasoning
    got = [(c.function.name, json.loads(c.function.arguments)) for c in unary.message.tool_calls or []]
    assert got == calls
    streamed = {"content": "", "reasoning": ""}
    arguments: dict[int, list[str]] = {}
    for chunk in sdk.chat.completions.create(**request, stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is None:
            continue
        streamed["content"] += delta.content or ""
        streamed["reasoning"] += getattr(delta, "reasoning_content", None) or ""
        for call in delta.tool_calls or []:
            entry = arguments.setdefault(call.index, ["", ""])
            entry[0] += call.function.name or ""
            entry[1] += call.function.arguments or ""
    assert streamed == {"content": content, "reasoning": reasoning}
    assert [tuple(arguments[i]) for i in sorted(arguments)] == [
        (c.function.name, c.function.arguments) for c in unary.message.tool_calls or []
    ]


@pytest.mark.parametrize("max_tokens", [3, 12, 20, 25])
def test_a_harmony_call_cut_off_by_max_tokens_streams_like_unary(scripted, max_tokens):
    body = {
        "model": "gpt-oss",
        "messages": [{"role": "user", "content": question("gpt-oss")}],
        "tools": [WEATHER_TOOL],
        "max_tokens": max_tokens,
    }
    unary = loopback.post(scripted.base_url + "/v1/chat/completions", json=body).json()["choices"][0]
    assert unary["finish_reason"] == "length"
    message = unary["message"]
    streamed = {"content": "", "reasoning_content": "", "arguments": ""}
    with loopback.stream("POST", scripted.base_url + "/v1/chat/completions", json={**body, "stream": True}) as reply:
        for line in reply.iter_lines():
            if not line.startswith("data: {"):
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"]
            streamed["content"] += delta.get("content") or ""
            streamed["reasoning_content"] += delta.get("reasoning_content") or ""
            streamed["arguments"] += "".join(c["function"].get("arguments", "") for c in delta.get("tool_calls") or [])
    assert streamed["content"] == (message["content"] or "")
    assert streamed["reasoning_content"] == message.get("reasoning_content", "")
    assert streamed["arguments"] == "".join(c["function"]["arguments"] for c in message.get("tool_calls") or [])
    # Nothing written is lost: what the reply carries is the scripted text, less its markup.
    written = message.get("reasoning_content", "") + (message["content"] or "") + streamed["arguments"]
    assert written and all(piece in FAMILIES["gpt-oss"][2] for piece in written.split("<|"))


def test_reasoning_opened_by_the_template_goes_to_reasoning_content(scripted):
    reply = client(scripted).chat.completions.create(
        model=R1, messages=[{"role": "user", "content": f"QUESTION-{R1}: hello"}], max_tokens=100
    )
    message = reply.choices[0].message
    assert message.content == "Hello!"
    assert getattr(message, "reasoning_content", None) == "The user greets me.\n"


def test_harmony_reasoning_effort_reaches_the_system_message(scripted):
    sdk = client(scripted)
    messages = [{"role": "user", "content": "Say something."}]
    high = sdk.chat.completions.create(model="gpt-oss", messages=messages, reasoning_effort="high", max_tokens=50)
    low = sdk.chat.completions.create(model="gpt-oss", messages=messages, reasoning_effort="low", max_tokens=50)
    # The script answers "EFFORT-HIGH" only to a prompt that says "Reasoning: high".
    assert high.choices[0].message.content == "EFFORT-HIGH"
    assert low.choices[0].message.content == ""
    rendered = render(scripted, "gpt-oss", messages, chat_template_kwargs={"reasoning_effort": "low"})
    assert "Reasoning: low" in rendered


def render(server: RunningServer, model: str, messages: list[Any], **fields: Any) -> str:
    tokens = loopback.post(server.base_url + "/tokenize", json={"model": model, "messages": messages, **fields}).json()[
        "tokens"
    ]
    return loopback.post(server.base_url + "/detokenize", json={"model": model, "tokens": tokens}).json()["prompt"]


def test_harmony_renders_tools_and_tool_results_as_its_template_expects(scripted):
    messages = [
        {"role": "user", "content": question("gpt-oss")},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": result("gpt-oss")},
    ]
    rendered = render(scripted, "gpt-oss", messages, tools=[WEATHER_TOOL])
    assert "namespace functions" in rendered and "type get_weather = " in rendered
    call = '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>'
    answer = "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
    answer += json.dumps(result("gpt-oss"))
    assert call in rendered and answer in rendered
    assert rendered.endswith("<|start|>assistant")


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "tool_choice"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"response_format": {"type": "json_object"}, "skip_special_tokens": False}, "response_format"),
    ],
)
def test_constraints_on_harmony_are_refused(scripted, fields, param):
    body = {"model": "gpt-oss", "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER_TOOL], **fields}
    reply = loopback.post(scripted.base_url + "/v1/chat/completions", json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and "harmony" in error["message"]
    text = {"model": "gpt-oss", "input": "hi", "text": {"format": {"type": "json_object"}}}
    reply = loopback.post(scripted.base_url + "/v1/responses", json=text)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "text.format"


def test_harmony_in_responses_and_messages(scripted):
    tool = {"type": "function", **WEATHER_TOOL["function"]}
    body = {"model": "gpt-oss", "input": question("gpt-oss"), "tools": [tool], "max_output_tokens": 300}
    output = loopback.post(scripted.base_url + "/v1/responses", json=body).json()["output"]
    assert [item["type"] for item in output] == ["reasoning", "function_call"]
    assert output[0]["summary"][0]["text"] == "Need the weather tool."
    assert (output[1]["name"], json.loads(output[1]["arguments"])) == ("get_weather", {"city": "Paris"})
    follow = {
        "model": "gpt-oss",
        "input": [
            {"role": "user", "content": question("gpt-oss")},
            output[1],
            {"type": "function_call_output", "call_id": output[1]["call_id"], "output": result("gpt-oss")},
        ],
        "tools": [tool],
        "max_output_tokens": 300,
    }
    answer = loopback.post(scripted.base_url + "/v1/responses", json=follow).json()["output"]
    assert [item["type"] for item in answer] == ["reasoning", "message"]
    assert answer[1]["content"][0]["text"] == ANSWER

    claude_tool = {"name": "get_weather", "input_schema": WEATHER_TOOL["function"]["parameters"]}
    messages = {
        "model": "gpt-oss",
        "max_tokens": 300,
        "messages": [{"role": "user", "content": question("gpt-oss")}],
        "tools": [claude_tool],
    }
    reply = loopback.post(scripted.base_url + "/v1/messages", json=messages).json()
    assert [block["type"] for block in reply["content"]] == ["thinking", "tool_use"]
    assert reply["content"][0]["thinking"] == "Need the weather tool."
    assert reply["content"][1]["input"] == {"city": "Paris"} and reply["stop_reason"] == "tool_use"


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
def test_the_agents_runner_completes_a_tool_call_on_harmony(scripted, api):
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    seen: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        seen.append(city)
        return result("gpt-oss")

    sdk = openai.AsyncOpenAI(base_url=scripted.base_url + "/v1", api_key="none", max_retries=0)
    if api == "responses":
        model: Any = agents.OpenAIResponsesModel(model="gpt-oss", openai_client=sdk)
    else:
        model = agents.OpenAIChatCompletionsModel(model="gpt-oss", openai_client=sdk)
    agent = agents.Agent(name="weather", instructions="Answer with the tool.", model=model, tools=[get_weather])
    # In a thread of its own: a browser test's sync Playwright can leave an asyncio loop
    # marked running in this one, where run_sync refuses to start.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        outcome = pool.submit(agents.Runner.run_sync, agent, question("gpt-oss")).result(timeout=120)
    assert seen == ["Paris"]
    assert outcome.final_output == ANSWER


def test_a_template_the_engine_cannot_render_is_a_clear_400(scripted):
    body = {"model": "gemma3-unchanged", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    reply = loopback.post(scripted.base_url + "/v1/chat/completions", json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "messages"
    assert "Undefined test: 'undefined' at row 20" in error["message"]
    assert ".cpp" not in error["message"] and "/home" not in error["message"]


def test_the_scripted_engine_is_what_answers(scripted):
    """The fixture's honesty: an unscripted prompt gets an empty reply."""
    reply = httpx.post(
        scripted.base_url + "/v1/chat/completions",
        json={"model": "qwen3", "messages": [{"role": "user", "content": "unscripted"}], "max_tokens": 20},
        timeout=30,
    ).json()
    assert reply["choices"][0]["message"]["content"] == ""


def test_harmony_streams_in_responses_and_messages_add_up_to_unary(scripted):
    from messages_stream import check_message, parse_named_sse, walk
    from openai_schema import validate

    tool = {"type": "function", **WEATHER_TOOL["function"]}
    body = {"model": "gpt-oss", "input": question("gpt-oss"), "tools": [tool], "max_output_tokens": 300}
    unary = loopback.post(scripted.base_url + "/v1/responses", json=body).json()
    with loopback.stream("POST", scripted.base_url + "/v1/responses", json={**body, "stream": True}) as reply:
        raw = reply.read().decode()
    events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
    for event in events:
        validate(event, "ResponseStreamEvent")
    final = events[-1]
    assert final["type"] == "response.completed"

    def without_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in items]

    assert without_ids(final["response"]["output"]) == without_ids(unary["output"])
    reasoning = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_summary_text.delta")
    arguments = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert reasoning == "Need the weather tool." and json.loads(arguments) == {"city": "Paris"}

    claude_tool = {"name": "get_weather", "input_schema": WEATHER_TOOL["function"]["parameters"]}
    messages = {
        "model": "gpt-oss",
        "max_tokens": 300,
        "messages": [{"role": "user", "content": question("gpt-oss")}],
        "tools": [claude_tool],
    }
    unary_message = loopback.post(scripted.base_url + "/v1/messages", json=messages).json()
    with loopback.stream("POST", scripted.base_url + "/v1/messages", json={**messages, "stream": True}) as reply:
        streamed = walk(parse_named_sse(reply.read().decode()))
    check_message(streamed)
    assert [b["type"] for b in streamed["content"]] == [b["type"] for b in unary_message["content"]]
    assert streamed["content"][0]["thinking"] == unary_message["content"][0]["thinking"]
    assert streamed["content"][1]["input"] == unary_message["content"][1]["input"] == {"city": "Paris"}
    assert streamed["stop_reason"] == "tool_use"


@pytest.mark.parametrize("family", SPECIAL_TOKENS)
def test_families_with_their_special_tokens(special_tokens, family):
    """The family's markers are control tokens here, which the server leaves out of
    replies: its reader still sees them, and the reply reads as with text markers,
    unary, streamed and over the tool loop."""
    marker_ids = loopback.post(
        special_tokens.base_url + "/tokenize", json={"model": family, "prompt": "".join(SPECIAL_TOKENS[family])}
    ).json()
    assert marker_ids["count"] == len(SPECIAL_TOKENS[family])  # one token each
    tool_loop(special_tokens, family)
    sdk = client(special_tokens)
    request: dict[str, Any] = {
        "model": family,
        "messages": [{"role": "user", "content": question(family)}],
        "tools": [WEATHER_TOOL],
        "max_tokens": 300,
    }
    unary = sdk.chat.completions.create(**request).choices[0].message
    arguments = ""
    for chunk in sdk.chat.completions.create(**request, stream=True):
        for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            arguments += call.function.arguments or ""
    assert unary.tool_calls and arguments == unary.tool_calls[0].function.arguments
    raw = sdk.chat.completions.create(**request, extra_body={"skip_special_tokens": False})
    assert raw.choices[0].message.content == FAMILIES[family][2]  # no reader: the text as written
