"""Test servers with their own settings, started in the background as soon as the tests
are collected.

Loading the model takes 5-8 s of CPU: started one after the other, as each module
reached its own server, the loads were a third of the suite's time. Here the shared
server starts first and converts the model into the session's model cache (conftest.py);
then the others (only those the collected tests use) start in the order the tests need
them, one at a time, while the tests of the shared server run (conftest.py runs those
first). Each loads the cached model in about half the time, and a module finds its server
ready; one that is needed before its turn is started at once.

One at a time, not two: on 2 cores, two loads beside the shared server's tests slow
everything down. Measured on the same tests and machine: two at a time, the suite used
8:29-9:08 of CPU and took 4:53-5:10; one at a time, 7:39-8:34 and 4:20-4:51.

A module declares its server with `server_fixture(name, *flags, ...)` at import time
(collection), which registers the settings and returns the fixture of that name. The
pool owns every server it started and stops them when the session ends; a test that
must stop its server itself (a restart, a shutdown) takes it out of the pool with
`take()`.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest


@dataclass(frozen=True)
class ServerSpec:
    """How to start one server: `ovtrio serve` flags (or, with `hypercorn`, the app under
    `hypercorn -k trio` configured only by `env`), extra environment, and files written
    into the server's folder first. In a flag or an environment variable, `{folder}`
    becomes the server's folder and `{name}` the path of the file `name`."""

    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    hypercorn: bool = False
    # Called with the server's folder just before it starts (after the files are written).
    prepare: Callable[[Path], None] | None = None


_SPECS: dict[str, ServerSpec] = {}


def server_fixture(
    name: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    files: Mapping[str, str] | None = None,
    hypercorn: bool = False,
    prepare: Callable[[Path], None] | None = None,
) -> Callable[..., Any]:
    """Register a server's settings under `name`, and return the fixture `name` that
    hands the test that server (started early by the pool, ready when handed over)."""
    spec = ServerSpec(tuple(args), dict(env or {}), dict(files or {}), hypercorn, prepare)
    if _SPECS.setdefault(name, spec) != spec:
        raise ValueError(f"two different servers are both called {name}")

    @pytest.fixture(scope="session", name=name)
    def the_server(server_pool: ServerPool) -> Any:
        return server_pool.get(name)

    return the_server


