"""Tool-call parsers, pure logic (no server): recorded-looking outputs of each format.

The key property, checked for every sample: fed in arbitrary pieces (every single
character, every two-piece split, random splits), a parser gives exactly the content and
the calls of the unary parse, and each call's streamed argument fragments add up to its
unary `arguments` byte for byte. The unary arguments are the raw JSON text of the sample.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytest

from ovtrio.parsing import (
    PARSERS,
    HermesToolParser,
    JsonToolCallsParser,
    Llama3JsonToolParser,
    MistralToolParser,
    ParsedDelta,
    ToolCall,
    ToolCallParser,
    guess_parser,
)
from splitting import splittings

NOT_JSON = object()  # expected value of arguments cut short: not parseable


@dataclass
class Sample:
    id: str
    parser: Callable[[], ToolCallParser]  # a reader class, or one made for a request's tools
    text: str
    content: str
    calls: list[tuple[str, str, Any]] = field(default_factory=list)  # (name, raw arguments, json value)


# Arguments as a model writes them, reused across formats.
WEATHER = '{"city": "Paris", "unit": "celsius"}'
LONDON = '{"city": "London", "unit": "celsius"}'
# Braces, brackets, commas and tags inside strings; escaped quotes; an escaped backslash
# right before a closing quote; nested objects and arrays; every kind of scalar.
TRICKY = (
    r'{"query": "SELECT * FROM t WHERE s = \"}{\" AND p LIKE \"%[x]%\"", '
    r'"path": "C:\\temp\\{new}\\", '
    r'"tags": ["a,b", "}", "]", {"deep": {"deeper": [1, 2.5e-3, -7, true, false, null]}}], '
    r'"html": "<b>bold</b> </tool_call> <tool_call> [TOOL_CALLS] ;", "empty": {}, "none": []}'
)
UNICODE = '{"city": "Zürich", "greeting": "こんにちは 👋", "escaped": "caf\\u00e9 \\ud83d\\ude00"}'
PRETTY = (
    '{\n    "title": "Team sync",\n    "attendees": ["ana@example.com", "bo@example.com"],\n'
    '    "when": {"day": "2025-03-14", "time": "10:00"}\n  }'
)


def hermes_call(name: str, arguments: str) -> str:
    return '<tool_call>\n{"name": "' + name + '", "arguments": ' + arguments + "}\n</tool_call>"


def value(raw: str) -> Any:
    return json.loads(raw)


HERMES = [
    Sample(
        "single", HermesToolParser, hermes_call("get_weather", WEATHER), "", [("get_weather", WEATHER, value(WEATHER))]
    ),
    Sample(
        "parallel",
        HermesToolParser,
        hermes_call("get_weather", WEATHER) + "\n" + hermes_call("get_weather", LONDON),
        "",
        [("get_weather", WEATHER, value(WEATHER)), ("get_weather", LONDON, value(LONDON))],
    ),
    Sample(
        "content_before",
        HermesToolParser,
        "I'll check both cities for you.\n\n"
        + hermes_call("get_weather", WEATHER)
        + "\n"
        + hermes_call("get_weather", LONDON),
        "I'll check both cities for you.\n\n",
        [("get_weather", WEATHER, value(WEATHER)), ("get_weather", LONDON, value(LONDON))],
    ),
    Sample(
        "tricky_strings", HermesToolParser, hermes_call("run_sql", TRICKY), "", [("run_sql", TRICKY, value(TRICKY))]
    ),
    Sample("unicode", HermesToolParser, hermes_call("greet", UNICODE), "", [("greet", UNICODE, value(UNICODE))]),
    Sample(
        "pretty_printed",
        HermesToolParser,
        '<tool_call>\n{"name": "create_event", "arguments": ' + PRETTY + "\n}\n</tool_call>",
        "",
        [("create_event", PRETTY, value(PRETTY))],
    ),
    Sample(
        "space_around_arguments",
        HermesToolParser,
        '<tool_call>{ "name" : "f" , "arguments" :   {"a": [1, 2]}   }</tool_call>',
        "",
        [("f", '{"a": [1, 2]}', {"a": [1, 2]})],
    ),
    Sample(
        "arguments_before_name",
        HermesToolParser,
        '<tool_call>\n{"arguments": {"q": "ovtrio"}, "name": "search"}\n</tool_call>',
        "",
        [("search", '{"q": "ovtrio"}', {"q": "ovtrio"})],
    ),
    Sample(
        "extra_keys",
        HermesToolParser,
        '<tool_call>\n{"type": "function", "name": "f", "id": "abc", "arguments": {"a": 1}, "extra": [{"}": "]"}]}\n</tool_call>',
        "",
        [("f", '{"a": 1}', {"a": 1})],
    ),
    Sample(
        "no_arguments",
        HermesToolParser,
        '<tool_call>\n{"name": "get_time"}\n</tool_call>',
        "",
        [("get_time", "{}", {})],
    ),
    Sample(
        "arguments_as_json_string",  # kept as written; json.loads gives a str
        HermesToolParser,
        '<tool_call>\n{"name": "f", "arguments": "{\\"x\\": 1}"}\n</tool_call>',
        "",
        [("f", '"{\\"x\\": 1}"', '{"x": 1}')],
    ),
    Sample(
        "content_after",
        HermesToolParser,
        hermes_call("get_weather", WEATHER) + "\n\nLet me know if you need anything else.",
        "\n\nLet me know if you need anything else.",
        [("get_weather", WEATHER, value(WEATHER))],
    ),
    Sample(
        "no_close_tag",  # stop strings often eat it
        HermesToolParser,
        '<tool_call>\n{"name": "f", "arguments": {"x": 1}}',
        "",
        [("f", '{"x": 1}', {"x": 1})],
    ),
    Sample(
        "missing_outer_brace",
        HermesToolParser,
        '<tool_call>\n{"name": "f", "arguments": {"x": 1}\n</tool_call>\n' + hermes_call("g", "{}"),
        "",
        [("f", '{"x": 1}', {"x": 1}), ("g", "{}", {})],
    ),
    Sample(
        "doubled_open_tag",
        HermesToolParser,
        '<tool_call>\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
        "<tool_call>\n",
        [("f", "{}", {})],
    ),
    Sample(
        "malformed_not_json",
        HermesToolParser,
        'Calling it now.\n<tool_call>\nget_weather(city="Paris")\n</tool_call>',
        'Calling it now.\n<tool_call>\nget_weather(city="Paris")\n</tool_call>',
    ),
    Sample(
        "malformed_missing_name",
        HermesToolParser,
        '<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>',
        '<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>',
    ),
    Sample(
        "malformed_name_not_string",
        HermesToolParser,
        '\n<tool_call>\n{"name": ["f"], "arguments": {}}\n</tool_call>',
        '\n<tool_call>\n{"name": ["f"], "arguments": {}}\n</tool_call>',
    ),
    Sample(
        "malformed_bad_key_then_good_call",
        HermesToolParser,
        '<tool_call>\n{name: "f"}\n</tool_call>\n' + hermes_call("g", WEATHER),
        '<tool_call>\n{name: "f"}\n</tool_call>\n',
        [("g", WEATHER, value(WEATHER))],
    ),
    Sample(
        "junk_after_announced_call",  # the call was streamed already: it stays, the junk is content
        HermesToolParser,
        '<tool_call>\n{"name": "f", "arguments": {"x": 1}, oops}\n</tool_call>',
        "oops}\n</tool_call>",
        [("f", '{"x": 1}', {"x": 1})],
    ),
    Sample(
        "truncated_in_arguments",  # max_tokens: announced, so it stays a call
        HermesToolParser,
        'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
        "Sure.\n",
        [("get_weather", '{"city": "Par', NOT_JSON)],
    ),
    Sample(
        "truncated_after_a_comma",  # trailing whitespace is never part of the arguments
        HermesToolParser,
        '<tool_call>\n{"name": "f", "arguments": {"a": "x y", \n  ',
        "",
        [("f", '{"a": "x y",', NOT_JSON)],
    ),
    Sample(
        "truncated_in_name",
        HermesToolParser,
        'Sure!\n<tool_call>\n{"name": "get_wea',
        'Sure!\n<tool_call>\n{"name": "get_wea',
    ),
    Sample(
        "truncated_after_tag",
        HermesToolParser,
        "Sure!\n<tool_call>\n",
        "Sure!\n<tool_call>\n",
    ),
    Sample(
        "plain_with_angle_brackets",
        HermesToolParser,
        "Use <b>bold</b>, note that a < b, and <tool_calls> is not a tag. Ends with <tool_c",
        "Use <b>bold</b>, note that a < b, and <tool_calls> is not a tag. Ends with <tool_c",
    ),
    Sample("empty", HermesToolParser, "", ""),
    Sample("only_whitespace", HermesToolParser, "\n\n", "\n\n"),
]


def llama_call(name: str, parameters: str) -> str:
    return '{"name": "' + name + '", "parameters": ' + parameters + "}"


EXAMPLE_ARGS = '{"arg1": "value1", "arg2": 42}'
QUERY_1 = '{"query": "test1"}'
QUERY_2 = '{"query": "test2"}'
LLAMA_WITH_TOOLS = Llama3JsonToolParser.for_request(
    {"searchTool": {}, "getOpenIncidentsTool": {}, "get_weather": {}, "example_tool": {}}
)

LLAMA = [
    Sample(
        "single",
        Llama3JsonToolParser,
        llama_call("get_weather", WEATHER),
        "",
        [("get_weather", WEATHER, value(WEATHER))],
    ),
    Sample(
        "python_tag",
        Llama3JsonToolParser,
        "<|python_tag|>" + llama_call("get_weather", WEATHER),
        "",
        [("get_weather", WEATHER, value(WEATHER))],
    ),
    Sample(
        "parallel_semicolon",
        Llama3JsonToolParser,
        "<|python_tag|>" + llama_call("get_weather", WEATHER) + "; " + llama_call("get_weather", LONDON),
        "",
        [("get_weather", WEATHER, value(WEATHER)), ("get_weather", LONDON, value(LONDON))],
    ),
    Sample(
        "parallel_newline",
        Llama3JsonToolParser,
        llama_call("get_weather", WEATHER) + "\n" + llama_call("get_weather", LONDON),
        "",
        [("get_weather", WEATHER, value(WEATHER)), ("get_weather", LONDON, value(LONDON))],
    ),
    Sample(
        "arguments_key",
        Llama3JsonToolParser,
        '{"name": "search", "arguments": {"q": "trio"}}',
        "",
        [("search", '{"q": "trio"}', {"q": "trio"})],
    ),
    Sample(
        "leading_whitespace",
        Llama3JsonToolParser,
        "\n\n " + llama_call("get_weather", WEATHER),
        "",
        [("get_weather", WEATHER, value(WEATHER))],
    ),
    Sample(
        "tricky_strings", Llama3JsonToolParser, llama_call("run_sql", TRICKY), "", [("run_sql", TRICKY, value(TRICKY))]
    ),
    Sample("unicode", Llama3JsonToolParser, llama_call("greet", UNICODE), "", [("greet", UNICODE, value(UNICODE))]),
    Sample(
        "trailing_semicolon",
        Llama3JsonToolParser,
        llama_call("get_weather", WEATHER) + ";\n",
        "",
        [("get_weather", WEATHER, value(WEATHER))],
    ),
    Sample(
        "text_after_calls",
        Llama3JsonToolParser,
        llama_call("get_weather", WEATHER) + "\n\nI have asked for the weather.",
        "\n\nI have asked for the weather.",
        [("get_weather", WEATHER, value(WEATHER))],
    ),
    Sample(
        "second_call_malformed",
        Llama3JsonToolParser,
        llama_call("get_weather", WEATHER) + '; {"parameters": {"city": "Rome"}}',
        '; {"parameters": {"city": "Rome"}}',
        [("get_weather", WEATHER, value(WEATHER))],
    ),
    Sample(
        "truncated",
        Llama3JsonToolParser,
        '{"name": "get_weather", "parameters": {"city": "Pa',
        "",
        [("get_weather", '{"city": "Pa', NOT_JSON)],
    ),
    Sample("plain_text", Llama3JsonToolParser, "The weather in Paris is sunny.", "The weather in Paris is sunny."),
    Sample("plain_with_leading_space", Llama3JsonToolParser, "  \nSure, here it is.", "  \nSure, here it is."),
    Sample(
        "json_answer_without_name", Llama3JsonToolParser, '{"answer": 42, "unit": "m"}', '{"answer": 42, "unit": "m"}'
    ),
    Sample("name_without_parameters", Llama3JsonToolParser, '{"name": "Bob", "age": 42}', '{"name": "Bob", "age": 42}'),
    Sample(
        "json_then_text",  # starts like JSON but is prose
        Llama3JsonToolParser,
        "{braces} make a set in Python; {1, 2}",
        "{braces} make a set in Python; {1, 2}",
    ),
    Sample(
        "python_code_after_tag",  # built-in tool code: not a JSON call
        Llama3JsonToolParser,
        '<|python_tag|>brave_search.call(query="weather in Paris")',
        '<|python_tag|>brave_search.call(query="weather in Paris")',
    ),
    Sample("partial_python_tag", Llama3JsonToolParser, "<|python_ta", "<|python_ta"),
    Sample(
        "calls_later_are_content",
        Llama3JsonToolParser,
        "Here: " + llama_call("f", "{}"),
        "Here: " + llama_call("f", "{}"),
    ),
    Sample("empty", Llama3JsonToolParser, "", ""),
    # After text: a <|python_tag|> call anywhere (OVMS's test), and, when the request has
    # tools, calls that name them (vLLM's); what is not a call stays content.
    Sample(
        "python_tag_after_text",
        Llama3JsonToolParser,
        "This is a content part and next will be a tool call."
        '<|python_tag|>{"name": "example_tool", "parameters": {"arg1": "value1", "arg2": 42}}',
        "This is a content part and next will be a tool call.",
        [("example_tool", EXAMPLE_ARGS, value(EXAMPLE_ARGS))],
    ),
    Sample(
        "python_tag_after_text_with_tools",
        LLAMA_WITH_TOOLS,
        "Sure.\n<|python_tag|>" + llama_call("get_weather", WEATHER) + "; " + llama_call("get_weather", LONDON),
        "Sure.\n",
        [("get_weather", WEATHER, value(WEATHER)), ("get_weather", LONDON, value(LONDON))],
    ),
    Sample(
        "calls_after_text",
        LLAMA_WITH_TOOLS,
        "Here are the results: "
        + llama_call("searchTool", QUERY_1)
        + "; "
        + llama_call("getOpenIncidentsTool", "{}")
        + "; "
        + llama_call("searchTool", QUERY_2)
        + " Would you like to know more?",
        "Here are the results:  Would you like to know more?",
        [
            ("searchTool", QUERY_1, value(QUERY_1)),
            ("getOpenIncidentsTool", "{}", {}),
            ("searchTool", QUERY_2, value(QUERY_2)),
        ],
    ),
    Sample(
        "one_call_after_text",
        LLAMA_WITH_TOOLS,
        'Here is the result: {"name": "getOpenIncidentsTool", "parameters": {}} Would you like to know more?',
        "Here is the result:  Would you like to know more?",
        [("getOpenIncidentsTool", "{}", {})],
    ),
    Sample(
        "prose_with_braces_and_tools",
        LLAMA_WITH_TOOLS,
        "In Python, {1, 2} is a set and {} a dict; {braces} {{ }} {",
        "In Python, {1, 2} is a set and {} a dict; {braces} {{ }} {",
    ),
    Sample(
        "json_naming_no_tool_after_text",
        LLAMA_WITH_TOOLS,
        'The record is {"name": "Bob", "parameters": {"name": "searchTool", "parameters": {}}}; done.',
        'The record is {"name": "Bob", "parameters": {"name": "searchTool", "parameters": {}}}; done.',
    ),
    Sample(
        "json_without_name_after_text",
        LLAMA_WITH_TOOLS,
        'It returns {"parameters": {"query": "x"}, "ok": true}.',
        'It returns {"parameters": {"query": "x"}, "ok": true}.',
    ),
    Sample(
        "tool_name_without_parameters_after_text",
        LLAMA_WITH_TOOLS,
        'Call {"name": "searchTool"} later.',
        'Call {"name": "searchTool"} later.',
    ),
    Sample(
        "call_after_text_then_a_tool_name_in_prose",
        LLAMA_WITH_TOOLS,
        "Checking. " + llama_call("searchTool", QUERY_1) + '\nThen {"name": "Bob"} and {"a": 1}.',
        'Checking. \nThen {"name": "Bob"} and {"a": 1}.',
        [("searchTool", QUERY_1, value(QUERY_1))],
    ),
    Sample(
        "calls_later_are_content_without_tools",
        Llama3JsonToolParser,
        "Here: " + llama_call("searchTool", QUERY_1),
        "Here: " + llama_call("searchTool", QUERY_1),
    ),
    Sample(
        "cut_in_call_after_text",
        LLAMA_WITH_TOOLS,
        'Here: {"name": "searchTool", "parameters": {"query": "te',
        "Here: ",
        [("searchTool", '{"query": "te', NOT_JSON)],
    ),
    Sample(
        "cut_before_name_after_text",
        LLAMA_WITH_TOOLS,
        'Here: {"name": "search',
        'Here: {"name": "search',
    ),
]

MISTRAL = [
    Sample(
        "array_single",
        MistralToolParser,
        '[TOOL_CALLS][{"name": "get_weather", "arguments": ' + WEATHER + "}]",
        "",
        [("get_weather", WEATHER, value(WEATHER))],
    ),
    Sample(
        "array_parallel",
        MistralToolParser,
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": ' + WEATHER + "}, "
        '{"name": "get_weather", "arguments": ' + LONDON + "}]",
        "",
        [("get_weather", WEATHER, value(WEATHER)), ("get_weather", LONDON, value(LONDON))],
    ),
    Sample(
        "content_before",
        MistralToolParser,
        'Let me look that up.[TOOL_CALLS][{"name": "search", "arguments": {"q": "[x]"}}]',
        "Let me look that up.",
        [("search", '{"q": "[x]"}', {"q": "[x]"})],
    ),
    Sample(
        "array_with_model_id",  # Nemo writes an id; ours replaces it
        MistralToolParser,
        '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}, "id": "abc123def"}]',
        "",
        [("f", '{"a": 1}', {"a": 1})],
    ),
    Sample(
        "array_tricky",
        MistralToolParser,
        '[TOOL_CALLS][{"name": "run_sql", "arguments": '
        + TRICKY
        + '}, {"name": "greet", "arguments": '
        + UNICODE
        + "}]",
        "",
        [("run_sql", TRICKY, value(TRICKY)), ("greet", UNICODE, value(UNICODE))],
    ),
    Sample(
        "single_object",
        MistralToolParser,
        '[TOOL_CALLS]{"name": "f", "arguments": {"a": [1, {"b": "}"}]}}',
        "",
        [("f", '{"a": [1, {"b": "}"}]}', {"a": [1, {"b": "}"}]})],
    ),
    Sample(
        "v11_single",
        MistralToolParser,
        "[TOOL_CALLS]get_weather[ARGS]" + WEATHER,
        "",
        [("get_weather", WEATHER, value(WEATHER))],
    ),
    Sample(
        "v11_parallel",
        MistralToolParser,
        "[TOOL_CALLS]get_weather[ARGS]" + WEATHER + "[TOOL_CALLS]run_sql[ARGS]" + TRICKY,
        "",
        [("get_weather", WEATHER, value(WEATHER)), ("run_sql", TRICKY, value(TRICKY))],
    ),
    Sample(
        "v11_without_args_token",  # special tokens not rendered
        MistralToolParser,
        "Checking.[TOOL_CALLS]greet" + UNICODE,
        "Checking.",
        [("greet", UNICODE, value(UNICODE))],
    ),
    Sample(
        "v11_text_after",
        MistralToolParser,
        "[TOOL_CALLS]get_weather[ARGS]" + WEATHER + "\nDone.",
        "\nDone.",
        [("get_weather", WEATHER, value(WEATHER))],
    ),
    Sample("empty_array", MistralToolParser, "[TOOL_CALLS][]", ""),
    Sample(
        "malformed_text_after_tag",
        MistralToolParser,
        "[TOOL_CALLS] sorry, I cannot do that.",
        "[TOOL_CALLS] sorry, I cannot do that.",
    ),
    Sample(
        "malformed_missing_name",
        MistralToolParser,
        '[TOOL_CALLS][{"arguments": {"city": "Paris"}}]',
        '[TOOL_CALLS][{"arguments": {"city": "Paris"}}]',
    ),
    Sample(
        "malformed_second_item",
        MistralToolParser,
        '[TOOL_CALLS][{"name": "f", "arguments": {}}, {"nam": "g"}]',
        ', {"nam": "g"}]',
        [("f", "{}", {})],
    ),
    Sample(
        "truncated_array",
        MistralToolParser,
        '[TOOL_CALLS][{"name": "f", "arguments": {"a": [1, 2',
        "",
        [("f", '{"a": [1, 2', NOT_JSON)],
    ),
    Sample(
        "truncated_v11_name",
        MistralToolParser,
        "[TOOL_CALLS]get_wea",
        "[TOOL_CALLS]get_wea",
    ),
    Sample(
        "plain_with_brackets",
        MistralToolParser,
        "Use [brackets] like [TOOL] or [TOOL_CALLS",
        "Use [brackets] like [TOOL] or [TOOL_CALLS",
    ),
]


def polyfill_call(name: str, arguments: str, call_id: str = "call_1___") -> str:
    """One call as the polyfill's example shows it: pretty-printed, the model's own id last."""
    return (
        '    {\n      "name": "'
        + name
        + '",\n      "arguments": '
        + arguments
        + ',\n      "id": "'
        + call_id
        + '"\n    }'
    )


def polyfill_reply(*calls: str, before: str = "", after: str = "") -> str:
    return "{\n" + before + '  "tool_calls": [\n' + ",\n".join(calls) + "\n  ]" + after + "\n}"


PRETTY_WEATHER = '{\n        "city": "Paris",\n        "unit": "celsius"\n      }'

JSON_TOOL_CALLS = [
    Sample(
        "single_pretty",
        JsonToolCallsParser,
        polyfill_reply(polyfill_call("get_weather", PRETTY_WEATHER)),
        "",
        [("get_weather", PRETTY_WEATHER, value(WEATHER))],
    ),
    Sample(
        "as_rendered_history",  # how the polyfill renders past turns, on one line
        JsonToolCallsParser,
        '{"tool_calls": [{"name": "get_weather", "arguments": ' + WEATHER + ', "id": "c1"}], "content": ""}',
        "",
        [("get_weather", WEATHER, value(WEATHER))],
    ),
    Sample(
        "parallel",
        JsonToolCallsParser,
        polyfill_reply(polyfill_call("get_weather", WEATHER, "call_1"), polyfill_call("get_weather", LONDON, "call_2")),
        "",
        [("get_weather", WEATHER, value(WEATHER)), ("get_weather", LONDON, value(LONDON))],
    ),
    Sample(
        "content_before",
        JsonToolCallsParser,
        polyfill_reply(
            polyfill_call("get_weather", WEATHER), before='  "content": "Let me check \\"both\\" cities.\\n",\n'
        ),
        'Let me check "both" cities.\n',
        [("get_weather", WEATHER, value(WEATHER))],
    ),
    Sample(
        "content_after",
        JsonToolCallsParser,
        polyfill_reply(polyfill_call("get_weather", WEATHER), after=',\n  "content": "Checking \\u00e9 {now} ]"'),
        "Checking é {now} ]",
        [("get_weather", WEATHER, value(WEATHER))],
    ),
    Sample(
        "content_null",
        JsonToolCallsParser,
        '{"content": null, "tool_calls": [{"name": "f", "arguments": {}}]}',
        "",
        [("f", "{}", {})],
    ),
    Sample(
        "tricky_and_unicode",
        JsonToolCallsParser,
        polyfill_reply(polyfill_call("run_sql", TRICKY), polyfill_call("greet", UNICODE)),
        "",
        [("run_sql", TRICKY, value(TRICKY)), ("greet", UNICODE, value(UNICODE))],
    ),
    Sample(
        "id_before_name",  # the model's id is replaced by ours
        JsonToolCallsParser,
        '{"tool_calls": [{"id": "call_1___", "arguments": {"q": "[x]"}, "name": "search"}]}',
        "",
        [("search", '{"q": "[x]"}', {"q": "[x]"})],
    ),
    Sample(
        "no_arguments_and_extra_keys",
        JsonToolCallsParser,
        '{"tool_calls": [{"name": "get_time", "type": "function"},], "model": {"}": "]"}}',
        "",
        [("get_time", "{}", {})],
    ),
    Sample("empty_array", JsonToolCallsParser, '{\n  "tool_calls": []\n}\n', ""),
    Sample("empty_array_with_content", JsonToolCallsParser, '{"tool_calls": [], "content": "Hi there!"}', "Hi there!"),
    Sample(
        "leading_whitespace_and_text_after",
        JsonToolCallsParser,
        '\n  {"tool_calls": [{"name": "f", "arguments": {"a": 1}}]}\nDone.',
        "\nDone.",
        [("f", '{"a": 1}', {"a": 1})],
    ),
    Sample(
        "missing_closing_brackets",  # the reply may just stop after the last call
        JsonToolCallsParser,
        '{"tool_calls": [{"name": "f", "arguments": {"a": 1}},\n',
        "",
        [("f", '{"a": 1}', {"a": 1})],
    ),
    Sample(
        "truncated_in_arguments",  # max_tokens: announced, so it stays a call
        JsonToolCallsParser,
        '{"content": "Sure.", "tool_calls": [{"name": "get_weather", "arguments": {"city": "Par',
        "Sure.",
        [("get_weather", '{"city": "Par', NOT_JSON)],
    ),
    Sample(
        "truncated_in_name",  # nothing announced: all of it is content
        JsonToolCallsParser,
        '{"content": "Sure.", "tool_calls": [{"name": "get_wea',
        '{"content": "Sure.", "tool_calls": [{"name": "get_wea',
    ),
    Sample(
        "truncated_in_key",
        JsonToolCallsParser,
        '{\n  "tool_ca',
        '{\n  "tool_ca',
    ),
    Sample(
        "malformed_first_call",
        JsonToolCallsParser,
        '{"tool_calls": [{"arguments": {"city": "Paris"}}]}',
        '{"tool_calls": [{"arguments": {"city": "Paris"}}]}',
    ),
    Sample(
        "malformed_second_call",
        JsonToolCallsParser,
        '{"tool_calls": [{"name": "f", "arguments": {}}, {"nam": "g"}]}',
        ', {"nam": "g"}]}',
        [("f", "{}", {})],
    ),
    Sample(
        "tool_calls_not_an_array",
        JsonToolCallsParser,
        '{"tool_calls": {"name": "f", "arguments": {}}}',
        '{"tool_calls": {"name": "f", "arguments": {}}}',
    ),
    Sample("plain_text", JsonToolCallsParser, "The weather in Paris is sunny.", "The weather in Paris is sunny."),
    Sample("plain_with_leading_space", JsonToolCallsParser, "  \nSure: {tool_calls}", "  \nSure: {tool_calls}"),
    Sample("plain_json", JsonToolCallsParser, '{"answer": 42, "tool_calls": []}', '{"answer": 42, "tool_calls": []}'),
    Sample("plain_json_tool_key_prefix", JsonToolCallsParser, '{"tool_call": 1}', '{"tool_call": 1}'),
    Sample("content_only", JsonToolCallsParser, '{"content": "Hello!"}', '{"content": "Hello!"}'),
    Sample(
        "content_then_other_key",
        JsonToolCallsParser,
        '{"content": "Hi", "name": "f", "tool_calls": []}',
        '{"content": "Hi", "name": "f", "tool_calls": []}',
    ),
    Sample(
        "content_not_a_string",
        JsonToolCallsParser,
        '{"content": 7, "tool_calls": []}',
        '{"content": 7, "tool_calls": []}',
    ),
    Sample("empty_object", JsonToolCallsParser, "{}", "{}"),
    Sample("braces_in_prose", JsonToolCallsParser, "{braces} make a set", "{braces} make a set"),
    Sample("empty", JsonToolCallsParser, "", ""),
    Sample("only_whitespace", JsonToolCallsParser, "\n\n", "\n\n"),
]

SAMPLES = HERMES + LLAMA + MISTRAL + JSON_TOOL_CALLS


def sample_id(sample: Sample) -> str:
    maker = sample.parser.func if isinstance(sample.parser, partial) else sample.parser
    return f"{getattr(maker, '__name__', 'parser')}-{sample.id}"


# --- Splitting and streaming -----------------------------------------------------------


@dataclass
class Streamed:
    content: str
    calls: list[tuple[str, str, str]]  # (id, name, arguments) from the deltas, by index
    parser: ToolCallParser


def stream(make: Callable[[], ToolCallParser], pieces: list[str]) -> Streamed:
    """Feed the pieces and check the deltas are well-formed OpenAI tool-call deltas."""
    parser = make()
    deltas: list[ParsedDelta] = [parser.feed(piece) for piece in pieces] + [parser.finish()]
    ids: list[str] = []
    names: list[str] = []
    arguments: list[str] = []
    for delta in deltas:
        for call in delta.tool_calls:
            if call.index == len(ids):  # first delta of a new call
                assert call.id and call.name, call
                ids.append(call.id)
                names.append(call.name)
                arguments.append(call.arguments)
            else:
                assert call.index < len(ids), "indexes come in order"
                assert call.id is None and call.name is None, call
                assert call.arguments, "no empty fragments after the first delta"
                arguments[call.index] += call.arguments
    content = "".join(delta.content for delta in deltas)
    return Streamed(content, list(zip(ids, names, arguments)), parser)


def as_tuples(calls: list[ToolCall]) -> list[tuple[str, str, str]]:
    return [(call.id, call.name, call.arguments) for call in calls]


# --- The samples --------------------------------------------------------------------


@pytest.mark.parametrize("sample", SAMPLES, ids=sample_id)
def test_unary_parse(sample: Sample) -> None:
    content, calls = sample.parser().parse(sample.text)
    assert content == sample.content
    assert [(call.name, call.arguments) for call in calls] == [(name, raw) for name, raw, _ in sample.calls]
    for (_, raw, expected), call in zip(sample.calls, calls):
        assert raw in sample.text or raw == "{}", "arguments are the model's own text"
        if expected is NOT_JSON:
            with pytest.raises(ValueError):
                json.loads(call.arguments)
        else:
            assert json.loads(call.arguments) == expected
    assert len({call.id for call in calls}) == len(calls)


@pytest.mark.parametrize("sample", SAMPLES, ids=sample_id)
def test_streaming_matches_unary_for_any_split(sample: Sample) -> None:
    content, calls = sample.parser().parse(sample.text)
    expected = [(call.name, call.arguments) for call in calls]
    for pieces in splittings(sample.text):
        streamed = stream(sample.parser, pieces)
        assert streamed.content == content, pieces
        assert [(name, arguments) for _, name, arguments in streamed.calls] == expected, pieces
        assert streamed.calls == as_tuples(streamed.parser.calls), "deltas and .calls agree, ids included"


# --- Streaming behaviour ------------------------------------------------------------


def test_arguments_stream_before_the_call_ends() -> None:
    parser = HermesToolParser()
    assert parser.feed('Let me check.\n<tool_call>\n{"name": "get_wea') == ParsedDelta("Let me check.\n", [])
    first = parser.feed('ther", "arguments": {"city": "Pa')
    assert first.content == ""
    [call] = first.tool_calls
    assert (call.index, call.name, call.arguments) == (0, "get_weather", '{"city": "Pa')
    assert call.id and parser.calls == []
    second = parser.feed('ris"}}\n</tool')
    assert [(d.index, d.id, d.name, d.arguments) for d in second.tool_calls] == [(0, None, None, 'ris"}')]
    assert [c.arguments for c in parser.calls] == ['{"city": "Paris"}']
    assert parser.feed("_call>") == ParsedDelta("", [])
    assert parser.finish() == ParsedDelta("", [])


def test_partial_tag_is_held_back_until_known() -> None:
    parser = HermesToolParser()
    assert parser.feed("Hello <tool_c").content == "Hello "
    assert parser.feed("ar").content == "<tool_car"  # not a tag after all
    assert parser.feed(" <").content == " "
    assert parser.feed("tool_call>").content == ""
    assert parser.finish().content == "<tool_call>"  # an empty call is given back


def test_whitespace_inside_arguments_waits_for_what_follows() -> None:
    """Arguments are trimmed, so trailing whitespace is only sent once more text follows."""
    parser = Llama3JsonToolParser()
    assert parser.feed('{"name": "f", "parameters": {"a": "x ').tool_calls[0].arguments == '{"a": "x'
    assert parser.feed('y"}  ').tool_calls[0].arguments == ' y"}'
    assert parser.feed("}").tool_calls == []
    assert [c.arguments for c in parser.calls] == ['{"a": "x y"}']


def test_llama_decides_at_the_start() -> None:
    parser = Llama3JsonToolParser()
    assert parser.feed("  <|python").content == ""  # could still be a call
    assert parser.feed("_tag|>  ").content == ""
    assert parser.feed("Hi").content == "  <|python_tag|>  Hi"  # code or text: all content


def test_mistral_waits_for_the_args_token() -> None:
    parser = MistralToolParser()
    assert parser.feed("[TOOL_CALLS]get_weather[AR") == ParsedDelta("", [])
    delta = parser.feed('GS]{"city"')
    assert [(d.name, d.arguments) for d in delta.tool_calls] == [("get_weather", '{"city"')]


def test_json_tool_calls_decides_as_soon_as_it_can() -> None:
    parser = JsonToolCallsParser()
    assert parser.feed(' \n{\n  "tool').content == ""  # could still be a reply
    assert parser.feed("s").content == ' \n{\n  "tools'  # cannot: content as generated
    assert parser.feed('": []}').content == '": []}'
    assert parser.finish() == ParsedDelta("", [])


def test_json_tool_calls_content_waits_for_the_first_call() -> None:
    parser = JsonToolCallsParser()
    assert parser.feed('{"content": "On it.", "tool_calls": [{"name": "f",') == ParsedDelta("", [])
    delta = parser.feed(' "arguments": {"a": ')
    assert delta.content == "On it."
    assert [(d.index, d.name, d.arguments) for d in delta.tool_calls] == [(0, "f", '{"a":')]
    assert re.fullmatch(r"call_[0-9a-f]{24}", delta.tool_calls[0].id)
    assert parser.feed('1}, "id": "x"}]}').tool_calls[0].arguments == " 1}"
    assert parser.finish() == ParsedDelta("", [])
    assert [(c.name, c.arguments) for c in parser.calls] == [("f", '{"a": 1}')]


def test_parse_equals_feed_and_finish_on_one_instance() -> None:
    parser = HermesToolParser()
    content, calls = parser.parse("Hi " + hermes_call("f", "{}"))
    assert content == "Hi " and calls == parser.calls and calls[0].arguments == "{}"


# --- Ids ------------------------------------------------------------------------------


def test_ids_are_openai_style_and_distinct() -> None:
    text = "".join(hermes_call("f", "{}") for _ in range(5))
    _, calls = HermesToolParser().parse(text)
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", call.id) for call in calls)
    assert len({call.id for call in calls}) == 5
    _, again = HermesToolParser().parse(text)
    assert not {c.id for c in calls} & {c.id for c in again}


def test_mistral_ids_fit_mistral_templates() -> None:
    _, calls = MistralToolParser().parse('[TOOL_CALLS][{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]')
    assert len(calls) == 2
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", call.id) for call in calls)


# --- Choosing a parser from the chat template -----------------------------------------

QWEN25_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- endif %}"""

