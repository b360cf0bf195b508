"""GGUF tensor types the engine cannot read are rewritten at load into types it reads.

The converter alone first: each type's tensor, converted, against gguf.quants.dequantize
of the file's own blocks (exact where the target holds the same numbers, else within the
bound docs/models.md states); the converted file in the model cache (kept whole or not
at all, found again, rebuilt after a conversion killed half-way). Then real servers on
the embedded model requantized into nine types the engine cannot read: they serve, say
what they converted, load it from the cache the second time, and score a fixed text
within a stated bound of the same file written in F16.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import loopback
from conftest import READY_WITHIN, running_server
from gguf_files import dequantized, requantized_embedded, tensors_file
from ovtrio.gguf.cache import model_identity
from ovtrio.gguf.convert import ConversionError, convert, plan
from ovtrio.gguf.targets import target_for
from ovtrio.loading.gguf_converted import FOLDER, conversion_key, converted_in_cache, engine_readable

# Every type llama.cpp writes that the engine does not read, and the gguf package decodes.
TYPES = [
    "Q5_0",
    "Q5_1",
    "Q5_K",
    "Q3_K",
    "Q2_K",
    "IQ4_XS",
    "IQ4_NL",
    "IQ3_S",
    "IQ3_XXS",
    "IQ2_S",
    "IQ2_XS",
    "IQ2_XXS",
    "IQ1_M",
    "IQ1_S",
    "TQ1_0",
    "TQ2_0",
    "BF16",
    "MXFP4",
]
EXACT = {"Q5_0": "Q8_0", "IQ4_NL": "Q8_0", "MXFP4": "Q8_0", "Q3_K": "Q6_K", "BF16": "F16"}


def bound(target: str, source: np.ndarray) -> np.ndarray:
    """How far each converted weight may be from the file's, by target type (docs/models.md)."""
    # (2^-25: half the step of f16's smallest numbers, which a tiny block's scale is.)
    if target == "Q8_0":  # half a step of 1/127 of the 32-weight block's largest, its scale rounded to f16
        amax = np.abs(source.reshape(-1, 32)).max(axis=1, keepdims=True)
        return np.broadcast_to(amax * (1 / 254 + 2**-11) + 2**-25, (amax.shape[0], 32)).reshape(source.shape)
    if target == "Q6_K":  # half a step of 1/31 of the 16-weight group's largest, plus the int8 scale's rounding
        groups = np.abs(source.reshape(-1, 16, 16))
        amax16 = groups.max(axis=2, keepdims=True)
        amax256 = groups.max(axis=(1, 2), keepdims=True)
        step = amax16 / 31 + amax256 / (31 * 127) * (1 + 2**-9) + 2**-24
        return np.broadcast_to(step / 2, groups.shape).reshape(source.shape)
    if target == "Q4_1":  # half a step of 1/15 of the 32-weight block's range, scale and minimum in f16
        blocks = source.reshape(-1, 32)
        spread = blocks.max(axis=1, keepdims=True) - blocks.min(axis=1, keepdims=True)
        amax = np.abs(blocks).max(axis=1, keepdims=True)
        return np.broadcast_to(spread / 30 + spread * 2**-11 + amax * 2**-10, blocks.shape).reshape(source.shape)
    raise AssertionError(target)


@pytest.fixture(scope="module")
def all_types(tmp_path_factory) -> Path:
    return tensors_file(tmp_path_factory.mktemp("types") / "types.gguf", TYPES)


@pytest.fixture(scope="module")
def converted(all_types, tmp_path_factory) -> dict[str, dict[str, tuple[str, np.ndarray]]]:
    folder = tmp_path_factory.mktemp("converted")
    out = {}
    for preference in ("exact", "small"):
        convert(all_types, folder / f"{preference}.gguf", preference)
        out[preference] = dequantized(folder / f"{preference}.gguf")
    return out


@pytest.mark.parametrize("type_name", TYPES)
def test_each_type_becomes_one_the_engine_reads_with_the_files_numbers(all_types, converted, type_name):
    source_type, source = dequantized(all_types)[f"w.{type_name}"]
    assert source_type == type_name
    target, values = converted["exact"][f"w.{type_name}"]
    assert target in {"Q8_0", "Q6_K", "F16"}
    if type_name in EXACT:
        assert target == EXACT[type_name]
        if target == "F16":  # every bf16 number of magnitude 2^-17 to 65504 is an f16 number
            large = np.abs(source) >= 2**-17
            assert np.array_equal(values[large], source[large])
            assert np.abs(values - source).max() <= 2**-25
        else:
            assert np.array_equal(values, source)
    elif type_name == "IQ4_XS":  # the file's own codes; each 32-weight scale rounded to f16
        assert target == "Q8_0"
        assert np.all(np.abs(values - source) <= np.abs(source) * 2**-11)
    else:
        assert target == "Q8_0"
        assert np.all(np.abs(values - source) <= bound(target, source))


