"""The model cache: what the engine builds from a GGUF file is kept for the next start.

The key and the entry's life (published whole or not at all, checked when read) are
tested on their own. Then real servers: the session's own servers share one cache (the
first converts the embedded model, the others load its entry and write the same greedy
text); and one on a copy of the model with a cache of its own, where the copy's entry
is damaged (rebuilt) and the original file's is not the copy's (not taken).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import loopback
from conftest import MODEL, SESSION_CACHE, RunningServer, embedded_entry
from ovtrio.gguf.cache import (
    ENTRY_FILES,
    MANIFEST,
    CacheEntryError,
    ModelCache,
    ModelIdentity,
    cache_folder,
    default_cache_dir,
    engine_versions,
    entry_key,
    model_identity,
)
from ovtrio.loading.cache_build import EntryBuildError
from ovtrio.model import embedded_model_path
from server_pool import server_fixture

VERSIONS = {"openvino": "2026.4.1", "openvino-genai": "2026.4.1.0", "openvino-tokenizers": "2026.4.1.0"}
IDENTITY = ModelIdentity("/models/m.gguf", 1000, 1_700_000_000_000_000_000, "ab" * 32)


# The key.


def test_the_key_is_stable_for_the_same_file_and_engine():
    assert entry_key(IDENTITY, VERSIONS) == entry_key(ModelIdentity(**vars(IDENTITY)), dict(VERSIONS))


@pytest.mark.parametrize(
    "change",
    [{"path": "/models/other.gguf"}, {"size": 1001}, {"mtime_ns": IDENTITY.mtime_ns + 1}, {"head_sha256": "cd" * 32}],
)
def test_any_change_of_the_file_changes_the_key(change):
    assert entry_key(ModelIdentity(**{**vars(IDENTITY), **change}), VERSIONS) != entry_key(IDENTITY, VERSIONS)


@pytest.mark.parametrize("package", sorted(VERSIONS))
def test_another_engine_version_changes_the_key(package):
    assert entry_key(IDENTITY, {**VERSIONS, package: "2026.5.0"}) != entry_key(IDENTITY, VERSIONS)


def test_the_identity_follows_size_time_and_content(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(100))
    first = model_identity(model)
    assert first == model_identity(tmp_path / "." / "m.gguf")  # the same file, however named
    os.utime(model, ns=(first.mtime_ns + 10**9, first.mtime_ns + 10**9))
    assert model_identity(model).mtime_ns != first.mtime_ns
    model.write_bytes(b"GGUF" + bytes(99) + b"x")
    os.utime(model, ns=(first.mtime_ns, first.mtime_ns))
    changed = model_identity(model)
    assert (changed.size, changed.mtime_ns) == (first.size, first.mtime_ns) and changed.head_sha256 != first.head_sha256


def test_engine_versions_are_the_installed_ones():
    import openvino

    versions = engine_versions()
    assert set(versions) == set(VERSIONS)
    assert openvino.__version__.startswith(versions["openvino"])


def test_the_default_folder_follows_xdg_cache_home():
    assert default_cache_dir({"XDG_CACHE_HOME": "/var/cache/me"}) == Path("/var/cache/me/ovtrio")
    assert default_cache_dir({}) == Path.home() / ".cache" / "ovtrio"


# The entry's life, with files standing in for what the engine writes.


def _build(cache: ModelCache, model: Path, key: str = "k" * 32) -> Path:
    with cache.building(key, model, model_identity(model)) as link:
        assert link.is_symlink() and link.resolve() == model.resolve()
        for name in ENTRY_FILES:  # the engine writes beside the path it is given
            (link.parent / name).write_text(name)
        assert cache.lookup(key) is None  # nothing visible until the block ends
    return cache.entry(key)


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(64))
    return path


def test_an_entry_is_published_whole(tmp_path, model):
    cache = ModelCache(tmp_path / "cache")
    entry = _build(cache, model)
    assert cache.lookup("k" * 32) == entry
    assert sorted(p.name for p in entry.iterdir()) == sorted([*ENTRY_FILES, MANIFEST])
    assert [p.name for p in cache.entries.iterdir()] == [entry.name]  # no temporary folder left
    assert json.loads((entry / MANIFEST).read_text())["model"]["path"] == str(model.resolve())


def test_a_failed_build_leaves_nothing(tmp_path, model):
    cache = ModelCache(tmp_path / "cache")
    with pytest.raises(RuntimeError):
        with cache.building("k" * 32, model, model_identity(model)):
            raise RuntimeError("the engine failed")
    assert list(cache.entries.iterdir()) == []


def test_a_build_missing_a_file_is_not_published(tmp_path, model):
    cache = ModelCache(tmp_path / "cache")
    with pytest.raises(OSError, match=r"openvino_model\.bin"):
        with cache.building("k" * 32, model, model_identity(model)) as link:
            (link.parent / "openvino_model.xml").write_text("x")
    assert list(cache.entries.iterdir()) == []


def test_of_two_builds_at_once_the_first_published_stays(tmp_path, model):
    cache = ModelCache(tmp_path / "cache")
    key = "k" * 32
    with cache.building(key, model, model_identity(model)) as late:
        for name in ENTRY_FILES:
            (late.parent / name).write_text("late")
        _build(cache, model, key)  # another server finishes first
    assert (cache.entry(key) / "openvino_model.xml").read_text() == "openvino_model.xml"
    assert [p.name for p in cache.entries.iterdir()] == [key]


def test_a_replacing_build_replaces_the_entry_only_once_it_succeeds(tmp_path, model):
    cache = ModelCache(tmp_path / "cache")
    key = "k" * 32
    _build(cache, model, key)
    with pytest.raises(RuntimeError):
        with cache.building(key, model, model_identity(model), replacing=True):
            raise RuntimeError("the engine failed")
    assert (cache.lookup(key) / "openvino_model.xml").read_text() == "openvino_model.xml"
    with cache.building(key, model, model_identity(model), replacing=True) as link:
        for name in ENTRY_FILES:
            (link.parent / name).write_text("new")
    assert (cache.lookup(key) / "openvino_model.xml").read_text() == "new"
    assert [p.name for p in cache.entries.iterdir()] == [key]


def _loading_with_a_fake_engine(monkeypatch, fails_on: set[str]) -> list[str]:
    """ovtrio.loading.load with the engine replaced: loading the cache's entry
    ("entry"), the child's conversion into the cache ("conversion"), loading what it
    converted ("converted") and loading the file uncached ("uncached") each fail when
    named in `fails_on`, else do what the engine would. Returns what it was asked to do, in order."""
    from ovtrio.loading import load as loading

    asked: list[str] = []

    def attempt(what: str) -> None:
        asked.append(what)
        if what in fails_on:
            raise RuntimeError(f"Exception from src/core: the {what} failed\n")

    def fake_build(path: Path, settings, phases, save: bool = False, on_folder=None):
        if path.is_file():  # the GGUF file itself: served uncached
            attempt("uncached")
        else:
            attempt("converted" if (path / "openvino_model.xml").read_text() == "converted" else "entry")
        return "tokenizer", "pipeline"

    def fake_child(model_path: Path, cache_root: Path, replacing: bool, timeout):
        cache = ModelCache(cache_root)
        identity = model_identity(model_path)
        key = entry_key(identity, engine_versions())
        try:
            with cache.building(key, model_path, identity, replacing) as link:
                attempt("conversion")
                for name in ENTRY_FILES:
                    (link.parent / name).write_text("converted")
        except RuntimeError as exc:  # what the real child reports of the engine's failure
            raise EntryBuildError(str(exc)) from None
        return cache.entry(key)

    monkeypatch.setattr(loading, "_build", fake_build)
    monkeypatch.setattr(loading, "build_entry_in_child", fake_child)
    return asked


def _source_and_settings(tmp_path: Path, model: Path):
    from ovtrio.model.source import ModelSource
    from ovtrio.settings.server import Settings

    source = ModelSource(path=model, kind="gguf", name="m", context_length=128, generation_defaults={})
    return source, Settings(cache_dir=str(tmp_path / "cache"))


def test_an_entry_the_engine_cannot_load_is_replaced_by_a_conversion_that_loads(tmp_path, model, monkeypatch):
    from ovtrio.loading.load import _build_with_cache

    source, settings = _source_and_settings(tmp_path, model)
    cache = ModelCache(tmp_path / "cache")
    key = entry_key(model_identity(model), engine_versions())
    _build(cache, model, key)
    asked = _loading_with_a_fake_engine(monkeypatch, fails_on={"entry"})
    _, _, origin, _ = _build_with_cache(source, settings, {})
    assert asked == ["entry", "conversion", "converted"]
    assert origin.startswith("converted and cached in ")
    assert (cache.lookup(key) / "openvino_model.xml").read_text() == "converted"


def test_a_conversion_that_fails_leaves_the_entry(tmp_path, model, monkeypatch):
    """The child replaces the entry only once its conversion succeeds: one that fails
    leaves the old entry for the next start; the model is then loaded uncached, and
    fails with the engine's reason when the engine cannot read it either."""
    from ovtrio.loading.load import _build_with_cache

    source, settings = _source_and_settings(tmp_path, model)
    cache = ModelCache(tmp_path / "cache")
    key = entry_key(model_identity(model), engine_versions())
    _build(cache, model, key)
    asked = _loading_with_a_fake_engine(monkeypatch, fails_on={"entry", "conversion", "uncached"})
    with pytest.raises(RuntimeError, match="the uncached failed"):
        _build_with_cache(source, settings, {})
    assert asked == ["entry", "conversion", "uncached"]
    assert (cache.lookup(key) / "openvino_model.xml").read_text() == "openvino_model.xml"
    assert [p.name for p in cache.entries.iterdir()] == [key]


