"""The container image, built from this checkout and run as a user would run it.

Built as an air-gapped site builds it: a base image made from Debian's packages
(scripts/make-base-image, kept for the day), the wheelhouse made from the checkout and
the image installed from it alone (scripts/build-image). Then run with podman on a
read-only root file system with one empty volume, as the image's own user (not root):
warm (the model cache built into the image) it serves chat and, on SIGTERM in the
middle of a stream, finishes that stream and exits 0; cold (without the image's cache)
it converts the model into the volume.

Needs root, podman, runc and mmdebstrap (`.ci/run` installs them and sets
OVTRIO_REQUIRE_CONTAINER_TEST=1, which turns a missing tool into a failure, not a skip).
Marked `container`: `pytest -m container` runs only this, `-m "not container"` all else.
The figures (image size, start-to-ready warm and cold) are printed (`-s` shows them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

import loopback
from conftest import free_port

pytestmark = pytest.mark.container

ROOT = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
IMAGE = f"localhost/ovtrio:{VERSION}"  # scripts/build-image's default tag, deploy/'s image
MODEL = "SmolLM2-135M-Instruct"
VOLUME = "/var/lib/ovtrio"
PREBUILT = "/opt/ovtrio/model-cache"
USER_ID = 1000
# Podman's default runtime (crun) refuses some machines' cgroup setup; runc runs there.
RUN = ["podman", "--runtime", "runc", "run"]
LIMITS = ["--network=host", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
READY_WITHIN = 600  # seconds; a cap for a start that hangs, not a figure to meet


def require(condition: bool, reason: str) -> None:
    if not condition:
        if os.environ.get("OVTRIO_REQUIRE_CONTAINER_TEST"):
            pytest.fail(reason)
        pytest.skip(reason)


def podman(*args: str, timeout: float = 120) -> str:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"podman {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def image_id(name: str) -> str | None:
    done = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", name], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


@pytest.fixture(scope="module")
def built() -> tuple[str, str, str]:
    """The image, built now from the checkout (the base image is reused for the day),
    its base, and the checkout's commit when the build began."""
    missing = [tool for tool in ("podman", "runc", "mmdebstrap") if shutil.which(tool) is None]
    require(not missing, f"needs {', '.join(missing)} (apt-get install podman runc mmdebstrap)")
    require(os.geteuid() == 0, "builds and runs images as root")
    started = time.monotonic()
    base = subprocess.run([ROOT / "scripts" / "make-base-image"], capture_output=True, text=True, timeout=1200)
    assert base.returncode == 0, base.stderr
    based = time.monotonic()
    previous = image_id(IMAGE)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    revision = head.stdout.strip() if head.returncode == 0 else "unknown"
    build = subprocess.run(
        # chroot isolation: builds where the runtime cannot make cgroups; no layers kept:
        # every build's install differs (ovtrio's wheel), and kept layers would pile up.
        [ROOT / "scripts" / "build-image", "--base", base.stdout.strip(), "--", "--isolation=chroot", "--layers=false"],
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert build.returncode == 0, build.stdout[-5000:] + build.stderr[-5000:]
    built = image_id(IMAGE)
    if previous and previous != built:
        subprocess.run(["podman", "rmi", previous], capture_output=True)  # the last run's, now untagged
    size = int(podman("image", "inspect", "--format", "{{.Size}}", IMAGE))
    print(
        f"\nimage {IMAGE}: {size / 1e6:.0f} MB; base {base.stdout.strip()} in {based - started:.0f} s,"
        f" wheelhouse and image in {time.monotonic() - based:.0f} s"
    )
    return IMAGE, base.stdout.strip(), revision


@pytest.fixture(scope="module")
def image(built: tuple[str, str, str]) -> str:
    return built[0]


@dataclass
class Container:
    name: str
    base_url: str
    volume: Path
    ready_seconds: float

    def logs(self) -> str:
        done = subprocess.run(["podman", "logs", self.name], capture_output=True, text=True, timeout=60)
        return done.stdout + done.stderr

    def wait(self) -> int:
        return int(podman("wait", self.name, timeout=120))


@pytest.fixture
def volume() -> Iterator[Path]:
    """An empty folder for the container's volume, owned by the image's user (as a
    Kubernetes emptyDir with fsGroup is)."""
    folder = Path(tempfile.mkdtemp(prefix="ovtrio-volume-"))
    os.chown(folder, USER_ID, USER_ID)
    folder.chmod(0o750)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def start(image: str, volume: Path) -> Iterator:
    names: list[str] = []

    def start(*podman_flags: str) -> Container:
        """The image run on a read-only root (no tmpfs either) with `volume`, as its own
        user, once /health/ready says so; the time that took."""
        port = free_port()
        name = f"ovtrio-test-{port}"
        names.append(name)
        started = time.monotonic()
        podman_run = [
            *RUN,
            "--detach",
            "--name",
            name,
            "--read-only",
            "--read-only-tmpfs=false",
            "--volume",
            f"{volume}:{VOLUME}",
            *LIMITS,
            *podman_flags,
            image,
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        done = subprocess.run(podman_run, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        container = Container(name, f"http://127.0.0.1:{port}", volume, 0.0)
        deadline = started + READY_WITHIN
        while True:
            try:
                if loopback.get(container.base_url + "/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            running = podman("inspect", "--format", "{{.State.Running}}", name)
            assert running == "true", f"the container exited: {container.logs()}"
            assert time.monotonic() < deadline, f"running, not ready in {READY_WITHIN} s (a hang): {container.logs()}"
            time.sleep(0.1)
        container.ready_seconds = time.monotonic() - started
        pid = int(podman("inspect", "--format", "{{.State.Pid}}", name))
        assert os.stat(f"/proc/{pid}").st_uid == USER_ID  # the image's user, not root
        return container

    yield start
    for name in names:
        subprocess.run(["podman", "rm", "--force", "--time", "0", name], capture_output=True, timeout=120)


def chat(container: Container) -> None:
    client = openai.OpenAI(base_url=container.base_url + "/v1", api_key="none", timeout=120)
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 4


def test_warm_start_serves_and_drains_a_stream_on_sigterm(start):
    container = start()
    print(f"\nstart to ready, warm (model cache in the image): {container.ready_seconds:.1f} s")
    assert f"(cached in {PREBUILT}/gguf/" in container.logs()
    chat(container)

    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count to a thousand."}],
        "max_tokens": 160,
        "ignore_eos": True,
        "stream": True,
    }
    events: list[str] = []
    after_signal = 0
    with loopback.stream("POST", container.base_url + "/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[len("data: ") :])
            if len(events) == 3:
                podman("kill", "--signal", "TERM", container.name)
            elif len(events) > 3:
                after_signal += 1
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert after_signal > 1  # the stream went on after SIGTERM, to its end
    assert container.wait() == 0, container.logs()
    assert not list(container.volume.rglob("*.gguf"))


def test_cold_start_converts_into_the_volume(start, volume):
    container = start("--env", "OVTRIO_PREBUILT_CACHE_DIR=")
    print(f"\nstart to ready, cold (conversion into the volume): {container.ready_seconds:.1f} s")
    logs = container.logs()
    # The model file belongs to root in the image: the engine reads a private copy.
    assert "converting a private copy" in logs and f"converted and cached in {VOLUME}/cache/gguf/" in logs, logs
    chat(container)
    podman("kill", "--signal", "TERM", container.name)
    assert container.wait() == 0, container.logs()
    (entry,) = (volume / "cache" / "gguf").iterdir()
    assert (entry / "entry.json").is_file() and (entry / "openvino_model.bin").is_file()
    assert not list(volume.rglob("*.gguf"))


def files_of(root: Path) -> set[str]:
    return {
        "/" + os.path.relpath(os.path.join(folder, name), root)
        for folder, dirs, files in os.walk(root)
        for name in dirs + files
    }


def test_the_image_holds_no_build_tools(built):
    """Only the installed environment reached the final stage: beside what the base image
    has (Debian's python3-venv brings the wheels of pip and setuptools that ensurepip
    installs), no compiler, no wheels, no pip cache, and no pip in ovtrio's environment."""
    image, base, revision = built
    base_root = Path(podman("image", "mount", base))
    try:
        in_base = files_of(base_root)
    finally:
        podman("image", "unmount", base)
    root = Path(podman("image", "mount", image))
    try:
        found = []
        for folder, _dirs, files in os.walk(root):
            relative = "/" + os.path.relpath(folder, root)
            files = [name for name in files if f"{relative}/{name}" not in in_base]
            if relative.endswith("/.cache/pip") or (
                relative.startswith("/opt/ovtrio/venv")
                and (relative.endswith(("/site-packages/pip", "/site-packages/setuptools")))
            ):
                found.append(relative)
            found += [f"{relative}/{name}" for name in files if name.endswith(".whl")]
            found += [
                f"{relative}/{name}"
                for name in files
                if relative in ("/usr/bin", "/usr/local/bin") and name in ("gcc", "cc", "g++", "make")
            ]
        assert not found
        assert (root / "opt/ovtrio/venv/bin/ovtrio").is_file()
        assert list((root / PREBUILT.lstrip("/") / "gguf").glob("*/entry.json"))
    finally:
        podman("image", "unmount", image)
    labels = json.loads(podman("image", "inspect", "--format", "{{json .Labels}}", image))
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.revision"] == revision
