"""Build a tiny Whisper model folder (random weights) in optimum-intel's export layout.

A test fixture, not a model: what it writes is nonsense, but OpenVINO GenAI's
WhisperPipeline loads it on CPU and runs it the way it runs an exported Whisper: a log-mel
encoder (two convolutions and two transformer layers, 1500 positions for a 30 s window),
a stateful decoder whose self-attention cache lives in the request's state (gathered by
`beam_idx` each step, as optimum's export does) and whose cross-attention reads
`encoder_hidden_states`, named `...encoder_attn...` so that the pipeline can decompose it
for word timestamps; a byte-level BPE tokenizer and detokenizer converted with
openvino_tokenizers, and the config files the pipeline reads (`lang_to_id`,
`task_to_id`, `no_timestamps_token_id`, `alignment_heads`, ...).

The vocabulary keeps Whisper's order: text tokens (the 256 bytes), then
`<|endoftext|>`, `<|startoftranscript|>`, the languages, the task tokens,
`<|notimestamps|>` and the 1501 timestamps `<|0.00|>` .. `<|30.00|>`.

    python tests/tiny_whisper.py /tmp/tiny-whisper [base]
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

D_MODEL = 64
HEADS = 4
LAYERS = 2
FFN = 128
MEL_BINS = 80
SOURCE_POSITIONS = 1500  # encoder outputs for a 30 s window: 0.02 s each
TARGET_POSITIONS = 448
TIMESTAMPS = 1501
SEED = 20261127


@dataclass(frozen=True)
class Shape:
    """The model's sizes: TINY for the tests; BASE has openai/whisper-base's (74 M
    parameters, and its 51,865-token vocabulary: the unused ids are text tokens the
    tokenizer never makes), for measuring what a real model's minute of audio costs."""

    d_model: int = D_MODEL
    heads: int = HEADS
    layers: int = LAYERS
    ffn: int = FFN
    text_tokens: int = 256


TINY = Shape()
BASE = Shape(d_model=512, heads=8, layers=6, ffn=2048, text_tokens=50257)
SEGMENT_TOKENS = 7  # a timestamp pair every this many positions


def _languages() -> list[str]:
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    return list(LANGUAGES)


def vocabulary(text_tokens: int = 256) -> dict[str, int]:
    """The special tokens' ids (the text tokens are 0..text_tokens-1, the bytes first)."""
    ids: dict[str, int] = {}
    next_id = text_tokens
    for name in ["<|endoftext|>", "<|startoftranscript|>"] + [f"<|{code}|>" for code in _languages()]:
        ids[name] = next_id
        next_id += 1
    for name in ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>"]:
        ids[name] = next_id
        next_id += 1
    ids["<|notimestamps|>"] = next_id
    next_id += 1
    for index in range(TIMESTAMPS):
        ids[f"<|{index * 0.02:.2f}|>"] = next_id
        next_id += 1
    return ids


