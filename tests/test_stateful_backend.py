"""The stateful backend (OpenVINO GenAI's LLMPipeline, one request at a time; what the
NPU runs) on the embedded model on CPU, through the same API as the other backend.

One server serves every test: `--max-prompt-len` makes the prompt limit testable, and a
queue of one request makes the third concurrent request a 429. Nothing here depends on
what the model writes: outputs are compared with others of the same run, or forced
(max_tokens with ignore_eos, stop strings taken from an earlier output).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import openai
import pytest

from conftest import RunningServer, free_port
from helpers import ENDS_BY_ITSELF, assert_error, chat, chat_body, completion_body, pick_stop_word, post
from server_pool import server_fixture
from sse import MODEL, check_chat_stream

MAX_PROMPT_LEN = 200
stateful_server = server_fixture(
    "stateful_server", "--backend", "stateful", "--max-prompt-len", str(MAX_PROMPT_LEN), "--max-queued-requests", "1"
)

QUESTION = [{"role": "user", "content": "Tell me a short story about a cat."}]


@pytest.fixture(scope="module")
def sdk(stateful_server: RunningServer):
    with openai.OpenAI(base_url=stateful_server.v1, api_key="unused", max_retries=0, timeout=120) as client:
        yield client


def greedy_chat(sdk: openai.OpenAI, messages: list[dict[str, Any]] = QUESTION, **params: Any) -> Any:
    extra = {"ignore_eos": params.pop("ignore_eos")} if "ignore_eos" in params else None
    return sdk.chat.completions.create(model=MODEL, messages=messages, temperature=0, extra_body=extra, **params)


def streamed_chat(sdk: openai.OpenAI, messages: list[dict[str, Any]] = QUESTION, **params: Any) -> Any:
    extra = {"ignore_eos": params.pop("ignore_eos")} if "ignore_eos" in params else None
    stream = sdk.chat.completions.create(
        model=MODEL,
        messages=messages,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
        **params,
    )
    return check_chat_stream([chunk.model_dump(exclude_unset=True) for chunk in stream], include_usage=True)


def wait_for_metric(server: RunningServer, name: str, value: float, within: float = 10) -> None:
    deadline = time.monotonic() + within
    while (current := server.metric(name)) != value:
        assert time.monotonic() < deadline, f"{name} is {current}, not {value}, after {within} s"
        time.sleep(0.05)


def test_unary_chat_and_completion_stop_at_max_tokens(stateful_server: RunningServer, sdk: openai.OpenAI) -> None:
    finished_before = stateful_server.metric("vllm:request_success_total", model_name=MODEL, finished_reason="length")
    reply = greedy_chat(sdk, max_tokens=12, ignore_eos=True)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 12 and reply.usage.prompt_tokens > 0
    assert reply.choices[0].message.content
    raw = chat(stateful_server.base_url, max_tokens=3, ignore_eos=True, temperature=0)  # checks the schema
    assert raw.finish_reason == "length" and raw.usage["completion_tokens"] == 3
    text = sdk.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=7, temperature=0, extra_body={"ignore_eos": True}
    )
    assert text.choices[0].finish_reason == "length" and text.usage.completion_tokens == 7
    assert text.choices[0].text
    # Metrics per model, as the scheduler reports them.
    after = stateful_server.metric("vllm:request_success_total", model_name=MODEL, finished_reason="length")
    assert after == finished_before + 3
    assert stateful_server.metric("ovtrio_requests_running") == 0
    assert stateful_server.metric("ovtrio_kv_cache_usage_percent") == 0


def test_streamed_output_equals_unary_output(sdk: openai.OpenAI) -> None:
    unary = greedy_chat(sdk, max_tokens=24, ignore_eos=True)
    streamed = streamed_chat(sdk, max_tokens=24, ignore_eos=True)
    assert streamed.text == unary.choices[0].message.content
    assert streamed.finish_reason == unary.choices[0].finish_reason == "length"
    assert streamed.usage["completion_tokens"] == unary.usage.completion_tokens == 24
    assert streamed.usage["prompt_tokens"] == unary.usage.prompt_tokens
    assert len(streamed.chunks) > 3  # it really streamed


def test_a_stop_string_cuts_the_output_where_it_first_occurs(sdk: openai.OpenAI) -> None:
    full = greedy_chat(sdk, max_tokens=40, ignore_eos=True).choices[0].message.content
    stop, at = pick_stop_word(full)
    cut = greedy_chat(sdk, max_tokens=40, ignore_eos=True, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == full[:at]
    streamed = streamed_chat(sdk, max_tokens=40, ignore_eos=True, stop=[stop])
    assert streamed.finish_reason == "stop"
    assert streamed.text == full[: at + len(stop)]  # streamed output includes the stop string


def test_a_cancelled_stream_frees_the_engine_for_the_next_request(stateful_server: RunningServer) -> None:
    body = chat_body(QUESTION[0]["content"], max_tokens=4000, ignore_eos=True, stream=True)
    with httpx.Client(base_url=stateful_server.base_url, timeout=30) as http:
        with http.stream("POST", "/v3/chat/completions", json=body) as response:
            assert response.status_code == 200
            # Held in a name so the stream stays open after the loop: a dropped line
            # iterator closes the response, which would cancel the request too early.
            lines = response.iter_lines()
            events = 0
            for line in lines:
                if line.startswith("data: "):
                    events += 1
                    if events == 3:
                        break
            assert stateful_server.metric("ovtrio_engine_requests") == 1
    wait_for_metric(stateful_server, "ovtrio_requests_running", 0)
    wait_for_metric(stateful_server, "ovtrio_engine_requests", 0)
    settled = stateful_server.metric("ovtrio_generated_tokens_total")
    time.sleep(0.5)
    assert stateful_server.metric("ovtrio_generated_tokens_total") == settled, "tokens are still being generated"
    response = post(stateful_server.base_url, "/v3/chat/completions", chat_body("Hi", max_tokens=4, ignore_eos=True))
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 4
    # The engine made those four tokens and nothing more for the stream that was left.
    assert stateful_server.metric("ovtrio_generated_tokens_total") == settled + 4


def test_concurrent_requests_run_one_after_the_other_with_their_own_output(
    stateful_server: RunningServer, sdk: openai.OpenAI
) -> None:
    prompts = [QUESTION, [{"role": "user", "content": "What is the capital of France?"}]]
    alone = [greedy_chat(sdk, p, max_tokens=32, ignore_eos=True).choices[0].message.content for p in prompts]
    together: dict[int, str] = {}
    peak_running = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal peak_running
        while not done.is_set():
            peak_running = max(peak_running, int(stateful_server.metric("ovtrio_requests_running")))
            time.sleep(0.02)

    def one(i: int) -> None:
        together[i] = greedy_chat(sdk, prompts[i], max_tokens=32, ignore_eos=True).choices[0].message.content

    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    done.set()
    watcher.join()
    assert [together[0], together[1]] == alone
    assert peak_running == 1


def test_a_full_queue_answers_429(stateful_server: RunningServer) -> None:
    """One request runs, one waits (--max-queued-requests 1): the third is refused."""
    long = chat_body(QUESTION[0]["content"], max_tokens=4000, ignore_eos=True, stream=True)
    waiting: dict[str, Any] = {}

    def queued() -> None:
        waiting["response"] = post(stateful_server.base_url, "/v3/chat/completions", chat_body("Hi", max_tokens=2))

    with httpx.Client(base_url=stateful_server.base_url, timeout=60) as http:
        with http.stream("POST", "/v3/chat/completions", json=long) as running:
            assert running.status_code == 200
            lines = running.iter_lines()  # held: dropping it would close the stream
            next(line for line in lines if line.startswith("data: "))
            thread = threading.Thread(target=queued)
            thread.start()
            wait_for_metric(stateful_server, "ovtrio_requests_waiting", 1)
            refused = post(stateful_server.base_url, "/v3/chat/completions", chat_body("Hi", max_tokens=2))
            assert_error(refused, 429, param=None, type=refused.json()["error"]["type"])
            assert int(refused.headers["Retry-After"]) >= 1
    thread.join(timeout=60)
    assert waiting["response"].status_code == 200  # served once the running one left


def test_a_prompt_beyond_max_prompt_len_is_refused_naming_the_limit(stateful_server: RunningServer) -> None:
    long_text = "word " * (MAX_PROMPT_LEN + 50)
    for path, body, param in [
        ("/v3/chat/completions", chat_body(long_text, max_tokens=4), "messages"),
        ("/v3/completions", completion_body(long_text, max_tokens=4), "prompt"),
    ]:
        error = assert_error(
            post(stateful_server.base_url, path, body), 400, param=param, code="context_length_exceeded"
        )
        assert str(MAX_PROMPT_LEN) in error["message"] and "--max-prompt-len" in error["message"]
    # A prompt within the limit is served.
    response = post(stateful_server.base_url, "/v3/completions", completion_body("word " * 20, max_tokens=2))
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("path", "fields", "param"),
    [
        ("/v3/chat/completions", {"n": 2}, "n"),
        ("/v3/completions", {"n": 2}, "n"),
        ("/v3/completions", {"best_of": 2}, "best_of"),
        ("/v3/chat/completions", {"best_of": 3}, "best_of"),
        ("/v3/chat/completions", {"logprobs": True}, "logprobs"),
        ("/v3/completions", {"logprobs": 1}, "logprobs"),
        ("/v3/completions", {"echo": True, "logprobs": 0}, "logprobs"),
        ("/v3/completions", {"prompt_logprobs": 1}, "prompt_logprobs"),
        ("/v3/completions", {"prompt": ["one", "two"]}, "prompt"),
    ],
)
def test_what_the_backend_cannot_do_is_refused_naming_the_field(
    stateful_server: RunningServer, path: str, fields: dict[str, Any], param: str | None
) -> None:
    body = chat_body("Hi", max_tokens=4) if "chat" in path else completion_body(max_tokens=4)
    generated = stateful_server.metric("ovtrio_generated_tokens_total")
    assert_error(post(stateful_server.base_url, path, {**body, **fields}), 400, param=param)
    assert stateful_server.metric("ovtrio_generated_tokens_total") == generated


def test_constrained_output_runs_on_the_stateful_pipeline(sdk: openai.OpenAI) -> None:
    reply = sdk.chat.completions.create(
        model=MODEL,
        temperature=0,
        max_tokens=16,
        messages=ENDS_BY_ITSELF["messages"],
        response_format=ENDS_BY_ITSELF["response_format"],
    )
    assert json.loads(reply.choices[0].message.content) in (True, False)
    assert reply.choices[0].finish_reason == "stop"


def test_speculative_decoding_is_refused_at_startup_in_one_line() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ovtrio",
            "serve",
            "--port",
            str(free_port()),
            "--backend",
            "stateful",
            "--prompt-lookup",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    assert result.returncode != 0
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "--prompt-lookup" in lines[0] and "stateful" in lines[0], lines