class ServerPool:
    def __init__(
        self,
        starter: Callable[[Path, ServerSpec], Any],
        ready: Callable[[Any], Any],
        settled: Callable[[Any], bool],
        stop: Callable[[Any], None],
    ) -> None:
        """`starter(folder, spec)` launches a server without waiting for it; `ready(launched)`
        waits until it serves and returns what tests use; `settled(launched)` says, without
        waiting, whether it has finished loading (serving, or exited); `stop(server)` stops
        either."""
        self._starter = starter
        self._ready = ready
        self._settled = settled
        self._stop = stop
        self._root = Path(tempfile.mkdtemp(prefix="ovtrio-servers-"))
        self._launched: dict[str, Any] = {}
        self._serving: dict[str, Any] = {}
        self._lock = threading.Lock()  # launches happen in the launcher thread too
        self._queue: list[str] = []  # to be launched by the launcher thread, in this order
        self._launcher_done = threading.Event()
        self._launcher_done.set()
        self._closing = False
        self._stopping: list[threading.Thread] = []  # stops of retired servers

    def start_in_background(
        self, first: str, ready_for_others: Callable[[], bool], others: Iterable[str], at_once: int = 1
    ) -> None:
        """Launch `first` now and, from a thread, `others` in that order once
        `ready_for_others()` holds (or `first` has exited), so the tests go on meanwhile:
        at most `at_once` loading at a time, so the servers needed first are ready first
        and the tests running meanwhile keep their share of the CPU."""
        self.start([first])
        with self._lock:
            self._queue = [name for name in others if name != first]
        self._launcher_done.clear()

        def launch_others() -> None:
            settled: set[int] = set()  # ids of the launched servers known to have settled

            def still_loading(server: Any) -> bool:
                if id(server) not in settled and self._settled(server):
                    settled.add(id(server))
                return id(server) not in settled

            try:
                self.wait_for(first, lambda: ready_for_others() or self._closing)
                while not self._closing:
                    with self._lock:
                        if not self._queue:
                            return
                        launched = list(self._launched.values())
                    loading = sum(1 for server in launched if still_loading(server))
                    if loading < at_once:
                        with self._lock:
                            if self._queue:
                                self._launch(self._queue.pop(0))
                    else:
                        time.sleep(0.1)
            finally:
                self._launcher_done.set()

        threading.Thread(target=launch_others, name="server-pool-launcher", daemon=True).start()

    def start(self, names: Iterable[str]) -> None:
        """Launch the registered servers among `names`, in that order, without waiting."""
        for name in names:
            with self._lock:
                self._launch(name)

    def _launch(self, name: str) -> None:
        """Launch `name` unless it is unknown or launched already (holding the lock)."""
        spec = _SPECS.get(name)
        if spec is None or name in self._launched or name in self._serving:
            return
        folder = self._root / name
        folder.mkdir()
        paths = {"folder": str(folder)}
        for file, text in spec.files.items():
            paths[file] = str(folder / file)
            Path(paths[file]).write_text(text)
        args = tuple(_fill(arg, paths) for arg in spec.args)
        if spec.prepare is not None:
            spec.prepare(folder)
        env = {key: _fill(value, paths) for key, value in spec.env.items()}
        self._launched[name] = self._starter(folder, ServerSpec(args, env, {}, spec.hypercorn))

    def wait_for(self, name: str, condition: Callable[[], bool], timeout: float = 600) -> None:
        """Wait until `condition()` holds, or the launched server `name` has exited (its
        test reports why), or `timeout` seconds (only a cap for a start that hangs: the
        others are then launched anyway, and the test of `name` reports it)."""
        launched = self._launched.get(name)
        deadline = time.monotonic() + timeout
        while not condition() and time.monotonic() < deadline:
            process = getattr(launched, "process", None)
            if process is not None and process.poll() is not None:
                return
            time.sleep(0.1)

    def has_settled(self, name: str) -> bool:
        """Whether the server `name` has finished starting (it serves, or it exited), or
        is not launched at all."""
        with self._lock:
            launched = self._launched.get(name)
        return launched is None or self._settled(launched)

    def get(self, name: str) -> Any:
        """The server `name`, once it serves (launched now if it was not yet: a test
        that needs it goes before those still waiting to be launched)."""
        if name not in self._serving:
            with self._lock:
                if name in self._queue:
                    self._queue.remove(name)
                self._launch(name)
                launched = self._launched.pop(name)
            self._serving[name] = self._ready(launched)
        return self._serving[name]

    def take(self, name: str) -> Any:
        """The server `name`, which the caller now stops (the pool will not)."""
        server = self.get(name)
        del self._serving[name]
        return server

    def retire(self, names: Iterable[str]) -> None:
        """Stop the servers `names`, which no test still to run uses, in a thread: an
        idle server still wakes to look for idle models and trim memory (about 1% of a
        core each), and late in the suite dozens of them would be idle."""
        retired = []
        with self._lock:
            for name in names:
                if name in self._queue:
                    self._queue.remove(name)
                for held in (self._serving, self._launched):
                    if name in held:
                        retired.append(held.pop(name))
        if retired:
            stopping = threading.Thread(target=lambda: [self._stop(server) for server in retired], daemon=True)
            stopping.start()
            self._stopping.append(stopping)

    def close(self) -> None:
        self._closing = True
        self._launcher_done.wait()
        for stopping in self._stopping:
            stopping.join()
        for server in [*self._serving.values(), *self._launched.values()]:
            self._stop(server)
        self._serving.clear()
        self._launched.clear()
        shutil.rmtree(self._root, ignore_errors=True)


def _fill(arg: str, paths: Mapping[str, str]) -> str:
    for name, path in paths.items():
        arg = arg.replace("{" + name + "}", path)
    return arg


def registered() -> list[str]:
    return list(_SPECS)
