"""LangChain's ChatAnthropic, pointed at the server with base_url, speaks the Messages
API: plain chat (unary and streamed alike), tool calling and with_structured_output."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from conftest import MODEL

langchain_anthropic = pytest.importorskip("langchain_anthropic")


class Weather(BaseModel):
    """The weather in a city."""

    sunny: bool = Field(description="whether it is sunny")
    degrees: int = Field(description="the temperature in Celsius", ge=-50, le=50)


def get_weather(city: str) -> str:
    """The current weather of a city."""
    return "sunny"


def chat_model(server, max_tokens: int):
    return langchain_anthropic.ChatAnthropic(
        model=MODEL, base_url=server.base_url, api_key="unused", max_tokens=max_tokens, temperature=0, max_retries=0
    )


@pytest.fixture(scope="module")
def llm(server):
    return chat_model(server, 40)


@pytest.fixture(scope="module")
def caller(server):
    """Room for a forced call's JSON, whitespace and all: the call ends well before."""
    return chat_model(server, 160)


def test_plain_chat_streams_what_it_answers(llm):
    reply = llm.invoke("Tell me a short story about a lighthouse keeper.")
    assert isinstance(reply.content, str) and reply.content
    assert reply.response_metadata["stop_reason"] in ("end_turn", "max_tokens")
    assert reply.usage_metadata["input_tokens"] > 0 and 0 < reply.usage_metadata["output_tokens"] <= 40
    streamed = "".join(chunk.text for chunk in llm.stream("Tell me a short story about a lighthouse keeper."))
    assert streamed == reply.content


def test_tool_calling(caller):
    reply = caller.bind_tools([get_weather], tool_choice="get_weather").invoke("What is the weather in Paris?")
    [call] = reply.tool_calls
    assert call["name"] == "get_weather" and call["id"].startswith("toolu_")
    assert isinstance(call["args"].get("city"), str)


def test_with_structured_output(caller):
    answer = caller.with_structured_output(Weather).invoke("Is it sunny in Paris, and how warm?")
    assert isinstance(answer, Weather)