def test_a_failure_that_is_not_the_entrys_is_the_engines_reason(tmp_path, model, monkeypatch):
    """Settings the engine refuses fail the entry and what the child converted alike:
    the error is the engine's, and the entry in the cache is the converted one, which
    the next start loads."""
    from ovtrio.loading.load import _build_with_cache

    source, settings = _source_and_settings(tmp_path, model)
    cache = ModelCache(tmp_path / "cache")
    key = entry_key(model_identity(model), engine_versions())
    _build(cache, model, key)
    asked = _loading_with_a_fake_engine(monkeypatch, fails_on={"entry", "converted"})
    with pytest.raises(RuntimeError, match="the converted failed"):
        _build_with_cache(source, settings, {})
    assert asked == ["entry", "conversion", "converted"]
    assert (cache.lookup(key) / "openvino_model.xml").read_text() == "converted"
    assert [p.name for p in cache.entries.iterdir()] == [key]


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda entry: (entry / MANIFEST).unlink(), "manifest"),
        (lambda entry: (entry / MANIFEST).write_text("{"), "manifest"),
        (lambda entry: (entry / "openvino_tokenizer.bin").unlink(), "openvino_tokenizer.bin is missing"),
        (lambda entry: (entry / "openvino_model.bin").write_text("truncated"), "openvino_model.bin has 9 bytes"),
    ],
)
def test_a_damaged_entry_is_refused_and_can_be_discarded(tmp_path, model, damage, reason):
    cache = ModelCache(tmp_path / "cache")
    damage(_build(cache, model))
    with pytest.raises(CacheEntryError, match=reason):
        cache.lookup("k" * 32)
    cache.discard("k" * 32)
    assert cache.lookup("k" * 32) is None
    assert list(cache.entries.iterdir()) == []


