"""A vision-language model's engine tokenizes the prompt text itself, adding what its
tokenizer adds (BOS, for Gemma's and Llama's); when the chat template writes BOS too,
the engine must not run it twice, and `usage.prompt_tokens` counts what it runs.

The tiny VLM fixture with a tokenizer that adds BOS (`<|im_start|>`, which SmolLM2's
template, the fixture's, also writes first): a chat request must run exactly the tokens
of a raw completions prompt holding the same conversation without that first BOS (the
engine adds one), so both give the same greedy tokens and log-probabilities and the
same prompt_tokens, which is also the count the engine itself reports for that text.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import pytest

import tiny_vlm
from helpers import post
from server_pool import server_fixture

MODEL = "vlm"
BOS = "<|im_start|>"
MESSAGES = [{"role": "user", "content": "Describe this, then say more."}]
# The conversation as the fixture's template writes it.
RENDERED = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nDescribe this, then say more.<|im_end|>\n<|im_start|>assistant\n"
)


@functools.cache
def built() -> Path:
    """The fixture with a tokenizer that adds BOS, built once for both servers."""
    root = Path(tempfile.mkdtemp(prefix="bos-vlm-"))
    atexit.register(shutil.rmtree, root, True)
    return tiny_vlm.add_bos_to_tokenizer(tiny_vlm.build(root / "vlm"))


def copy_in(folder: Path) -> None:
    shutil.copytree(built(), folder / "vlm")


bos_vlm_server = server_fixture(
    "bos_vlm_server", "--model", "{folder}/vlm", "--served-model-name", MODEL, prepare=copy_in
)
# The same model with a template that writes no BOS: the engine's tokenizer adds one.
PLAIN_TEMPLATE = "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\\n' }}{% endfor %}"
vlm_without_template_bos = server_fixture(
    "vlm_without_template_bos",
    "--model",
    "{folder}/vlm",
    "--served-model-name",
    MODEL,
    "--chat-template",
    "{plain.jinja}",
    files={"plain.jinja": PLAIN_TEMPLATE},
    prepare=copy_in,
)


def engine_input_tokens(folder: Path, text: str) -> int:
    """How many tokens the engine runs for `text` (VLMPipeline's own count)."""
    import openvino_genai

    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = 1
    config.apply_chat_template = False
    result = openvino_genai.VLMPipeline(str(folder), "CPU").generate(text, images=[], generation_config=config)
    return int(result.perf_metrics.get_num_input_tokens())


def chat_and_raw(server, rendered: str) -> tuple[dict, dict]:
    """A greedy chat reply to MESSAGES, and one to the raw prompt `rendered` (the
    conversation as the engine should run it, less the BOS its tokenizer adds)."""
    params = {"model": MODEL, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    chat = post(server.base_url, "/v1/chat/completions", {**params, "messages": MESSAGES, "logprobs": True})
    raw = post(server.base_url, "/v1/completions", {**params, "prompt": rendered, "logprobs": 0})
    assert chat.status_code == 200, chat.text
    assert raw.status_code == 200, raw.text
    return chat.json(), raw.json()


@pytest.fixture(scope="module")
def replies(bos_vlm_server):
    return chat_and_raw(bos_vlm_server, RENDERED[len(BOS) :])


def check_same_tokens_run(chat: dict, raw: dict) -> None:
    chat_logprobs = [entry["logprob"] for entry in chat["choices"][0]["logprobs"]["content"]]
    raw_logprobs = raw["choices"][0]["logprobs"]["token_logprobs"]
    assert len(chat_logprobs) == len(raw_logprobs) == 4
    assert chat_logprobs == pytest.approx(raw_logprobs, abs=1e-5)


def test_the_template_renders_as_this_test_expects(bos_vlm_server):
    tokenized = post(bos_vlm_server.base_url, "/tokenize", {"model": MODEL, "messages": MESSAGES})
    assert tokenized.status_code == 200, tokenized.text
    assert tokenized.json()["tokens"][0] == 1
    prompt = post(bos_vlm_server.base_url, "/tokenize", {"model": MODEL, "prompt": "a"}).json()["tokens"]
    assert prompt[0] == 1  # the tokenizer adds BOS


def test_a_chat_prompt_runs_one_bos(replies):
    check_same_tokens_run(*replies)


def test_prompt_tokens_count_what_the_engine_runs(bos_vlm_server, replies):
    chat, raw = replies
    engine = engine_input_tokens(bos_vlm_server.log_path.parent / "vlm", RENDERED[len(BOS) :])
    assert chat["usage"]["prompt_tokens"] == raw["usage"]["prompt_tokens"] == engine


def test_a_template_without_bos_counts_the_one_the_engine_adds(vlm_without_template_bos):
    rendered = "user: " + MESSAGES[0]["content"] + "\n"
    chat, raw = chat_and_raw(vlm_without_template_bos, rendered)
    check_same_tokens_run(chat, raw)
    engine = engine_input_tokens(vlm_without_template_bos.log_path.parent / "vlm", rendered)
    assert chat["usage"]["prompt_tokens"] == raw["usage"]["prompt_tokens"] == engine
