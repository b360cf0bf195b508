"""Build a tiny SpeechT5 text-to-speech folder (random weights, a HiFi-GAN-shaped vocoder)
in optimum-intel's export layout.

A test fixture, not a model: what it says is noise, but OpenVINO GenAI's
Text2SpeechPipeline loads it on CPU and runs it the way it runs an exported
microsoft/speecht5_tts with microsoft/speecht5_hifigan:

- openvino_encoder_model.xml: `input_ids` -> `last_hidden_state`, `encoder_attention_mask`;
- openvino_decoder_model.xml: one step of the speech decoder, stateful (its self-attention
  cache lives in the request's state, gathered by `beam_idx`), from `inputs_embeds` (the
  mel frames so far), `speaker_embeddings`, `encoder_hidden_states` and
  `encoder_attention_mask` to `output_sequence_out` (the frames with this step's last one
  appended), `spectrum` (REDUCTION frames) and `prob` (the stop probability per frame);
- openvino_postnet.xml: `raw_spectrogram` (the steps' spectra) -> `postnet_spectrogram`;
- openvino_vocoder.xml: `spectrogram` -> `waveform`, HOP samples per mel frame at 16 kHz;
- a byte-level tokenizer that ends every text with `</s>` (as SpeechT5's does), converted
  with openvino_tokenizers, and config.json naming SpeechT5ForTextToSpeech.

The stop probability is computed from integers only: it is 1 once the decoder has made
`steps_for(tokens)` steps and 0 before, whatever the weights and the CPU's arithmetic, so
a text of n tokens is always `samples_for(n)` samples long.

    python tests/tiny_speecht5.py /tmp/tiny-speecht5 [speecht5]
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

D_MODEL = 32
HEADS = 2
MEL_BINS = 80
REDUCTION = 2  # mel frames per decoder step
HOP = 256  # samples per mel frame (HiFi-GAN's upsampling)
SPEAKER = 512  # x-vector size
SAMPLE_RATE = 16000
TEXT_TOKENS = 256
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
SEED = 20261204


def steps_for(tokens: int) -> int:
    """The decoder steps a text of `tokens` tokens (its `</s>` included) takes."""
    return tokens + 1


def samples_for(tokens: int) -> int:
    """The samples the pipeline returns for a text of `tokens` tokens."""
    return steps_for(tokens) * REDUCTION * HOP


@dataclass(frozen=True)
class Shape:
    """The model's sizes: TINY for the tests; SPEECHT5 has microsoft/speecht5_tts's (a
    768-wide encoder of 12 layers and decoder of 6, a 5-layer postnet) and
    microsoft/speecht5_hifigan's vocoder (512 channels upsampled 4 x 4 x 4 x 4, three
    residual blocks a stage), for measuring what a real model's sentence costs."""

    d_model: int = D_MODEL
    heads: int = HEADS
    encoder_layers: int = 1
    decoder_layers: int = 1
    ffn: int = 0  # 0: no feed-forward blocks
    prenet: int = 0  # the decoder prenet's width (0: one layer straight to d_model)
    postnet_layers: int = 1
    postnet_channels: int = MEL_BINS
    vocoder_channels: int = 0  # 0: one convolution to HOP samples a frame; else HiFi-GAN's


TINY = Shape()
SPEECHT5 = Shape(
    d_model=768,
    heads=12,
    encoder_layers=12,
    decoder_layers=6,
    ffn=3072,
    prenet=256,
    postnet_layers=5,
    postnet_channels=256,
    vocoder_channels=512,
)


class _Weights:
    def __init__(self, seed: int, shape: Shape = TINY) -> None:
        self.rng = np.random.default_rng(seed)
        self.shape = shape

    def matrix(self, rows: int, cols: int, std: float | None = None) -> np.ndarray:
        scale = std if std is not None else min(0.2, 1.2 / np.sqrt(cols))
        return self.rng.normal(0.0, scale, (rows, cols)).astype(np.float32)

    def vector(self, size: int, std: float = 0.05) -> np.ndarray:
        return self.rng.normal(0.0, std, size).astype(np.float32)

    def kernel(self, out: int, into: int, size: int, gain: float = 1.0) -> np.ndarray:
        return self.rng.normal(0.0, gain / np.sqrt(into * size), (out, into, size)).astype(np.float32)


