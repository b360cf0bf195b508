"""Clients of Ollama's API other than its Python package, unmodified, against a real
server: LangChain's ChatOllama and LlamaIndex's Ollama (chat, streamed and not, and
structured output), and Ollama's JavaScript client (npm `ollama`, pinned in
tests/js/package.json, installed into a cache folder by npm on first use) running
chat, generate, format, a tool call round trip, embed, list, ps, show and version.

Every body the Python clients receive is checked against Ollama's Go types as it
arrives (ollama_schema.CheckingTransport); what the JavaScript client returns (the
bodies as it parsed them) is checked against them too. Nothing asserts what the model
writes."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import ollama
from langchain_core.messages import AIMessage, HumanMessage
from langchain_ollama import ChatOllama
from llama_index.core.llms import ChatMessage
from llama_index.llms.ollama import Ollama
from pydantic import BaseModel, Field

import ollama_schema
from conftest import MODEL
from js_clients import js_clients  # noqa: F401 (the fixture)
from ollama_schema import CheckingTransport

EMBEDDER = "all-MiniLM-L6-v2"
STORY = "Tell me a short story about a lighthouse keeper."


class Answer(BaseModel):
    sky_is_blue: bool
    colour: str = Field(max_length=12)


# ---- LangChain ----------------------------------------------------------------------------


def chat_ollama(server: Any, transport: CheckingTransport, **fields: Any) -> ChatOllama:
    return ChatOllama(
        model=MODEL,
        base_url=server.base_url,
        sync_client_kwargs={"transport": transport},
        **{"temperature": 0, "num_predict": 12, **fields},
    )


def test_langchain_chat_ollama(server):
    transport = CheckingTransport()
    llm = chat_ollama(server, transport)
    reply = llm.invoke([HumanMessage(STORY)])
    assert isinstance(reply, AIMessage) and reply.content
    assert reply.usage_metadata is not None and 0 < reply.usage_metadata["output_tokens"] <= 12
    assert reply.response_metadata["done_reason"] in ("stop", "length")
    streamed = "".join(str(chunk.content) for chunk in llm.stream([HumanMessage(STORY)]))
    assert streamed == reply.content
    structured = chat_ollama(server, transport, num_predict=60).with_structured_output(Answer, method="json_schema")
    answer = structured.invoke("Is the sky blue? Say which colour it is.")
    assert isinstance(answer, Answer)
    assert transport.checked.count("/api/chat") >= 4


# ---- LlamaIndex ---------------------------------------------------------------------------


def test_llamaindex_ollama(server):
    transport = CheckingTransport()
    client = ollama.Client(host=server.base_url, timeout=120, transport=transport)
    llm = Ollama(
        model=MODEL, base_url=server.base_url, client=client, temperature=0, additional_kwargs={"num_predict": 12}
    )
    # The context window is read from /api/show's model_info.
    assert llm.metadata.context_window > 0
    assert "/api/show" in transport.checked
    reply = llm.chat([ChatMessage(role="user", content=STORY)])
    assert reply.message.content and reply.raw is not None and reply.raw["done"] is True
    streamed = list(llm.stream_chat([ChatMessage(role="user", content=STORY)]))
    assert streamed[-1].message.content == reply.message.content
    assert llm.complete("The capital of France is").text
    assert transport.checked.count("/api/chat") >= 3


# ---- the JavaScript client ----------------------------------------------------------------


def test_the_javascript_client(server, js_clients):
    run = subprocess.run(
        ["node", str(js_clients / "ollama_client.mjs"), server.base_url, MODEL, EMBEDDER],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    results = {line["call"]: line for line in map(json.loads, run.stdout.splitlines())}
    refused = {name: line for name, line in results.items() if "error" in line}
    assert set(refused) == {"missing"}, refused
    assert refused["missing"]["status"] == 404
    got = {name: line["result"] for name, line in results.items() if "result" in line}

    def check(path: str, value: Any) -> Any:
        return ollama_schema.check_record(path, value)

    chat = check("/api/chat", got["chat"])
    parts = [check("/api/chat", part) for part in got["chat_stream"]]
    assert "".join(p["message"]["content"] for p in parts) == chat["message"]["content"]
    assert parts[-1]["eval_count"] == chat["eval_count"] <= 12
    generate = check("/api/generate", got["generate"])
    pieces = [check("/api/generate", part) for part in got["generate_stream"]]
    assert "".join(p["response"] for p in pieces) == generate["response"]
    formatted = check("/api/chat", got["format"])
    assert formatted["done_reason"] == "stop" and isinstance(json.loads(formatted["message"]["content"])["blue"], bool)
    call = check("/api/chat", got["tool_call"])["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather" and isinstance(call["arguments"]["city"], str)
    answer = check("/api/chat", got["tool_result"])
    assert answer["done"] is True and answer["prompt_eval_count"] > got["tool_call"]["prompt_eval_count"]
    embedded = check("/api/embed", got["embed"])
    assert len(embedded["embeddings"]) == 2
    assert len(check("/api/embeddings", got["embeddings"])["embedding"]) == len(embedded["embeddings"][0])
    assert MODEL + ":latest" in {m["name"] for m in check("/api/tags", got["list"])["models"]}
    assert MODEL + ":latest" in {m["name"] for m in check("/api/ps", got["ps"])["models"]}
    assert "completion" in check("/api/show", got["show"])["capabilities"]
    assert check("/api/version", got["version"])["version"]
