"""The tool-call and reasoning formats of the model families (gpt-oss's harmony,
Qwen3-Coder's XML, Phi-4-mini, pythonic Llama 3.2/4 and Gemma 3, Mistral's newer
`[TOOL_CALLS]name[ARGS]`), pure logic: each fed output shaped as the family writes it
(after its own documentation and chat template), whole and split everywhere (every
character, every two-piece split, random splits), with 1, 2 and 3 calls, content before
and after, and a call cut off by max_tokens; and each family's chat template recognised
by its markers."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from ovtrio.parsing import (
    PARSERS,
    HarmonyParser,
    HermesToolParser,
    JsonToolCallsParser,
    Llama3JsonToolParser,
    MistralToolParser,
    ParsedDelta,
    Phi4MiniToolParser,
    PythonicToolParser,
    Qwen3CoderToolParser,
    ReasoningSplitter,
    ToolCallParser,
    guess_format,
)
from splitting import splittings

TEMPLATES = Path(__file__).parent / "data" / "templates"

Args = dict[str, Any]
WEATHER: Args = {"city": "Paris", "unit": "celsius"}
TIME: Args = {"timezone": "Europe/Paris"}
SEARCH: Args = {"query": 'say "hi" {ok} [x]', "limit": 3, "exact": True, "tags": ["a", "b"], "none": None}
CALLS = [("get_weather", WEATHER), ("get_time", TIME), ("search", SEARCH)]


@dataclass
class Sample:
    id: str
    parser: Callable[[], ToolCallParser]
    text: str
    content: str
    calls: list[tuple[str, Args | str]] = field(default_factory=list)  # str: arguments cut off, as written
    reasoning: str = ""


# --- How each family writes its calls ---------------------------------------------------


def harmony_call(name: str, args: Args) -> str:
    header = f"<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>"
    return header + json.dumps(args) + "<|call|>"


HARMONY_THINKING = "<|channel|>analysis<|message|>The user asks for the weather; I should call get_weather.<|end|>"
HARMONY_REASONING = "The user asks for the weather; I should call get_weather."


def qwen3_coder_call(name: str, args: Args) -> str:
    def text(value: Any) -> str:
        return value if isinstance(value, str) else json.dumps(value)

    params = "".join(f"<parameter={key}>\n{text(value)}\n</parameter>\n" for key, value in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def phi4_calls(calls: list[tuple[str, Args]]) -> str:
    return "<|tool_call|>" + json.dumps([{"name": n, "arguments": a} for n, a in calls]) + "<|/tool_call|>"


def python_literal(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(python_literal(v) for v in value) + "]"
    if value is None or isinstance(value, bool):
        return repr(value)
    return json.dumps(value)


def pythonic_calls(calls: list[tuple[str, Args]]) -> str:
    def call(name: str, args: Args) -> str:
        return name + "(" + ", ".join(f"{key}={python_literal(value)}" for key, value in args.items()) + ")"

    return "[" + ", ".join(call(name, args) for name, args in calls) + "]"


def mistral_call(name: str, args: Args) -> str:
    return f"[TOOL_CALLS]{name}[ARGS]{json.dumps(args)}"


def counted(n: int) -> list[tuple[str, Args]]:
    return CALLS[:n]


SAMPLES: list[Sample] = []
for n in (1, 2, 3):
    calls = counted(n)
    SAMPLES += [
        Sample(
            f"harmony-{n}",
            HarmonyParser,
            HARMONY_THINKING + "".join(harmony_call(*c) for c in calls),
            "",
            list(calls),
            HARMONY_REASONING,
        ),
        Sample(
            f"qwen3_coder-{n}", Qwen3CoderToolParser, "\n".join(qwen3_coder_call(*c) for c in calls), "", list(calls)
        ),
        Sample(f"phi4_mini-{n}", Phi4MiniToolParser, phi4_calls(calls), "", list(calls)),
        Sample(f"pythonic-{n}", PythonicToolParser, pythonic_calls(calls), "", list(calls)),
        Sample(f"mistral_args-{n}", MistralToolParser, "".join(mistral_call(*c) for c in calls), "", list(calls)),
    ]

BEFORE = "Let me look that up.\n\n"
AFTER = "\n\nI will tell you once I know."
SAMPLES += [
    # Content around the calls
    Sample(
        "harmony-preamble-and-final",
        HarmonyParser,
        HARMONY_THINKING
        + "<|start|>assistant<|channel|>commentary<|message|>Checking the weather now.<|end|>"
        + harmony_call("get_weather", WEATHER)
        + "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris.<|return|>",
        "Checking the weather now.It is sunny in Paris.",
        [("get_weather", WEATHER)],
        HARMONY_REASONING,
    ),
    Sample(
        "harmony-answer",
        HarmonyParser,
        "<|channel|>analysis<|message|>Simple greeting.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?",
        "Hello! How can I help?",
        [],
        "Simple greeting.",
    ),
    Sample(
        "harmony-recipient-before-channel",
        HarmonyParser,
        HARMONY_THINKING
        + "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
        + '{"city": "Paris", "unit": "celsius"}<|call|>',
        "",
        [("get_weather", WEATHER)],
        HARMONY_REASONING,
    ),
    Sample(
        # The prompt ends with "<|start|>assistant": a call as the reply's first message
        # goes on with that header, as the template renders past calls.
        "harmony-recipient-in-the-prompt's-header",
        HarmonyParser,
        " to=functions.get_weather<|channel|>commentary json<|message|>"
        + '{"city": "Paris", "unit": "celsius"}<|call|>',
        "",
        [("get_weather", WEATHER)],
    ),
    Sample(
        "harmony-cut-in-the-prompt's-header",
        HarmonyParser,
        " to=functions.get_weather<|channel|>commentary json",
        "",
    ),
    Sample(
        "harmony-text-starting-with-to=",
        HarmonyParser,
        "to=do: nothing, no header here.",
        "to=do: nothing, no header here.",
    ),
    Sample(
        "harmony-call-without-a-name",  # no call to show: its arguments are content
        HarmonyParser,
        '<|channel|>commentary to=functions. <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
        '{"city": "Paris"}',
    ),
    Sample(
        "harmony-builtin-tool-is-reasoning",
        HarmonyParser,
        '<|channel|>analysis to=browser.search code<|message|>{"query": "paris"}<|call|>',
        "",
        [],
        '{"query": "paris"}',
    ),
    Sample(
        "harmony-cut-in-arguments",
        HarmonyParser,
        HARMONY_THINKING
        + '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Pa',
        "",
        [("get_weather", '{"city": "Pa')],
        HARMONY_REASONING,
    ),
    Sample(
        # A header the output ends in began no message: no text of it, no marker.
        "harmony-cut-in-header",
        HarmonyParser,
        HARMONY_THINKING + "<|start|>assistant<|channel|>commentary to=functions.get_wea",
        "",
        [],
        HARMONY_REASONING,
    ),
    Sample(
        "harmony-cut-in-reasoning",
        HarmonyParser,
        "<|channel|>analysis<|message|>Let me think about",
        "",
        [],
        "Let me think about",
    ),
    Sample(
        "harmony-plain-text",
        HarmonyParser,
        "No channels at all.",
        "No channels at all.",
    ),
    # Markers where they have no place are dropped, and the text on both sides read on.
    Sample(
        "harmony-stray-markers",
        HarmonyParser,
        "Hi<|end|> there<|message|>!<|constrain|><|call|><|channel|>final<|message|>A<|message|>B<|constrain|>C",
        "Hi there!ABC",
    ),
    Sample(
        "harmony-header-ended-by-the-next-header",
        HarmonyParser,
        "<|channel|>analysis Refusing. <|start|>assistant<|channel|>final<|message|>No.",
        "No.",
        [],
        "Refusing.",
    ),
    Sample(
        "harmony-header-without-message-keeps-no-marker",
        HarmonyParser,
        "<|start|>assistant<|channel|>commentary <|constrain|>json tail<|end|>",
        "json tail",
    ),
    Sample(
        # Longer than any header: read as the message's text from there, streamed.
        "harmony-header-too-long",
        HarmonyParser,
        "<|channel|>analysis "
        + "word " * 150
        + "<|constrain|>end<|end|><|start|>assistant<|channel|>final<|message|>Done.",
        "Done.",
        [],
        ("word " * 150).strip() + " end",
    ),
    Sample(
        "harmony-header-too-long-on-content",
        HarmonyParser,
        "<|start|>assistant<|channel|>final " + "x" * 520 + "<|channel|>final<|message|>!",
        "x" * 520 + "!",
    ),
]

# openai/harmony's own parser tests (tests/test_harmony.py, src/tests.rs and test-data/),
# as its non-strict parser reads them: the reply follows the prompt's <|start|>assistant.
HARMONY_SORRY = "<|start|>assistant<|channel|>final<|message|>I'm sorry, but I can't help with that.<|return|>"
SAMPLES += [
    Sample(
        "harmony-own-missing-message-token",  # text before any header is a message of its own
        HarmonyParser,
        "I must refuse<|end|><|start|>assistant<|channel|>analysis<|message|>We must refuse<|end|>" + HARMONY_SORRY,
        "I must refuseI'm sorry, but I can't help with that.",
        [],
        "We must refuse",
    ),
    Sample(
        "harmony-own-missing-message-token-other-initial-headers",
        HarmonyParser,
        "<|channel|>analysis I must refuse<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>We must refuse<|end|>" + HARMONY_SORRY,
        "I'm sorry, but I can't help with that.",
        [],
        "I must refuseWe must refuse",
    ),
    Sample(
        "harmony-own-missing-message-token-tool-call",
        HarmonyParser,
        "... Let's use the tool.<|end|>"
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json"
        '<|message|>{"location": "Tokyo"}<|call|>',
        "... Let's use the tool.",
        [("get_weather", {"location": "Tokyo"})],
    ),
    Sample(
        "harmony-own-missing-message-token-non-strict",
        HarmonyParser,
        "<|channel|>commentary Hello<|end|>",
        "Hello",
    ),
    Sample(
        "harmony-own-simple-reasoning-response",
        HarmonyParser,
        '<|channel|>analysis<|message|>User asks: "What is 2 + 2?" Simple arithmetic. Provide answer.<|return|>'
        "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.",
        "2 + 2 = 4.",
        [],
        'User asks: "What is 2 + 2?" Simple arithmetic. Provide answer.',
    ),
    Sample(
        # Addressed to a tool that is not a function: the model's own business.
        "harmony-own-simple-tool-call",
        HarmonyParser,
        '<|channel|>analysis<|message|>User asks: "What is the weather in Tokyo?" We need to use lookup_weather tool.'
        '<|return|><|start|>assistant to=lookup_weather<|channel|>analysis code<|message|>{"location": "Tokyo"}',
        "",
        [],
        'User asks: "What is the weather in Tokyo?" We need to use lookup_weather tool.{"location": "Tokyo"}',
    ),
    Sample(
        "harmony-own-tool-call-with-constrain-tokenized-correctly",
        HarmonyParser,
        "<|start|>assistant to=functions.get_weather<|channel|>commentary"
        ' <|constrain|>json<|message|>{"location": "Tokyo"}<|call|>',
        "",
        [("get_weather", {"location": "Tokyo"})],
    ),
    Sample(
        "harmony-own-tool-call-with-constrain-marker-adjacent",
        HarmonyParser,
        "<|start|>assistant to=functions.get_weather<|channel|>commentary"
        '<|constrain|>json<|message|>{"location": "Tokyo"}<|end|>',
        "",
        [("get_weather", {"location": "Tokyo"})],
    ),
    Sample(
        "harmony-own-tool-call-with-channel-before-recipient-and-constrain-adjacent",
        HarmonyParser,
        "<|start|>assistant<|channel|>commentary to=functions.get_weather"
        '<|constrain|>json<|message|>{"latitude":48.8566,"longitude":2.3522}<|call|>',
        "",
        [("get_weather", {"latitude": 48.8566, "longitude": 2.3522})],
    ),
    Sample(
        "harmony-own-streamable-parser",  # a browser call, and the browser's answer, in the reply
        HarmonyParser,
        '<|channel|>analysis<|message|>User asks "Who is the current US president?" Let\'s browse to confirm.<|end|>'
        '<|start|>assistant<|channel|>commentary to=browser.search code<|message|>{"query": "current US president", '
        '"topn": 10, "source": "news"}<|call|><|start|>browser.search to=assistant<|channel|>commentary<|message|>'
        '{"result": "https://openai.com/"}<|end|>',
        "",
        [],
        'User asks "Who is the current US president?" Let\'s browse to confirm.'
        '{"query": "current US president", "topn": 10, "source": "news"}{"result": "https://openai.com/"}',
    ),
]
SAMPLES += [
    Sample(
        "qwen3_coder-content-around",
        Qwen3CoderToolParser,
        BEFORE + qwen3_coder_call("get_weather", WEATHER) + AFTER,
        BEFORE + AFTER,
        [("get_weather", WEATHER)],
    ),
    Sample(
        "qwen3_coder-without-tool_call-tag",
        Qwen3CoderToolParser,
        "<function=get_time>\n<parameter=timezone>\nEurope/Paris\n</parameter>\n</function>",
        "",
        [("get_time", TIME)],
    ),
    Sample(
        "qwen3_coder-multiline-value",
        Qwen3CoderToolParser,
        "<tool_call>\n<function=write_file>\n<parameter=path>\na.py\n</parameter>\n"
        "<parameter=content>\ndef f():\n    return 1\n</parameter>\n</function>\n</tool_call>",
        "",
        [("write_file", {"path": "a.py", "content": "def f():\n    return 1"})],
    ),
    Sample(
        "qwen3_coder-cut-in-value",
        Qwen3CoderToolParser,
        "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\ncel",
        "Sure.\n",
        [("get_weather", {"city": "Paris", "unit": "cel"})],
    ),
    Sample(
        "qwen3_coder-cut-in-name",
        Qwen3CoderToolParser,
        "Sure.\n<tool_call>\n<function=get_wea",
        "Sure.\n<tool_call>\n<function=get_wea",
    ),
    Sample(
        "qwen3_coder-name-broken-by-a-newline",  # a name is one line, however it arrives
        Qwen3CoderToolParser,
        "<tool_call>\n<function=\nget_time>\n</function>\n</tool_call>",
        "<tool_call>\n<function=\nget_time>\n</function>\n</tool_call>",
    ),
    Sample(
        "qwen3_coder-name-too-long",
        Qwen3CoderToolParser,
        "<function=" + "f" * 300 + "></function>",
        "<function=" + "f" * 300 + "></function>",
    ),
    Sample(
        "qwen3_coder-not-xml",
        Qwen3CoderToolParser,
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
    ),
    Sample(
        "phi4_mini-content-around",
        Phi4MiniToolParser,
        BEFORE + phi4_calls([("get_weather", WEATHER)]) + AFTER,
        BEFORE + AFTER,
        [("get_weather", WEATHER)],
    ),
    Sample(
        "phi4_mini-one-object-per-tag",  # as its own template renders past calls
        Phi4MiniToolParser,
        '<|tool_call|>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}<|/tool_call|>'
        '<|tool_call|>{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}<|/tool_call|>',
        "",
        [("get_weather", WEATHER), ("get_time", TIME)],
    ),
    Sample(
        "phi4_mini-empty-list",  # no calls, and no tag left over
        Phi4MiniToolParser,
        "<|tool_call|>[]<|/tool_call|>Nothing to call.",
        "Nothing to call.",
    ),
    Sample(
        "phi4_mini-functools",
        Phi4MiniToolParser,
        'functools[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]',
        "",
        [("get_weather", WEATHER)],
    ),
    Sample(
        "phi4_mini-cut",
        Phi4MiniToolParser,
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Par',
        "",
        [("get_weather", '{"city": "Par')],
    ),
    Sample(
        "phi4_mini-cut-before-name",
        Phi4MiniToolParser,
        'Sure.<|tool_call|>[{"na',
        'Sure.<|tool_call|>[{"na',
    ),
    Sample(
        "pythonic-llama4-tags-and-content-after",
        PythonicToolParser,
        "<|python_start|>[get_weather(city='Paris', unit='celsius')]<|python_end|>" + AFTER,
        AFTER,
        [("get_weather", WEATHER)],
    ),
    Sample(
        "pythonic-content-before-is-content",  # the list must come first
        PythonicToolParser,
        BEFORE + pythonic_calls([("get_weather", WEATHER)]),
        BEFORE + pythonic_calls([("get_weather", WEATHER)]),
    ),
    Sample(
        "pythonic-plain-list",
        PythonicToolParser,
        "[1, 2, 3] are the numbers.",
        "[1, 2, 3] are the numbers.",
    ),
    Sample(
        "pythonic-cut-in-value",
        PythonicToolParser,
        "[get_weather(city='Paris', unit='cel",
        "",
        [("get_weather", {"city": "Paris", "unit": "'cel"})],
    ),
    Sample(
        "pythonic-cut-in-name",
        PythonicToolParser,
        "[get_wea",
        "[get_wea",
    ),
    Sample(
        "pythonic-not-a-literal",  # a variable: the call ends, the rest is content
        PythonicToolParser,
        "[get_weather(city=paris_name)]",
        "city=paris_name)]",
        [("get_weather", {})],
    ),
    Sample(
        "mistral_args-content-around",
        MistralToolParser,
        BEFORE + mistral_call("get_weather", WEATHER) + AFTER,
        BEFORE + AFTER,
        [("get_weather", WEATHER)],
    ),
    Sample(
        "mistral_args-call-id",  # as Mistral Small 3.2's template renders past calls
        MistralToolParser,
        '[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris", "unit": "celsius"}'
        '[TOOL_CALLS]get_time[CALL_ID]Zz9Yy8Xx7[ARGS]{"timezone": "Europe/Paris"}',
        "",
        [("get_weather", WEATHER), ("get_time", TIME)],
    ),
    Sample(
        "mistral_args-cut-in-call-id",
        MistralToolParser,
        "Sure.[TOOL_CALLS]get_weather[CALL_ID]a1B2",
        "Sure.[TOOL_CALLS]get_weather[CALL_ID]a1B2",
    ),
    Sample(
        "mistral_args-cut",
        MistralToolParser,
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Pa',
        "",
        [("get_weather", '{"city": "Pa')],
    ),
]


def run(make: Callable[[], ToolCallParser], pieces: list[str]) -> tuple[str, str, list[tuple[str, str]], Any]:
    """Content, reasoning and calls (name, arguments) from the deltas, checked to be
    well-formed OpenAI tool-call deltas."""
    parser = make()
    deltas: list[ParsedDelta] = [parser.feed(piece) for piece in pieces] + [parser.finish()]
    calls: list[list[str]] = []
    for delta in deltas:
        for call in delta.tool_calls:
            if call.index == len(calls):
                assert call.id and call.name, call
                calls.append([call.name, call.arguments])
            else:
                assert call.index < len(calls) and call.id is None and call.name is None and call.arguments
                calls[call.index][1] += call.arguments
    content = "".join(d.content for d in deltas)
    reasoning = "".join(d.reasoning for d in deltas)
    return content, reasoning, [(n, a) for n, a in calls], parser


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.id)
def test_whole_output(sample: Sample) -> None:
    content, reasoning, calls, parser = run(sample.parser, [sample.text])
    assert (content, reasoning) == (sample.content, sample.reasoning)
    assert [name for name, _ in calls] == [name for name, _ in sample.calls]
    for (_, arguments), (_, expected) in zip(calls, sample.calls):
        assert arguments == expected if isinstance(expected, str) else json.loads(arguments) == expected
    assert [(c.name, c.arguments) for c in parser.calls] == calls


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.id)
def test_split_anywhere_gives_the_whole_result(sample: Sample) -> None:
    whole = run(sample.parser, [sample.text])[:3]
    for pieces in splittings(sample.text):
        assert run(sample.parser, pieces)[:3] == whole, pieces


def test_qwen3_coder_types_values_by_the_tools_schema() -> None:
    text = qwen3_coder_call("f", {"code": "42", "count": 7, "flag": True})
    schema = {"f": {"type": "object", "properties": {"code": {"type": "string"}, "count": {"type": "integer"}}}}
    _, calls = Qwen3CoderToolParser.for_request(schema)().parse(text)
    assert json.loads(calls[0].arguments) == {"code": "42", "count": 7, "flag": True}
    _, calls = Qwen3CoderToolParser().parse(text)  # without a schema, "42" reads as a number
    assert json.loads(calls[0].arguments) == {"code": 42, "count": 7, "flag": True}


def test_qwen3_coder_reads_python_booleans_where_the_schema_wants_a_boolean() -> None:
    # A coder writes Python: True and False, as vLLM reads them too.
    text = qwen3_coder_call("f", {"flag": "True", "other": "FALSE", "name": "True"})
    schema = {"f": {"properties": {"flag": {"type": "boolean"}, "other": {"type": ["boolean", "null"]}}}}
    _, calls = Qwen3CoderToolParser.for_request(schema)().parse(text)
    assert json.loads(calls[0].arguments) == {"flag": True, "other": False, "name": "True"}


def strict_json(text: str) -> Any:
    """JSON as a client's parser reads it: NaN and Infinity are not JSON."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