@pytest.mark.parametrize("type_name", TYPES)
def test_preferring_size_gives_a_smaller_type_within_its_bound(all_types, converted, type_name):
    _, source = dequantized(all_types)[f"w.{type_name}"]
    target, values = converted["small"][f"w.{type_name}"]
    exact_target, _ = converted["exact"][f"w.{type_name}"]
    sizes = {"F16": 16, "Q8_0": 8.5, "Q6_K": 6.5625, "Q4_1": 5.0}
    assert sizes[target] < sizes[exact_target] or (target, exact_target) == ("Q8_0", "Q8_0")
    assert np.all(np.abs(values - source) <= bound(target, source))


def test_tensors_the_engine_reads_and_norms_are_copied_byte_for_byte(tmp_path, all_types, converted):
    source = dequantized(all_types)
    assert converted["exact"]["norm.weight"][0] == "F32"
    assert np.array_equal(converted["exact"]["norm.weight"][1], source["norm.weight"][1])
    mixed = tensors_file(tmp_path / "mixed.gguf", ["Q4_K", "Q6_K", "Q5_K"])
    convert(mixed, tmp_path / "out.gguf")
    before, after = dequantized(mixed), dequantized(tmp_path / "out.gguf")
    for name in ("w.Q4_K", "w.Q6_K"):
        assert after[name][0] == before[name][0] and np.array_equal(after[name][1], before[name][1])


def test_a_bf16_norm_becomes_f32_and_the_targets_follow_the_rows():
    assert target_for("BF16", (576,)).type_name == "F32"
    assert target_for("Q5_0", (576, 64), "small").type_name == "Q8_0"  # Q6_K needs rows of 256
    assert target_for("Q5_0", (1536, 64), "small").type_name == "Q6_K"
    assert target_for("Q4_K", (1536, 64)) is None


def test_an_f32_matrix_becomes_f16_and_only_a_matrix_needs_it(tmp_path):
    from ovtrio.gguf.convert import needs_conversion
    from ovtrio.gguf.header import read_gguf_header

    path = tensors_file(tmp_path / "f32.gguf", ["F32", "Q4_K"])
    assert needs_conversion(read_gguf_header(path))  # the engine reads F32 only in vectors
    assert not needs_conversion(read_gguf_header(tensors_file(tmp_path / "vector.gguf", ["Q4_K"])))
    assert convert(path, tmp_path / "out.gguf") == ["F32 → F16: 1 tensor"]
    source, out = dequantized(path), dequantized(tmp_path / "out.gguf")
    target, values = out["w.F32"]
    assert target == "F16"
    assert np.all(np.abs(values - source["w.F32"][1]) <= np.abs(source["w.F32"][1]) * 2**-11 + 2**-25)
    assert out["norm.weight"][0] == "F32" and np.array_equal(out["norm.weight"][1], source["norm.weight"][1])


def test_one_log_line_per_converted_type(tmp_path):
    mixed = tensors_file(tmp_path / "mixed.gguf", ["Q5_K", "IQ4_XS", "Q4_K"])
    lines = convert(mixed, tmp_path / "out.gguf")
    assert lines == ["IQ4_XS → Q8_0: 1 tensor", "Q5_K → Q8_0: 1 tensor"]


# The converted file in the model cache.


def test_the_converted_file_is_kept_and_found_again(tmp_path, all_types):
    first = converted_in_cache(all_types, tmp_path / "cache", "exact")
    assert not first.cached and first.lines and first.path.parent == tmp_path / "cache" / FOLDER
    again = converted_in_cache(all_types, tmp_path / "cache", "exact")
    assert again.cached and again.path == first.path and again.lines == first.lines
    other = converted_in_cache(all_types, tmp_path / "cache", "small")
    assert not other.cached and other.path != first.path
    assert sorted(p.suffix for p in first.path.parent.iterdir()) == [".gguf", ".gguf", ".json", ".json"]


def test_of_two_conversions_at_once_the_first_published_stays(tmp_path, all_types, monkeypatch):
    from ovtrio.loading import gguf_converted

    def convert_while_another_publishes(source, destination, preference, timeout=None):
        lines = convert(source, destination, preference)
        final = destination.parent / f"{conversion_key(model_identity(source), preference)}.gguf"
        final.write_bytes(b"the other server's file")
        return lines

    monkeypatch.setattr(gguf_converted, "convert_in_child", convert_while_another_publishes)
    mine = converted_in_cache(all_types, tmp_path / "cache", "exact")
    assert mine.path.read_bytes() == b"the other server's file"
    assert sorted(p.suffix for p in mine.path.parent.iterdir()) == [".gguf", ".json"]