def _write_tokenizer(folder: Path, text_tokens: int) -> int:
    """tokenizer.json (byte-level BPE over the 256 bytes, no merges) with the special
    tokens; returns the vocabulary's size."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: index for index, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    # Ids no text tokenizes to (no merge makes them), as a larger vocabulary has.
    vocab.update({f"<unused{index}>": index for index in range(256, text_tokens)})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = vocabulary(text_tokens)
    tokenizer.add_special_tokens([AddedToken(name, special=True, normalized=False) for name in specials])
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 1024,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return text_tokens + len(specials)


class _Weights:
    def __init__(self, seed: int, shape: Shape) -> None:
        self.rng = np.random.default_rng(seed)
        self.shape = shape

    def matrix(self, rows: int, cols: int, std: float = 0.15) -> np.ndarray:
        return self.rng.normal(0.0, std, (rows, cols)).astype(np.float32)

    def vector(self, size: int, std: float = 0.02) -> np.ndarray:
        return self.rng.normal(0.0, std, size).astype(np.float32)


def _layer_norm(ops, x, w: _Weights):
    axes = ops.constant(np.array([-1], dtype=np.int64))
    normed = ops.mvn(x, axes, True, 1e-5, "inside_sqrt")
    scale = ops.constant((1.0 + w.vector(w.shape.d_model, 0.05)).astype(np.float32))
    return ops.add(ops.multiply(normed, scale), ops.constant(w.vector(w.shape.d_model)))


def _linear(ops, x, w: _Weights, rows: int, cols: int, bias: bool = True):
    out = ops.matmul(x, ops.constant(w.matrix(rows, cols)), False, True)
    return ops.add(out, ops.constant(w.vector(rows))) if bias else out


def _heads(ops, x, w: _Weights):
    """[batch, seq, D] -> [batch, heads, seq, D/heads]."""
    split = ops.reshape(
        x, ops.constant(np.array([0, 0, w.shape.heads, w.shape.d_model // w.shape.heads], dtype=np.int64)), True
    )
    return ops.transpose(split, ops.constant(np.array([0, 2, 1, 3], dtype=np.int64)))


def _merge(ops, x, w: _Weights):
    joined = ops.transpose(x, ops.constant(np.array([0, 2, 1, 3], dtype=np.int64)))
    return ops.reshape(joined, ops.constant(np.array([0, 0, w.shape.d_model], dtype=np.int64)), True)


def _mlp(ops, x, w: _Weights):
    hidden = ops.gelu(_linear(ops, x, w, w.shape.ffn, w.shape.d_model), "erf")
    return _linear(ops, hidden, w, w.shape.d_model, w.shape.ffn)


def _named(node, name: str):
    node.output(0).get_tensor().set_names({name})
    return node


def build_encoder(w: _Weights):
    import openvino as ov
    import openvino.opset13 as ops

    features = ops.parameter([-1, MEL_BINS, 2 * SOURCE_POSITIONS], np.float32, name="input_features")
    _named(features, "input_features")

    def conv(x, channels_in, stride):
        kernel = ops.constant(w.rng.normal(0.0, 0.1, (w.shape.d_model, channels_in, 3)).astype(np.float32))
        out = ops.convolution(x, kernel, [stride], [1], [1], [1])
        return ops.gelu(ops.add(out, ops.constant(w.vector(w.shape.d_model).reshape(1, w.shape.d_model, 1))), "erf")

    x = conv(conv(features, MEL_BINS, 1), w.shape.d_model, 2)
    x = ops.transpose(x, ops.constant(np.array([0, 2, 1], dtype=np.int64)))
    x = ops.add(x, ops.constant(w.matrix(SOURCE_POSITIONS, w.shape.d_model, 0.1)))
    for _ in range(w.shape.layers):
        h = _layer_norm(ops, x, w)
        q, k, v = (_heads(ops, _linear(ops, h, w, w.shape.d_model, w.shape.d_model), w) for _ in range(3))
        attended = _merge(ops, ops.scaled_dot_product_attention(q, k, v), w)
        x = ops.add(x, _linear(ops, attended, w, w.shape.d_model, w.shape.d_model))
        x = ops.add(x, _mlp(ops, _layer_norm(ops, x, w), w))
    out = _named(_layer_norm(ops, x, w), "last_hidden_state")
    return ov.Model([ops.result(out)], [features], "encoder")


def build_decoder(w: _Weights, vocab_size: int, scripted: bool = True, talking: bool = False):
    import openvino as ov
    import openvino.opset6 as ops6
    import openvino.opset13 as ops

    input_ids = _named(ops.parameter([-1, -1], np.int64, name="input_ids"), "input_ids")
    encoder_states = _named(
        ops.parameter([-1, -1, w.shape.d_model], np.float32, name="encoder_hidden_states"), "encoder_hidden_states"
    )
    beam_idx = _named(ops.parameter([-1], np.int32, name="beam_idx"), "beam_idx")
    d, heads = w.shape.d_model, w.shape.heads
    head_size = d // heads
    i64 = lambda *values: ops.constant(np.array(values, dtype=np.int64))  # noqa: E731
    scalar = lambda value: ops.constant(np.int64(value))  # noqa: E731
    ids_shape = ops.shape_of(input_ids, "i64")
    batch = ops.gather(ids_shape, i64(0), scalar(0))
    seq = ops.gather(ids_shape, scalar(1), scalar(0))
    empty_cache = ops.broadcast(ops.constant(np.float32(0.0)), ops.concat([batch, i64(heads, 0, head_size)], 0))

    embedding = w.matrix(vocab_size, w.shape.d_model, 0.25)
    x = ops.gather(ops.constant(embedding), input_ids, scalar(0))
    sinks = []
    caches = []
    for layer in range(w.shape.layers):
        for part in ("key", "value"):
            name = f"past_key_values.{layer}.decoder.{part}"
            state = ops.read_value(empty_cache, name, np.float32, [-1, heads, -1, head_size])
            caches.append(ops.gather(state, beam_idx, scalar(0)))
    past = ops.gather(ops.shape_of(caches[0], "i64"), scalar(2), scalar(0))
    total = ops.add(past, seq)
    positions = ops.range(past, total, scalar(1), "i64")
    x = ops.add(x, ops.gather(ops.constant(w.matrix(TARGET_POSITIONS, w.shape.d_model, 0.1)), positions, i64(0)))
    # Query i (at position past + i) sees keys 0 .. past + i.
    allowed = ops.less_equal(
        ops.unsqueeze(ops.range(scalar(0), total, scalar(1), "i64"), i64(0)), ops.unsqueeze(positions, i64(1))
    )
    mask = ops.select(allowed, ops.constant(np.float32(0.0)), ops.constant(np.float32(-np.inf)))
    for layer in range(w.shape.layers):
        h = _layer_norm(ops, x, w)
        q = _heads(ops, _linear(ops, h, w, w.shape.d_model, w.shape.d_model), w)
        k = ops.concat(
            [caches[2 * layer], _heads(ops, _linear(ops, h, w, w.shape.d_model, w.shape.d_model, bias=False), w)], 2
        )
        v = ops.concat([caches[2 * layer + 1], _heads(ops, _linear(ops, h, w, w.shape.d_model, w.shape.d_model), w)], 2)
        sinks.append(ops6.assign(k, f"past_key_values.{layer}.decoder.key"))
        sinks.append(ops6.assign(v, f"past_key_values.{layer}.decoder.value"))
        attended = _merge(ops, ops.scaled_dot_product_attention(q, k, v, mask), w)
        x = ops.add(x, _linear(ops, attended, w, w.shape.d_model, w.shape.d_model))
        h = _layer_norm(ops, x, w)
        q = _heads(ops, _linear(ops, h, w, w.shape.d_model, w.shape.d_model), w)
        k = _heads(ops, _linear(ops, encoder_states, w, w.shape.d_model, w.shape.d_model, bias=False), w)
        v = _heads(ops, _linear(ops, encoder_states, w, w.shape.d_model, w.shape.d_model), w)
        # A mask input (zero) as the export has: the pipeline's decomposition for word
        # timestamps names the scores at the mask's Add.
        cross = ops.scaled_dot_product_attention(q, k, v, ops.constant(np.zeros((1, 1, 1, 1), dtype=np.float32)))
        cross.set_friendly_name(
            f"__module.model.decoder.layers.{layer}.encoder_attn/aten::scaled_dot_product_attention"
        )
        x = ops.add(x, _linear(ops, _merge(ops, cross, w), w, w.shape.d_model, w.shape.d_model))
        x = ops.add(x, _mlp(ops, _layer_norm(ops, x, w), w))
    logits = ops.matmul(_layer_norm(ops, x, w), ops.constant(embedding), False, True)
    if scripted:
        logits = ops.add(logits, _scripted_logits(ops, positions, vocab_size, w.shape.text_tokens, talking))
    logits = _named(logits, "logits")
    return ov.Model([ops.result(logits)], sinks, [input_ids, encoder_states, beam_idx], "decoder")


def _scripted_logits(ops, positions, vocab_size: int, text_tokens: int, talking: bool = False):
    """What keeps the random model's output transcript-like, added to its logits at each
    position p: text is lowercase letters and spaces; `<|endoftext|>` grows likelier with
    p (so a window ends after a few dozen tokens); every SEGMENT_TOKENS-th position a
    timestamp wins, and the timestamp that wins is the one nearest p * 0.1 s, so segments
    follow each other in time; `<|en|>` is the language detected.

    `talking`, as a window of someone who speaks on past its end: the timestamps that win
    are those nearest p * 0.5 s (segments of 3.5 s), and `<|endoftext|>` never comes
    right after a timestamp, so the window ends inside a segment that has no end
    timestamp (the sentence goes on in the next window)."""
    ids = vocabulary(text_tokens)
    bias = np.full(vocab_size, -30.0, dtype=np.float32)
    letters = [_byte_token(byte) for byte in range(ord("a"), ord("z") + 1)]
    bias[letters] = 0.0
    bias[_byte_token(ord(" "))] = 1.5
    bias[ids["<|en|>"]] = -25.0  # only compared with the other languages when detecting
    bias[ids["<|endoftext|>"]] = 0.0
    bias[ids["<|0.00|>"] :] = -12.0
    eot = np.zeros(vocab_size, dtype=np.float32)
    eot[ids["<|endoftext|>"]] = 1.0
    first = ids["<|0.00|>"]
    stamps = np.zeros(vocab_size, dtype=np.float32)
    stamps[first:] = 1.0
    index = np.zeros(vocab_size, dtype=np.float32)
    index[first:] = np.arange(TIMESTAMPS, dtype=np.float32)
    pos = ops.unsqueeze(ops.convert(positions, "f32"), ops.constant(np.int64(1)))  # [seq, 1]
    f32 = lambda value: ops.constant(np.asarray(value, dtype=np.float32))  # noqa: E731
    ending = ops.multiply(ops.add(f32(-24.0), ops.multiply(pos, f32(0.5))), f32(eot))
    segment_turn = ops.equal(ops.floor_mod(pos, f32(SEGMENT_TOKENS)), f32(0.0))
    if talking:
        # The position after a segment's closing timestamp (the timestamp rules allow only
        # another timestamp or the end there): no end.
        after_turn = ops.equal(ops.floor_mod(pos, f32(SEGMENT_TOKENS)), f32(1.0))
        ending = ops.add(ending, ops.multiply(ops.select(after_turn, f32(-100.0), f32(0.0)), f32(eot)))
    turn_bias = ops.select(segment_turn, f32(60.0), f32(0.0))
    stamps_per_position = 25.0 if talking else 5.0
    nearest = ops.negative(ops.abs(ops.subtract(f32(index), ops.multiply(pos, f32(stamps_per_position)))))
    timing = ops.multiply(ops.add(turn_bias, ops.multiply(nearest, f32(0.3))), f32(stamps))
    # A different favourite letter at each position (the random decoder alone repeats one).
    table = np.zeros((TARGET_POSITIONS, vocab_size), dtype=np.float32)
    text = letters + [_byte_token(ord(" "))]
    table[:, text] = np.random.default_rng(SEED).normal(0.0, 3.0, (TARGET_POSITIONS, len(text)))
    lettering = ops.gather(f32(table), positions, ops.constant(np.int64(0)))
    return ops.add(ops.add(f32(bias), lettering), ops.add(ending, timing))


def _byte_token(byte: int) -> int:
    """The id of the token of one byte (the tokenizer's byte-level alphabet, sorted)."""
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    return alphabet.index(_BYTE_CHARS[byte])


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte-to-character table (the byte-level alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {byte: chr(byte) for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(256 + shifted)
            shifted += 1
    return table


_BYTE_CHARS = _byte_chars()


def _configs(folder: Path, ids: dict[str, int], vocab_size: int, w: _Weights) -> None:
    languages = {f"<|{code}|>": ids[f"<|{code}|>"] for code in _languages()}
    no_timestamps = ids["<|notimestamps|>"]
    config = {
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        "d_model": w.shape.d_model,
        "encoder_layers": w.shape.layers,
        "decoder_layers": w.shape.layers,
        "encoder_attention_heads": w.shape.heads,
        "decoder_attention_heads": w.shape.heads,
        "encoder_ffn_dim": w.shape.ffn,
        "decoder_ffn_dim": w.shape.ffn,
        "num_mel_bins": MEL_BINS,
        "max_source_positions": SOURCE_POSITIONS,
        "max_target_positions": TARGET_POSITIONS,
        "vocab_size": vocab_size,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|endoftext|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "decoder_start_token_id": ids["<|startoftranscript|>"],
    }
    generation = {
        "alignment_heads": [[1, 0], [1, 2], [1, 3]],
        "begin_suppress_tokens": [ids["<|endoftext|>"], 220],
        "bos_token_id": ids["<|endoftext|>"],
        "decoder_start_token_id": ids["<|startoftranscript|>"],
        "eos_token_id": ids["<|endoftext|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "is_multilingual": True,
        "lang_to_id": languages,
        "task_to_id": {"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
        "max_initial_timestamp_index": 50,
        "max_length": TARGET_POSITIONS,
        "no_timestamps_token_id": no_timestamps,
        "prev_sot_token_id": ids["<|startofprev|>"],
        "return_timestamps": False,
        "suppress_tokens": [],
    }
    preprocessor = {
        "chunk_length": 30,
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": MEL_BINS,
        "hop_length": 160,
        "n_fft": 400,
        "n_samples": 480000,
        "nb_max_frames": 3000,
        "padding_side": "right",
        "padding_value": 0.0,
        "processor_class": "WhisperProcessor",
        "return_attention_mask": False,
        "sampling_rate": 16000,
    }
    for name, data in (
        ("config.json", config),
        ("generation_config.json", generation),
        ("preprocessor_config.json", preprocessor),
    ):
        (folder / name).write_text(json.dumps(data, indent=1), encoding="utf-8")


def build(folder: Path, seed: int = SEED, shape: Shape = TINY, scripted: bool = True, talking: bool = False) -> Path:
    """Write the fixture into `folder` (created) and return it. Not `scripted`, the
    random decoder writes what it will: stray bytes (text that is not UTF-8) and
    timestamps anywhere, as a broken model might. `talking`, every full window ends
    inside a segment (see _scripted_logits)."""
    import openvino as ov
    import openvino_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    vocab_size = _write_tokenizer(folder, shape.text_tokens)
    ids = vocabulary(shape.text_tokens)
    weights = _Weights(seed, shape)
    ov.save_model(build_encoder(weights), str(folder / "openvino_encoder_model.xml"), compress_to_fp16=False)
    ov.save_model(
        build_decoder(weights, vocab_size, scripted, talking),
        str(folder / "openvino_decoder_model.xml"),
        compress_to_fp16=False,
    )
    _configs(folder, ids, vocab_size, weights)
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"),
        **json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")),
    )
    tokenizer, detokenizer = openvino_tokenizers.convert_tokenizer(hf_tokenizer, with_detokenizer=True)
    ov.save_model(tokenizer, str(folder / "openvino_tokenizer.xml"))
    ov.save_model(detokenizer, str(folder / "openvino_detokenizer.xml"))
    return folder


if __name__ == "__main__":
    started = time.monotonic()
    shape = BASE if sys.argv[2:] == ["base"] else TINY
    print(build(Path(sys.argv[1]), shape=shape), f"{time.monotonic() - started:.1f} s")