NUMBERS_NOT_JSON: Args = {"a": "NaN", "b": "Infinity", "c": "-Infinity", "d": "1e999", "e": "[1, NaN]"}


@pytest.mark.parametrize(
    "make, text, content, expected",
    [
        (Qwen3CoderToolParser, qwen3_coder_call("f", NUMBERS_NOT_JSON), "", NUMBERS_NOT_JSON),
        (
            Qwen3CoderToolParser.for_request({"f": {"properties": {"a": {"type": "number"}, "d": {"type": "number"}}}}),
            qwen3_coder_call("f", NUMBERS_NOT_JSON),
            "",
            NUMBERS_NOT_JSON,
        ),
        # A literal with no JSON form ends the calls, as any argument that does not read.
        (PythonicToolParser, "[f(a=1, b=1e999, c=2)]", "b=1e999, c=2)]", {"a": 1}),
    ],
)
def test_arguments_are_json_without_nan_or_infinity(make, text: str, content: str, expected: Args) -> None:
    assert run(make, [text])[0] == content
    (call,) = make().parse(text)[1]
    assert strict_json(call.arguments) == expected


def test_qwen3_coder_streams_each_parameter_as_it_closes() -> None:
    parser = Qwen3CoderToolParser()
    first = parser.feed("<tool_call>\n<function=get_weather>\n<parameter=city>\nPa")
    assert [(d.name, d.arguments) for d in first.tool_calls] == [("get_weather", "{")]
    second = parser.feed("ris\n</parameter>\n<parameter=unit>")
    assert [d.arguments for d in second.tool_calls] == ['"city": "Paris"']