# Real servers on one cache folder, one after the other.

NAME = "cached-model"
PROMPT = {"prompt": "The capital of France is", "max_tokens": 7, "temperature": 0, "ignore_eos": True}


def greedy_text(server: RunningServer, model: str = MODEL) -> str:
    reply = loopback.post(server.v1 + "/completions", json={"model": model, **PROMPT}, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["text"]


def load_line(log: str) -> str:
    [line] = [line for line in log.splitlines() if " loaded in " in line]
    return line


def test_the_first_start_converts_into_the_cache(server):
    """The session's first server found the session's cache empty (conftest.py): a child
    built the entry (the IR conversion), then the server loaded it."""
    line = load_line(server.log_path.read_text())
    assert "(converted and cached in " in line, line
    for phase in ("IR conversion", "model", "vocabulary", "warm-up"):
        assert f" {phase} " in line, line
    assert embedded_entry().name in line and (embedded_entry() / "openvino_model.xml").is_file(), line


def test_the_second_start_loads_the_cache_and_answers_the_same(server, alternate_server):
    """Another server of the session, started once the entry was there. Its settings
    change how steps are called and deltas grouped, not what the engine computes
    (test_engine_step.py: both step routes give the same tokens)."""
    assert "(cached in " in load_line(alternate_server.log_path.read_text())
    assert greedy_text(alternate_server) == greedy_text(server)


def _seed_damaged_cache(folder: Path) -> None:
    """A copy of the embedded model (an identity of its own) and a cache holding two
    entries made from the session's: a good one under the original file's key, which
    the copy must not take, and one under the copy's key whose model file is damaged
    (zeroed, the same size: only the engine can tell)."""
    shutil.copy(embedded_model_path(), folder / "model.gguf")
    versions = engine_versions()
    original = entry_key(model_identity(embedded_model_path()), versions)
    copy = entry_key(model_identity(folder / "model.gguf"), versions)
    shutil.copytree(SESSION_CACHE / "gguf" / original, folder / "cache" / "gguf" / original)
    shutil.copytree(SESSION_CACHE / "gguf" / original, folder / "cache" / "gguf" / copy)
    xml = folder / "cache" / "gguf" / copy / "openvino_model.xml"
    xml.write_bytes(b"\0" * xml.stat().st_size)


damaged_cache_server = server_fixture(
    "damaged_cache_server",
    "--model",
    "{folder}/model.gguf",
    "--served-model-name",
    NAME,
    "--cache-dir",
    "{folder}/cache",
    prepare=_seed_damaged_cache,
)


def test_a_damaged_entry_is_rebuilt_and_another_files_entry_is_not_taken(server, damaged_cache_server):
    folder = damaged_cache_server.log_path.parent
    versions = engine_versions()
    original = entry_key(model_identity(embedded_model_path()), versions)
    copy = entry_key(model_identity(folder / "model.gguf"), versions)
    log = damaged_cache_server.log_path.read_text()
    complaints = [line for line in log.splitlines() if "unusable" in line]
    assert len(complaints) == 1 and copy in complaints[0], log
    assert "(converted and cached in " in load_line(log) and copy in load_line(log), log
    assert (folder / "cache" / "gguf" / copy / "openvino_model.xml").read_bytes().startswith(b"<?xml")
    assert sorted(p.name for p in (folder / "cache" / "gguf").iterdir()) == sorted([original, copy])
    assert greedy_text(damaged_cache_server, NAME) == greedy_text(server)


# A cache that is only read (an image's), and the one folder the server writes to.


def test_the_folder_is_cache_dir_else_in_the_data_dir_else_the_users():
    assert cache_folder("/c", "/d") == Path("/c")
    assert cache_folder(None, "/d") == Path("/d/cache")
    assert cache_folder(None, None, {"XDG_CACHE_HOME": "/x"}) == Path("/x/ovtrio")


def _seed_prebuilt_cache(folder: Path) -> None:
    """The session's entry of the embedded model, in a cache of its own."""
    key = entry_key(model_identity(embedded_model_path()), engine_versions())
    shutil.copytree(SESSION_CACHE / "gguf" / key, folder / "prebuilt" / "gguf" / key)


prebuilt_cache_server = server_fixture(
    "prebuilt_cache_server",
    "--prebuilt-cache-dir",
    "{folder}/prebuilt",
    "--data-dir",
    "{folder}/data",
    "--response-store-path",
    "responses.sqlite",
    env={"OVTRIO_CACHE_DIR": ""},  # the session's (conftest.py): unset, so the cache is the data dir's
    prepare=_seed_prebuilt_cache,
)


def test_a_prebuilt_entry_is_loaded_and_the_server_writes_only_in_its_data_dir(server, prebuilt_cache_server):
    folder = prebuilt_cache_server.log_path.parent
    line = load_line(prebuilt_cache_server.log_path.read_text())
    assert f"(cached in {folder}/prebuilt/gguf/" in line, line
    assert not (folder / "data" / "cache").exists()  # nothing converted
    response = loopback.post(
        prebuilt_cache_server.v1 + "/responses",
        json={"model": MODEL, "input": "Hi", "max_output_tokens": 2},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert (folder / "data" / "responses.sqlite").is_file()
    assert not (folder / "responses.sqlite").exists()


def test_ovtrio_convert_fills_the_cache_and_exits(tmp_path):
    """`ovtrio convert` (what an image's build runs): the entry a server would load."""
    import subprocess
    import sys

    cache = tmp_path / "cache"
    done = subprocess.run(
        [sys.executable, "-m", "ovtrio", "convert", "--cache-dir", str(cache)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    key = entry_key(model_identity(embedded_model_path()), engine_versions())
    assert done.stdout.strip() == f"{MODEL}: converted and cached in {cache / 'gguf' / key}"
    assert ModelCache(cache).lookup(key) == cache / "gguf" / key
    refused = subprocess.run(
        [sys.executable, "-m", "ovtrio", "convert", "--no-model-cache"], capture_output=True, text=True, timeout=600
    )
    assert refused.returncode == 1 and "--no-model-cache" in refused.stderr