HERMES2PRO_TEMPLATE = r"""{%- for tool_call in message.tool_calls %}
    {{- '\n<tool_call>\n' }}
    {%- if tool_call.function is defined %}
        {%- set tool_call = tool_call.function %}
    {%- endif %}
    {{- '{' }}
    {{- '"name": "' }}
    {{- tool_call.name }}
    {{- '"' }}
    {{- ', '}}
    {%- if tool_call.arguments is defined %}
        {{- '"arguments": ' }}
        {{- tool_call.arguments|tojson }}
    {%- endif %}
    {{- '}' }}
    {{- '\n</tool_call>' }}
{%- endfor %}"""

MISTRAL_V03_TEMPLATE = r"""{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {{- tool|tojson }}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
        {%- endif %}
        {{- "[INST] " + message["content"] + "[/INST]" }}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {{- ', "id": "' + tool_call.id + '"}' }}
        {%- endfor %}
        {{- "]" + eos_token }}
    {%- endif %}
{%- endfor %}"""

LLAMA31_TEMPLATE = r"""{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{%- for message in messages %}
    {%- if 'tool_calls' in message %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
        {%- else %}
            {{- '{"name": "' + tool_call.name + '", "parameters": ' + tool_call.arguments | tojson + "}" }}
        {%- endif %}
    {%- endif %}
{%- endfor %}"""