def test_the_key_follows_the_files_identity_and_the_preference(tmp_path, all_types):
    identity = model_identity(all_types)
    assert conversion_key(identity, "exact") == conversion_key(model_identity(all_types), "exact")
    assert conversion_key(identity, "small") != conversion_key(identity, "exact")
    os.utime(all_types, ns=(identity.mtime_ns + 10**9, identity.mtime_ns + 10**9))
    try:
        assert conversion_key(model_identity(all_types), "exact") != conversion_key(identity, "exact")
    finally:
        os.utime(all_types, ns=(identity.mtime_ns, identity.mtime_ns))


def test_a_failed_conversion_leaves_nothing(tmp_path, all_types, monkeypatch):
    from ovtrio.loading import gguf_converted

    def half_then_fail(source, destination, preference, timeout=None):
        destination.write_bytes(all_types.read_bytes()[:1000])
        raise ConversionError("stopped half-way")

    monkeypatch.setattr(gguf_converted, "convert_in_child", half_then_fail)
    with pytest.raises(ConversionError):
        converted_in_cache(all_types, tmp_path / "cache", "exact")
    assert list((tmp_path / "cache" / FOLDER).iterdir()) == []


def test_the_conversion_runs_in_a_process_of_its_own_and_says_why_it_fails(tmp_path, all_types):
    from ovtrio.gguf.convert import convert_in_child

    assert convert_in_child(all_types, tmp_path / "out.gguf") == convert(all_types, tmp_path / "same.gguf")
    assert (tmp_path / "out.gguf").read_bytes() == (tmp_path / "same.gguf").read_bytes()
    with pytest.raises(OSError, match="No such file"):
        convert_in_child(all_types, tmp_path / "missing" / "out.gguf")