def _named(node, name: str):
    node.output(0).get_tensor().set_names({name})
    return node


def _linear(ops, x, w: _Weights, rows: int, cols: int):
    return ops.add(ops.matmul(x, ops.constant(w.matrix(rows, cols)), False, True), ops.constant(w.vector(rows)))


def _heads(ops, x, w: _Weights):
    d, heads = w.shape.d_model, w.shape.heads
    split = ops.reshape(x, ops.constant(np.array([0, 0, heads, d // heads], dtype=np.int64)), True)
    return ops.transpose(split, ops.constant(np.array([0, 2, 1, 3], dtype=np.int64)))


def _merge(ops, x, w: _Weights):
    joined = ops.transpose(x, ops.constant(np.array([0, 2, 1, 3], dtype=np.int64)))
    return ops.reshape(joined, ops.constant(np.array([0, 0, w.shape.d_model], dtype=np.int64)), True)


def _layer_norm(ops, x, w: _Weights):
    d = w.shape.d_model
    normed = ops.mvn(x, ops.constant(np.array([-1], dtype=np.int64)), True, 1e-5, "inside_sqrt")
    return ops.add(ops.multiply(normed, ops.constant(1.0 + w.vector(d))), ops.constant(w.vector(d)))


def _feed_forward(ops, x, w: _Weights):
    if not w.shape.ffn:
        return x
    hidden = ops.gelu(_linear(ops, _layer_norm(ops, x, w), w, w.shape.ffn, w.shape.d_model), "erf")
    return ops.add(x, _linear(ops, hidden, w, w.shape.d_model, w.shape.ffn))


def build_encoder(w: _Weights, vocab_size: int):
    import openvino as ov
    import openvino.opset13 as ops

    d = w.shape.d_model
    input_ids = _named(ops.parameter([-1, -1], np.int64, name="input_ids"), "input_ids")
    x = ops.gather(ops.constant(w.matrix(vocab_size, d, 0.5)), input_ids, ops.constant(np.int64(0)))
    for _ in range(w.shape.encoder_layers):
        h = _layer_norm(ops, x, w)
        q, k, v = (_heads(ops, _linear(ops, h, w, d, d), w) for _ in range(3))
        x = ops.add(x, _linear(ops, _merge(ops, ops.scaled_dot_product_attention(q, k, v), w), w, d, d))
        x = _feed_forward(ops, x, w)
    hidden = _named(_layer_norm(ops, x, w), "last_hidden_state")
    mask = _named(ops.broadcast(ops.constant(np.int64(1)), ops.shape_of(input_ids, "i64")), "encoder_attention_mask")
    return ov.Model([ops.result(hidden), ops.result(mask)], [input_ids], "encoder")


def build_decoder(w: _Weights):
    import openvino as ov
    import openvino.opset6 as ops6
    import openvino.opset13 as ops

    d, heads = w.shape.d_model, w.shape.heads
    i64 = lambda *values: ops.constant(np.array(values, dtype=np.int64))  # noqa: E731
    scalar = lambda value: ops.constant(np.int64(value))  # noqa: E731
    f32 = lambda value: ops.constant(np.asarray(value, dtype=np.float32))  # noqa: E731
    frames = _named(ops.parameter([-1, -1, MEL_BINS], np.float32, name="inputs_embeds"), "inputs_embeds")
    speaker = _named(ops.parameter([-1, SPEAKER], np.float32, name="speaker_embeddings"), "speaker_embeddings")
    encoder_states = _named(
        ops.parameter([-1, -1, d], np.float32, name="encoder_hidden_states"), "encoder_hidden_states"
    )
    encoder_mask = _named(ops.parameter([-1, -1], np.int64, name="encoder_attention_mask"), "encoder_attention_mask")
    beam_idx = _named(ops.parameter([-1], np.int32, name="beam_idx"), "beam_idx")

    shape = ops.shape_of(frames, "i64")
    batch = ops.gather(shape, i64(0), scalar(0))
    steps = ops.gather(shape, scalar(1), scalar(0))  # this step's number, from 1
    # The prenet reads the last frame (the cache holds what the earlier ones made).
    last = ops.slice(frames, ops.unsqueeze(ops.subtract(steps, scalar(1)), i64(0)), i64(2**62), i64(1), i64(1))
    if w.shape.prenet:
        last = ops.relu(_linear(ops, last, w, w.shape.prenet, MEL_BINS))
        last = ops.relu(_linear(ops, last, w, w.shape.prenet, w.shape.prenet))
    x = ops.relu(_linear(ops, last, w, d, w.shape.prenet or MEL_BINS))
    voice = ops.unsqueeze(_linear(ops, speaker, w, d, SPEAKER), i64(1))
    position = ops.gather(f32(w.matrix(512, d, 0.3)), ops.floor_mod(steps, scalar(512)), scalar(0))
    x = ops.add(ops.add(x, voice), position)

    head = d // heads
    empty = ops.broadcast(f32(0.0), ops.concat([batch, i64(heads, 0, head)], 0))
    sinks = []
    # Cross-attention over the text, masked as the encoder says.
    allowed = ops.unsqueeze(ops.convert(encoder_mask, "boolean"), i64(1, 2))
    mask = ops.select(allowed, f32(0.0), f32(-np.inf))
    for layer in range(w.shape.decoder_layers):
        cache = []
        for part in ("key", "value"):
            name = f"past_key_values.{layer}.decoder.{part}"
            state = ops.read_value(empty, name, np.float32, [-1, heads, -1, head])
            cache.append(ops.gather(state, beam_idx, scalar(0)))
        h = _layer_norm(ops, x, w)
        q = _heads(ops, _linear(ops, h, w, d, d), w)
        k = ops.concat([cache[0], _heads(ops, _linear(ops, h, w, d, d), w)], 2)
        v = ops.concat([cache[1], _heads(ops, _linear(ops, h, w, d, d), w)], 2)
        sinks += [
            ops6.assign(k, f"past_key_values.{layer}.decoder.key"),
            ops6.assign(v, f"past_key_values.{layer}.decoder.value"),
        ]
        x = ops.add(x, _linear(ops, _merge(ops, ops.scaled_dot_product_attention(q, k, v), w), w, d, d))
        h = _layer_norm(ops, x, w)
        q = _heads(ops, _linear(ops, h, w, d, d), w)
        k = _heads(ops, _linear(ops, encoder_states, w, d, d), w)
        v = _heads(ops, _linear(ops, encoder_states, w, d, d), w)
        x = ops.add(x, _linear(ops, _merge(ops, ops.scaled_dot_product_attention(q, k, v, mask), w), w, d, d))
        x = _feed_forward(ops, x, w)
    x = _layer_norm(ops, x, w)

    mels = ops.tanh(_linear(ops, x, w, REDUCTION * MEL_BINS, d))  # [batch, 1, 2 * 80]
    spectrum = _named(ops.reshape(mels, i64(-1, REDUCTION, MEL_BINS), False), "spectrum")
    newest = ops.slice(spectrum, i64(REDUCTION - 1), i64(REDUCTION), i64(1), i64(1))
    sequence = _named(ops.concat([frames, newest], 1), "output_sequence_out")
    # Stop once steps_for(tokens) steps are made: integers compared, then 0 or 1.
    tokens = ops.gather(ops.shape_of(encoder_states, "i64"), scalar(1), scalar(0))
    done = ops.greater_equal(steps, ops.add(tokens, scalar(steps_for(0))))
    stop = ops.select(done, f32(1.0), f32(0.0))
    prob = _named(ops.broadcast(stop, ops.concat([batch, i64(REDUCTION)], 0)), "prob")
    results = [ops.result(sequence), ops.result(spectrum), ops.result(prob)]
    return ov.Model(results, sinks, [frames, speaker, encoder_states, encoder_mask, beam_idx], "decoder")


def _conv(ops, x, w: _Weights, out: int, into: int, size: int, dilation: int = 1, gain: float = 1.0):
    pad = dilation * (size - 1) // 2
    y = ops.convolution(x, ops.constant(w.kernel(out, into, size, gain)), [1], [pad], [pad], [dilation])
    return ops.add(y, ops.constant(w.vector(out).reshape(1, out, 1)))


def build_postnet(w: _Weights):
    """The steps' spectra [steps, 1, REDUCTION, 80] -> frames [steps * REDUCTION, 80],
    refined by residual convolutions over time."""
    import openvino as ov
    import openvino.opset13 as ops

    i64 = lambda *values: ops.constant(np.array(values, dtype=np.int64))  # noqa: E731
    raw = _named(ops.parameter([-1, 1, REDUCTION, MEL_BINS], np.float32, name="raw_spectrogram"), "raw_spectrogram")
    frames = ops.reshape(raw, i64(1, -1, MEL_BINS), False)
    channels = ops.transpose(frames, i64(0, 2, 1))
    refined = channels
    width = MEL_BINS
    for layer in range(w.shape.postnet_layers):
        out = MEL_BINS if layer == w.shape.postnet_layers - 1 else w.shape.postnet_channels
        refined = ops.tanh(_conv(ops, refined, w, out, width, 5, gain=0.3 if out == MEL_BINS else 1.0))
        width = out
    out = ops.transpose(ops.add(channels, refined), i64(0, 2, 1))
    out = _named(ops.reshape(out, i64(-1, MEL_BINS), False), "postnet_spectrogram")
    return ov.Model([ops.result(out)], [raw], "postnet")


def _hifigan(ops, channels, w: _Weights):
    """HiFi-GAN's generator: [1, 80, frames] -> [1, 1, frames * 256]."""
    i64 = lambda *values: ops.constant(np.array(values, dtype=np.int64))  # noqa: E731
    width = w.shape.vocoder_channels
    x = _conv(ops, channels, w, width, MEL_BINS, 7)
    for _ in range(4):  # upsampled 4 times by 4: 256 samples a frame
        x = ops.prelu(x, ops.constant(np.float32(0.1)))
        # Each sample repeated 4 times, then a convolution: the transposed convolution's
        # work, which the CPU plugin does not compile on a dynamic length.
        long = ops.broadcast(ops.unsqueeze(x, i64(3)), i64(1, 1, 1, 4), broadcast_spec="BIDIRECTIONAL")
        x = _conv(ops, ops.reshape(long, i64(0, width, -1), True), w, width // 2, width, 7)
        width //= 2
        blocks = []
        for size in (3, 7, 11):
            y = x
            for dilation in (1, 3, 5):
                inner = _conv(ops, ops.prelu(y, ops.constant(np.float32(0.1))), w, width, width, size, dilation)
                inner = _conv(ops, ops.prelu(inner, ops.constant(np.float32(0.1))), w, width, width, size, 1, 0.3)
                y = ops.add(y, inner)
            blocks.append(y)
        x = ops.multiply(ops.add(ops.add(blocks[0], blocks[1]), blocks[2]), ops.constant(np.float32(1 / 3)))
    x = ops.prelu(x, ops.constant(np.float32(0.01)))
    return ops.multiply(ops.tanh(_conv(ops, x, w, 1, width, 7)), ops.constant(np.float32(0.5)))


def build_vocoder(w: _Weights):
    """Frames [frames, 80] -> waveform [1, frames * HOP] in (-0.5, 0.5): each frame's HOP
    samples a projection of the frame and its two neighbours (a convolution), or
    HiFi-GAN's generator (Shape.vocoder_channels)."""
    import openvino as ov
    import openvino.opset13 as ops

    i64 = lambda *values: ops.constant(np.array(values, dtype=np.int64))  # noqa: E731
    spectrogram = _named(ops.parameter([-1, MEL_BINS], np.float32, name="spectrogram"), "spectrogram")
    channels = ops.unsqueeze(ops.transpose(spectrogram, i64(1, 0)), i64(0))  # [1, 80, frames]
    if w.shape.vocoder_channels:
        samples = _hifigan(ops, channels, w)
    else:
        hops = ops.convolution(channels, ops.constant(w.kernel(HOP, MEL_BINS, 3, 0.8)), [1], [1], [1], [1])
        samples = ops.multiply(ops.tanh(ops.transpose(hops, i64(0, 2, 1))), ops.constant(np.float32(0.5)))
    waveform = _named(ops.reshape(samples, i64(1, -1), False), "waveform")
    return ov.Model([ops.result(waveform)], [spectrogram], "vocoder")


def _write_tokenizer(folder: Path) -> int:
    """tokenizer.json: byte-level BPE over the 256 bytes (no merges), `</s>` after every
    text; returns the vocabulary's size."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {ch: index for index, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(name, special=True, normalized=False) for name in SPECIALS])
    eos = TEXT_TOKENS + SPECIALS.index("</s>")
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", eos)])
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "model_max_length": 600,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return TEXT_TOKENS + len(SPECIALS)


def tokens_of(text: str) -> int:
    """How many tokens the fixture's tokenizer makes of `text` (its bytes and `</s>`)."""
    return len(text.encode("utf-8")) + 1


def build(folder: Path, seed: int = SEED, shape: Shape = TINY) -> Path:
    """Write the fixture (of `shape`'s sizes) into `folder` (created) and return it."""
    import openvino as ov
    import openvino_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    vocab_size = _write_tokenizer(folder)
    weights = _Weights(seed, shape)
    for name, model in (
        ("openvino_encoder_model.xml", build_encoder(weights, vocab_size)),
        ("openvino_decoder_model.xml", build_decoder(weights)),
        ("openvino_postnet.xml", build_postnet(weights)),
        ("openvino_vocoder.xml", build_vocoder(weights)),
    ):
        ov.save_model(model, str(folder / name), compress_to_fp16=False)
    config = {
        "architectures": ["SpeechT5ForTextToSpeech"],
        "model_type": "speecht5",
        "hidden_size": shape.d_model,
        "num_mel_bins": MEL_BINS,
        "reduction_factor": REDUCTION,
        "speaker_embedding_dim": SPEAKER,
        "vocab_size": vocab_size,
        "eos_token_id": TEXT_TOKENS + SPECIALS.index("</s>"),
        "pad_token_id": TEXT_TOKENS + SPECIALS.index("<pad>"),
    }
    (folder / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    (folder / "generation_config.json").write_text(json.dumps({"max_length": 1876}), encoding="utf-8")
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"),
        **json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")),
    )
    tokenizer, detokenizer = openvino_tokenizers.convert_tokenizer(hf_tokenizer, with_detokenizer=True)
    ov.save_model(tokenizer, str(folder / "openvino_tokenizer.xml"))
    ov.save_model(detokenizer, str(folder / "openvino_detokenizer.xml"))
    return folder


def speaker(seed: int) -> np.ndarray:
    """A speaker embedding [1, SPEAKER] (float32), as an x-vector is: unit length."""
    vector = np.random.default_rng(seed).normal(0.0, 1.0, (1, SPEAKER)).astype(np.float32)
    return vector / np.linalg.norm(vector)


if __name__ == "__main__":
    started = time.monotonic()
    shape = SPEECHT5 if sys.argv[2:] == ["speecht5"] else TINY
    print(build(Path(sys.argv[1]), shape=shape), f"{time.monotonic() - started:.1f} s")