LLAMA32_TOOL_ROLE_TEMPLATE = r"""{%- for message in messages %}
    {%- if message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {{- message.content | tojson }}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}"""

SMOLLM2_TEMPLATE = r"""{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system
You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>
' }}{% endif %}{{'<|im_start|>' + message['role'] + '
' + message['content'] + '<|im_end|>' + '
'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant
' }}{% endif %}"""

LLAMA3_NO_TOOLS_TEMPLATE = r"""{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>

'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"""

DEEPSEEK_R1_TEMPLATE = r"""{%- if message['role'] == 'assistant' and message['content'] is none %}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}{%- endif %}"""


@pytest.mark.parametrize(
    "template, expected",
    [
        (QWEN25_TEMPLATE, "hermes"),
        (HERMES2PRO_TEMPLATE, "hermes"),
        (MISTRAL_V03_TEMPLATE, "mistral"),
        (LLAMA31_TEMPLATE, "llama3_json"),
        (LLAMA32_TOOL_ROLE_TEMPLATE, "llama3_json"),
        (SMOLLM2_TEMPLATE, None),
        (LLAMA3_NO_TOOLS_TEMPLATE, None),
        (DEEPSEEK_R1_TEMPLATE, None),
        ("", None),
    ],
    ids=[
        "qwen2.5",
        "hermes2pro",
        "mistral-v0.3",
        "llama3.1",
        "llama3.2-ipython-role",
        "smollm2",
        "llama3-no-tools",
        "deepseek-r1",
        "empty",
    ],
)
def test_guess_parser(template: str, expected: str | None) -> None:
    assert guess_parser(template) == expected
    if expected is not None:
        assert expected in PARSERS


def test_parser_registry() -> None:
    assert {
        "hermes": HermesToolParser,
        "qwen": HermesToolParser,
        "llama3_json": Llama3JsonToolParser,
        "mistral": MistralToolParser,
        "json_tool_calls": JsonToolCallsParser,
    }.items() <= PARSERS.items()