def test_a_start_killed_while_converting_leaves_nothing_used_and_the_next_converts_afresh(tmp_path, mixed_model):
    """`ovtrio convert` (a server's load, without serving) killed with its converting
    child once the converted file is half written."""
    mixed, _ = mixed_model
    cache = tmp_path / "cache"
    process = subprocess.Popen(
        [sys.executable, "-m", "ovtrio", "convert", "--model", str(mixed), "--cache-dir", str(cache)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + READY_WITHIN  # a cap for a hang
        while not any(p.stat().st_size > 1 << 20 for p in (cache / FOLDER).glob(".*.partial")):
            assert process.poll() is None, "the server exited before its conversion was seen"
            assert time.monotonic() < deadline, f"no conversion seen in {READY_WITHIN} s (a hang)"
            time.sleep(0.05)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert list((cache / FOLDER).glob("*.gguf")) == []  # nothing under a name a start would use
    fresh = converted_in_cache(mixed, cache, "exact")
    assert not fresh.cached and fresh.lines
    assert sorted(p.name for p in (cache / FOLDER).iterdir()) == sorted([fresh.path.name, fresh.path.stem + ".json"])


def test_a_file_in_parts_or_with_unknown_types_is_refused(tmp_path, all_types):
    import gguf

    writer = gguf.GGUFWriter(tmp_path / "part.gguf", "llama")
    writer.add_uint16("split.count", 2)
    writer.add_tensor(
        "w",
        gguf.quants.quantize(np.zeros((1, 32), np.float32), gguf.GGMLQuantizationType.Q5_0),
        raw_dtype=gguf.GGMLQuantizationType.Q5_0,
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ConversionError, match="split in parts"):
        convert(tmp_path / "part.gguf", tmp_path / "out.gguf")
    assert [t.target for t in plan(all_types) if t.name == "norm.weight"] == [None]


def _source(path: Path):
    from ovtrio.model.source import ModelSource

    return ModelSource(path, "gguf", "m", 128, {}, convert_tensors=True)


def test_without_the_cache_the_converted_file_lives_only_while_the_engine_loads(tmp_path, all_types):
    from ovtrio.settings.server import Settings

    with engine_readable(_source(all_types), Settings(model_cache=False), {}) as readable:
        assert readable.path != all_types and readable.path.is_file() and not readable.convert_tensors
        held = readable.path
    assert not held.exists() and not held.parent.exists()


def test_a_prebuilt_caches_conversion_is_used_and_nothing_is_written(tmp_path, all_types):
    from ovtrio.settings.server import Settings

    prebuilt = converted_in_cache(all_types, tmp_path / "prebuilt", "exact")
    settings = Settings(cache_dir=str(tmp_path / "cache"), prebuilt_cache_dir=str(tmp_path / "prebuilt"))
    with engine_readable(_source(all_types), settings, {}) as readable:
        assert readable.path == prebuilt.path
    assert not (tmp_path / "cache").exists()


def test_a_draft_model_in_other_types_is_converted_first(tmp_path, all_types):
    from ovtrio.loading.speculation import _engine_readable_draft

    converted = _engine_readable_draft(all_types, tmp_path / "cache", "exact")
    assert converted.parent == tmp_path / "cache" / FOLDER
    assert _engine_readable_draft(converted, tmp_path / "cache", "exact") == converted  # read as it is


# Real servers on the embedded model in nine types the engine cannot read.

# Five types the gguf package writes from the model's weights (IQ4_NL by gguf_files.py),
# and in the last four layers' ffn_down four K and IQ types of random codes: a tenth of
# the weights' spread in four layers of thirty leaves a model (log-probabilities of a
# model's size), which the comparison with F16 needs.
BY_KIND = {"attn_q": "Q5_0", "attn_k": "Q5_1", "attn_v": "BF16", "ffn_gate": "MXFP4", "ffn_down": "IQ4_NL"}
LAST_FFN_DOWN = ("Q5_K", "Q3_K", "IQ4_XS", "Q2_K")


def mixed_types(name: str, shape: tuple[int, ...]) -> str | None:
    if not name.startswith("blk."):
        return None
    layer, kind = int(name.split(".")[1]), name.split(".")[2]
    if kind == "ffn_down" and layer >= 30 - len(LAST_FFN_DOWN):
        return LAST_FFN_DOWN[layer - (30 - len(LAST_FFN_DOWN))]
    return BY_KIND.get(kind)


@pytest.fixture(scope="module")
def mixed_model(tmp_path_factory) -> tuple[Path, Path]:
    """The file of nine types, and the same weights (gguf's dequantize) in F16."""
    folder = tmp_path_factory.mktemp("mixed")
    reference = folder / "mixed-f16.gguf"
    keep = frozenset({"F32", "F16", "Q4_1", "Q8_0"})
    return requantized_embedded(folder / "mixed.gguf", mixed_types, f16=reference, keep=keep), reference


TEXT = "The capital of France is Paris, and the capital of Italy is Rome. Water boils at one hundred degrees."
# The converted file's log-probabilities of each token of TEXT against the F16 file's, at
# f32 precision, measured on a 2-core AMD EPYC: at most 0.45 apart, 0.10 on average (0.16
# and 0.05 without the four random ffn_down tensors). The weights differ only where the
# conversion is not exact (Q5_1, Q5_K, Q2_K, IQ4_XS: by the bounds above); the rest is
# the CPU plugin, which computes with 8- and 6-bit weights otherwise than with f16 ones.
# A mistake in the codes or scales of the thirty-tensor types moves log-probabilities by
# whole units.
PER_TOKEN_BOUND = 0.6
MEAN_BOUND = 0.15


def prompt_logprobs(server, model: str) -> list[float]:
    reply = loopback.post(
        server.v1 + "/completions",
        json={"model": model, "prompt": TEXT, "max_tokens": 0, "echo": True, "logprobs": 0},
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["logprobs"]["token_logprobs"][1:]


def test_a_file_of_nine_types_serves_close_to_the_same_weights_in_f16_and_loads_from_the_cache(tmp_path, mixed_model):
    mixed, reference = mixed_model
    cache = tmp_path / "cache"
    flags = ("--cache-dir", str(cache), "--inference-precision", "f32")
    with running_server(tmp_path, "--model", str(reference), *flags) as server:
        expected = prompt_logprobs(server, "mixed-f16")
    with running_server(tmp_path, "--model", str(mixed), *flags) as server:
        got = prompt_logprobs(server, "mixed")
        log = server.log_path.read_text()
    targets = {"Q3_K": "Q6_K", "BF16": "F16"}
    counts = {**dict.fromkeys(BY_KIND.values(), 30), "IQ4_NL": 26, **dict.fromkeys(LAST_FFN_DOWN, 1)}
    for type_name, count in counts.items():
        tensors = "tensors" if count > 1 else "tensor"
        assert f"{type_name} → {targets.get(type_name, 'Q8_0')}: {count} {tensors}" in log, log
    assert len(got) == len(expected) > 10
    differences = [abs(a - b) for a, b in zip(got, expected)]
    assert max(differences) <= PER_TOKEN_BOUND and sum(differences) / len(differences) <= MEAN_BOUND, differences
    with running_server(tmp_path, "--model", str(mixed), *flags) as server:
        again = prompt_logprobs(server, "mixed")
        log = server.log_path.read_text()
    assert "converted before, from the cache" in log and "converted in" not in log, log
    assert again == got