def test_harmony_streams_reasoning_and_arguments_as_they_come() -> None:
    parser = HarmonyParser()
    assert parser.feed("<|channel|>analysis<|message|>Thinking ab").reasoning == "Thinking ab"
    assert parser.feed("out it<|end|><|start|>assistant<|chan").reasoning == "out it"
    started = parser.feed('nel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"ci')
    assert [(d.name, d.arguments) for d in started.tool_calls] == [("get_weather", '{"ci')]
    assert [d.arguments for d in parser.feed('ty": "Paris"} ').tool_calls] == ['ty": "Paris"}']


HARMONY_MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|call|>", "<|return|>")


@pytest.mark.parametrize("sample", [s for s in SAMPLES if s.parser is HarmonyParser], ids=lambda s: s.id)
def test_no_harmony_marker_reaches_the_client(sample: Sample) -> None:
    for pieces in [[sample.text], *splittings(sample.text)[:: max(1, len(sample.text) // 40)]]:
        content, reasoning, calls, _ = run(sample.parser, pieces)
        for text in (content, reasoning, *(arguments for _, arguments in calls)):
            assert not any(marker in text for marker in HARMONY_MARKERS), (text, pieces)


def test_harmony_without_tools_gives_calls_as_content() -> None:
    text = HARMONY_THINKING + harmony_call("get_weather", WEATHER)
    content, calls = HarmonyParser.for_request({})().parse(text)
    assert (content, calls) == (json.dumps(WEATHER), [])


# --- Long replies, a character at a time -----------------------------------------------

# Where a reader waits on whitespace (or a name) to see what follows it. A reply may go
# on with newlines for as long as max_tokens lets it; the reader runs on the server's
# event loop, so looking again at what it has already seen would hold every stream up.
LONG_RUNS = [
    (HermesToolParser, "", " "),
    (HermesToolParser, '<tool_call>{"name": "f", "arguments": {}}', "\n"),
    (JsonToolCallsParser, "", "\n"),
    (JsonToolCallsParser, '{"tool_calls": []}', " "),
    (Llama3JsonToolParser, "", " "),
    (Llama3JsonToolParser, "<|python_tag|>", " "),
    (Llama3JsonToolParser, '{"name": "f", "parameters": {}};', " "),
    (MistralToolParser, '[TOOL_CALLS][{"name": "f", "arguments": {}}', " "),
    (Phi4MiniToolParser, '<|tool_call|>[{"name": "f", "arguments": {}}]', "\n"),
    (PythonicToolParser, "", "\n"),
    (PythonicToolParser, "<|python_start|>", " "),
    (PythonicToolParser, "[f", " "),
    (PythonicToolParser, "[f(", " "),
    (PythonicToolParser, "[f(", "a"),
    (PythonicToolParser, "[f(a", " "),
    (PythonicToolParser, "[f(a=1)", " "),
    (PythonicToolParser, "[f(a=1)]", " "),
    (HarmonyParser, '<|channel|>commentary to=functions.f<|message|>{"a":', " "),
    (HarmonyParser, "", " "),
    (HarmonyParser, "<|channel|>analysis ", "a "),
    (lambda: ReasoningSplitter(False), "", "\n"),
]


@pytest.mark.parametrize(
    "make, head, filler", LONG_RUNS, ids=[f"{i}-{head[:12]}{filler!r}" for i, (_, head, filler) in enumerate(LONG_RUNS)]
)
def test_a_long_run_is_read_in_linear_time(make: Callable[[], Any], head: str, filler: str) -> None:
    reader = make()
    reader.feed(head)
    # Linear time: a piece costs as much at the run's end as near its start. Costs are
    # this thread's CPU time for 500 pieces, which other work on the machine does not
    # add to, the least of a few (a collection or a cache miss adds to one). Measured
    # here: 1.0-3.6 times (the readers copy what they hold); a reader that reads the
    # run again for each piece passes 6 within 10,000 pieces and takes minutes at 200,000.
    costs: list[float] = []
    for _ in range(80):
        began = time.thread_time()
        for _ in range(500):
            reader.feed(filler)
        costs.append(time.thread_time() - began)
        if len(costs) > 6:
            ratio = min(costs[-4:]) / min(costs[1:6])
            assert ratio < 6, f"a piece costs {ratio:.1f} times more after {len(costs) * 500} pieces than at the start"
    reader.finish()


# Nesting deeper than Python's JSON reader goes (it raises RecursionError, not ValueError).
DEEP = "[" * 5000 + "]" * 5000


@pytest.mark.parametrize(
    "make, text, calls",
    [
        (
            Qwen3CoderToolParser,
            f"<tool_call>\n<function=f>\n<parameter=a>\n{DEEP}\n</parameter>\n</function>\n</tool_call>",
            [("f", {"a": DEEP})],
        ),
        (HermesToolParser, f'<tool_call>{{"name": {DEEP}, "arguments": {{}}}}</tool_call>', []),
        (MistralToolParser, f'[TOOL_CALLS][{{"name": {DEEP}, "arguments": {{}}}}]', []),
        (JsonToolCallsParser, f'{{"content": {DEEP}, "tool_calls": []}}', []),
    ],
    ids=["qwen3_coder-value", "hermes-name", "mistral-name", "json_tool_calls-content"],
)
def test_deep_nesting_is_read_not_raised(make, text: str, calls: list[tuple[str, Args]]) -> None:
    """A value too deep to decode is text (a parameter's value) or not a call (a name, the
    reply's content): the reply is still read, whole or a character at a time."""
    for pieces in ([text], list(text)):
        content, _, got, _ = run(make, pieces)
        assert content == ("" if calls else text)
        assert [(name, json.loads(arguments)) for name, arguments in got] == calls


# --- Reasoning opened in the prompt (DeepSeek-R1 distills, Qwen3) ----------------------


@pytest.mark.parametrize(
    "opened, text, expected",
    [
        (True, "The user greets me.\n</think>\n\nHello!", ("The user greets me.\n", "Hello!")),
        (True, "</think>\n\nHello!", ("", "Hello!")),
        # The prompt opened the block in a way its end does not show: the answer after an
        # immediate close tag is still the answer.
        (False, "</think>\n\nHello!", ("", "Hello!")),
        (False, "\n</think>Hello!", ("", "Hello!")),
        (False, "<think>Hm.</think>Hello!", ("Hm.", "Hello!")),
        (False, "Hello! No </think> here.", ("", "Hello! No </think> here.")),
    ],
)
def test_reasoning_opened_in_the_prompt(opened: bool, text: str, expected: tuple[str, str]) -> None:
    assert ReasoningSplitter(opened).parse(text) == expected
    for pieces in splittings(text):
        splitter = ReasoningSplitter(opened)
        parts = [splitter.feed(p) for p in pieces] + [splitter.finish()]
        assert ("".join(r for r, _ in parts), "".join(c for _, c in parts)) == expected


# --- Each family's chat template tells its format ---------------------------------------

FAMILY_TEMPLATES = {
    "openai-gpt-oss-120b.jinja": "harmony",
    "Qwen3-Coder.jinja": "qwen3_coder",
    "Qwen-Qwen3-0.6B.jinja": "hermes",
    "microsoft-Phi-4-mini-instruct.jinja": "phi4_mini",
    "vllm-phi4-mini.jinja": "phi4_mini",
    "meta-llama-Llama-3.2-3B-Instruct.jinja": "llama3_json",
    "vllm-llama4-pythonic.jinja": "pythonic",
    "vllm-gemma3-pythonic.jinja": "pythonic",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": None,
    "mistralai-Mistral-Small-3.2-24B-Instruct-2506.jinja": "mistral",
}


@pytest.mark.parametrize("name, expected", FAMILY_TEMPLATES.items())
def test_the_format_is_read_off_the_template(name: str, expected: str | None) -> None:
    guess = guess_format((TEMPLATES / name).read_text())
    assert (guess[0] if guess else None) == expected
    if guess:
        assert guess[1] in (TEMPLATES / name).read_text()
        assert guess[0] in PARSERS


def test_every_parser_is_a_format_setting() -> None:
    from typing import get_args

    from ovtrio.settings.model import ModelSettings

    allowed = get_args(get_args(ModelSettings.model_fields["tool_parser"].annotation)[0])
    assert set(PARSERS) | {"none"} == set(allowed)


def test_harmony_parser_reads_channels_whatever_the_tools() -> None:
    assert HarmonyParser.CHANNELS and not any(p.CHANNELS for p in PARSERS.values() if p is not HarmonyParser)
    assert isinstance(HarmonyParser.for_request({"f": {}}), partial)


@pytest.mark.parametrize(
    "tool_parser, reasoning_parser, template, expected",
    [
        (None, None, "<|channel|>final<|message|>", ("harmony", "harmony", "the chat template writes <|channel|>")),
        ("gptoss", None, "", ("gptoss", "harmony", "the tool_parser setting")),
        (None, None, "{{ messages }}", ("json_tool_calls", None, None)),
        (None, None, "{% if tools %}{{ tools }}{% endif %}", (None, None, None)),
        (None, None, "<tool_call><think>", ("hermes", "think", None)),
        (None, "none", "<tool_call><think>", ("hermes", None, None)),
        (None, "deepseek_r1", "{{ messages }}", ("json_tool_calls", "think", None)),
        ("none", None, "<tool_call>", (None, None, "the tool_parser setting")),
    ],
)
def test_chat_format_choice(tool_parser, reasoning_parser, template, expected, caplog) -> None:
    from ovtrio.settings.server import Settings
    from ovtrio.text.chat_format import chat_format

    settings = Settings(tool_parser=tool_parser, reasoning_parser=reasoning_parser)
    with caplog.at_level("INFO", logger="ovtrio"):
        chosen = chat_format(settings, template)
    assert (chosen.tool_calls, chosen.reasoning) == expected[:2]
    if expected[2] is not None:
        assert chosen.reason == expected[2]
    assert chosen.reason in caplog.text and "tool calls are read in the" in caplog.text
