"""`python tests/scripted_server.py serve ...`: ovtrio serving the embedded model's
tokenizer and chat templates as usual, whose engine writes scripted replies instead of
the model's (tests/fake_engine.py's pipeline, replaying text).

Everything but the engine's choice of tokens is the real server: the chat template
renders the prompt, the tokenizer encodes it and decodes the reply, the scheduler
streams it, and the API reads it. That is how a family's output format (gpt-oss's
harmony, Qwen3-Coder's XML, ...) is fed through the server without the family's
weights. The script is a JSON list of {"when": text, "reply": text} in the file named by
OVTRIO_TEST_SCRIPT: a request gets the reply of the rule whose `when` occurs latest in
its decoded prompt (the newest message decides, so a conversation's tool result can
pick the answer that follows it), and an empty reply when none occurs. The reply is
encoded with the model's tokenizer and written a token a step; it ends with the reason
"stop", or "length" at max_tokens.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

# Run as a script: its own folder (the fake engine) and the checkout (ovtrio, when it is
# not installed) are not on the path by themselves.
sys.path.insert(0, str(Path(__file__).parent.parent))
sys.path.insert(0, str(Path(__file__).parent))

from fake_engine import FakeHandle, FakeOutput, FakePipeline, Reason, Status


class ScriptedPipeline(FakePipeline):
    def __init__(self, real: Any, tokenizer: Any, rules: list[dict[str, str]]) -> None:
        super().__init__()
        self._real = real
        self._tokenizer = tokenizer
        self._rules = rules
        self._scripts: dict[int, list[int]] = {}  # handle id: the tokens still to write

    def get_config(self) -> Any:
        return self._real.get_config()

    def _reply(self, prompt: str) -> str:
        best, reply = -1, ""
        for rule in self._rules:
            at = prompt.rfind(rule["when"])
            if at > best:
                best, reply = at, rule["reply"]
        return reply

    def add_request(self, request_id: int, prompt: Any, *images_and_config: Any) -> FakeHandle:
        *_, config = images_and_config
        ids = prompt.data[0].tolist()
        reply = self._reply(self._tokenizer.decode(ids, skip_special_tokens=False))
        tokens = self._tokenizer.encode(reply, add_special_tokens=False).input_ids.data[0].tolist() if reply else []
        handle = FakeHandle(config.max_new_tokens, False, ids, self.steps)
        self.handles.append(handle)
        self._scripts[id(handle)] = tokens
        return handle

    def step(self) -> None:
        self.steps += 1
        for handle in self._running():
            if handle.cancelled:
                continue
            script = self._scripts[id(handle)]
            tokens = [script.pop(0)] if script else []
            handle.left -= 1
            if not script or handle.left == 0:
                handle.status = Status.FINISHED
                reason = Reason.STOP if not script else Reason.LENGTH
            else:
                reason = Reason.NONE
            handle.unread.append(FakeOutput(tokens, [0.0] * len(tokens), 0.0, reason))


# What only a model's name, prompt and parsing depend on, not its pipeline.
_NOT_THE_ENGINES = {"served_model_name", "chat_template", "parse_special_in_content", "tool_parser", "reasoning_parser"}


def _engine_files(path: Path) -> str:
    """What the pipeline of the model at `path` is made of, but its tokenizer: a GGUF
    file, or an IR folder's model files wherever they are linked from and its configs
    (folders that differ only in their tokenizers, special_tokens_model.py's, share one)."""
    if not path.is_dir():
        return json.dumps([str(path)])
    files = [str((path / name).resolve()) for name in ("openvino_model.xml", "openvino_model.bin")]
    configs = [path / name for name in ("config.json", "generation_config.json")]
    return json.dumps(files + [config.read_text() for config in configs if config.is_file()])


def pipelines_built_once(real_build: Any) -> Any:
    """`real_build` (the loader's tokenizer and pipeline of a model folder) with the
    pipeline compiled once for each model's files and engine settings: the script, not
    the pipeline, writes every reply (the pipeline only warms up and gives its generation
    config), so models of the same files share it; each gets a tokenizer of its own,
    which takes its own chat template and special tokens."""
    import openvino_genai

    built: dict[str, Any] = {}  # a model's files and engine settings: its pipeline

    def build(path: Path, settings: Any, phases: dict[str, float], save: bool = False, on_folder: Any = None) -> Any:
        # The model's files stand for its path.
        key = f"{_engine_files(path)} {settings.model_dump_json(exclude=_NOT_THE_ENGINES | {'model'})}"
        if save or key not in built:
            tokenizer, built[key] = real_build(path, settings, phases, save, on_folder)
            return tokenizer, built[key]
        if on_folder is not None and path.is_dir():
            on_folder(path)
        return openvino_genai.Tokenizer(str(path)), built[key]

    return build


def main() -> None:
    from ovtrio.loading import load as loading
    from ovtrio.loading import thread as load_thread

    rules = json.loads(Path(os.environ["OVTRIO_TEST_SCRIPT"]).read_text())
    real_load = loading.load_and_warm_up

    def load_and_warm_up(source: Any, settings: Any, progress: Any = None) -> Any:
        model, kv_capacity = real_load(source, settings, progress)
        model.pipeline = ScriptedPipeline(model.pipeline, model.tokenizer, rules)
        return model, kv_capacity

    # Each module that calls it by its own name: the load thread (of `ovtrio serve`'s
    # models at start, and of each load on demand).
    loading.load_and_warm_up = load_and_warm_up  # type: ignore[assignment]
    load_thread.load_and_warm_up = load_and_warm_up  # type: ignore[assignment]
    loading._build = pipelines_built_once(loading._build)  # type: ignore[assignment]
    from ovtrio.server.cli import main as serve

    serve()


if __name__ == "__main__":
    main()
