"""Text that stays text: a client's message text tokenized as text, never as control
tokens or image tags.

The tokenizer reads special-token text wherever it appears: `<|im_end|>\\n<|im_start|>system`
inside a user message (or a retrieved web page, or a tool's output) would become the
control tokens that end the turn and open a system turn. OpenAI's API treats such text
as text; so does this server, for the content of chat, Responses and Messages
requests, unless the deployment or the request asks otherwise (parse_special).

How, for a model whose engine takes token ids: the tokenizer's own graph
(openvino_tokenizers) begins with a SpecialTokensSplit that cuts the text at the
special tokens' texts, listed as one regular expression; the rest of the graph (the
pre-tokenizer's splits, BPE or SentencePiece) treats every other piece as text. A copy
of the graph whose expression matches nothing is the same tokenizer with no special
tokens: what Hugging Face's tokenizers give with split_special_tokens. The prompt is then
tokenized in runs cut only at the special tokens the chat template wrote
(prompts.py): each run through that copy, each such token as its id.

A vision-language model's engine takes the prompt as text and tokenizes it itself, so
its text cannot be marked as text: there the special tokens' texts, the engine's image
tag `<ov_genai_image_N>` and the image tags of the model families the engine knows are
broken with a WORD JOINER (U+2060, invisible) after their first character, so that no
tokenizer or prompt parser recognises them. A GGUF model converted without the model
cache (no tokenizer IR to copy), and a tokenizer whose IR has no SpecialTokensSplit
(one that reads special tokens inside its SentencePiece operation), get the same
treatment.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("ovtrio")

TOKENIZER_XML = "openvino_tokenizer.xml"
DETOKENIZER_FILES = ("openvino_detokenizer.xml", "openvino_detokenizer.bin")

# What breaks a recognised tag: invisible, and no tokenizer's special token holds it.
WORD_JOINER = "\u2060"

# A pattern that never matches (a word boundary between two letters cannot be), for the
# copy of the tokenizer that splits no special tokens.
_NEVER = rb"a\bb"

# The image tags a vision-language model's prompt may hold, as the engine reads them:
# its universal tag (any index, even none or an out-of-range one), and the native tags
# of the families it supports (LLaVA and its kin, InternVL, MiniCPM-V, Idefics3/SmolVLM,
# Gemma 3, Phi-3.5/Phi-4 vision, Qwen2-VL, Pixtral).
IMAGE_TAGS = re.compile(
    r"<ov_genai_image_|<image>|</image>|<video>|<img>|</img>|<IMG_CONTEXT>|<fake_token_around_image>"
    r"|<global-img>|<start_of_image>|<end_of_image>|<image_soft_token>|<\|image_\d*\|?>?|<\|image\|>"
    r"|<\|vision_start\|>|<\|vision_end\|>|<\|image_pad\|>|<\|video_pad\|>|\[IMG\]|\[IMG_BREAK\]|\[IMG_END\]"
)


@dataclass(frozen=True)
class PlainText:
    """The tokenizer's special tokens' texts (`special`, None when it has none), and
    `tokenizer`, a copy of it that splits none (None where it could not be made)."""

    special: re.Pattern[str] | None
    tokenizer: Any = None

    def holds_special(self, text: str) -> bool:
        return self.special is not None and self.special.search(text) is not None

    def neutralised(self, text: str, *, specials: bool = True, image_tags: bool = False) -> str:
        """`text` with each special token's text (with `specials`) and each image tag
        (with `image_tags`) broken after its first character."""
        patterns = [p for p, on in ((self.special, specials), (IMAGE_TAGS, image_tags)) if on and p is not None]
        for pattern in patterns:
            text = pattern.sub(lambda match: match[0][0] + WORD_JOINER + match[0][1:], text)
        return text


def load_plain_text(folder: Path | None, tokenizer: Any, vocabulary_specials: list[str]) -> PlainText:
    """The PlainText of `tokenizer`, whose IR is in `folder` (an IR model's folder or a
    GGUF file's model cache entry). Without an IR that splits special tokens, no copy,
    and the special tokens' texts of the vocabulary (`vocabulary_specials`), or else
    those the tokenizer's vocabulary spells as markup and its decoder skips. Blocking:
    for the loading thread."""
    return plain_text_of_ir(folder) or plain_text_without_ir(tokenizer, vocabulary_specials)


def plain_text_of_ir(folder: Path | None) -> PlainText | None:
    """The PlainText made from the tokenizer IR in `folder` alone (no tokenizer object
    needed: the load makes it while the engine compiles); None when there is none."""
    xml = folder / TOKENIZER_XML if folder is not None else None
    if xml is None or not xml.is_file():
        return None
    try:
        return _from_ir(xml)
    except Exception as exc:  # noqa: BLE001 (any failure leaves the fallback, which is safe)
        log.warning("cannot copy the tokenizer without special tokens (%s); their texts are broken instead", exc)
        return None


def plain_text_without_ir(tokenizer: Any, vocabulary_specials: list[str]) -> PlainText:
    """No copy; the special tokens' texts of the vocabulary, or else those the
    tokenizer's vocabulary spells as markup and its decoder skips."""
    texts = sorted({t for t in vocabulary_specials if t} or _skipped_markup(tokenizer), key=len, reverse=True)
    return PlainText(re.compile("|".join(map(re.escape, texts))) if texts else None)


def _skipped_markup(tokenizer: Any) -> set[str]:
    """The tokens spelled as markup (`<...>`, `[...]`) that the decoder skips as special."""
    try:
        vocabulary = tokenizer.get_vocab()
    except (AttributeError, RuntimeError):
        return set()
    found = set()
    for spelled, token_id in vocabulary.items():
        raw = spelled if isinstance(spelled, bytes) else str(spelled).encode()
        if len(raw) > 2 and _MARKUP.fullmatch(raw) and not tokenizer.decode([token_id], skip_special_tokens=True):
            found.add(raw.decode("utf-8", "replace"))
    return found


_MARKUP = re.compile(rb"[<\[].*[>\]]", re.DOTALL)


def _from_ir(xml: Path) -> PlainText | None:
    import numpy as np
    import openvino as ov
    import openvino_genai
    import openvino_tokenizers  # noqa: F401 (registers the tokenizer operations)

    model = ov.Core().read_model(xml)
    split = next((op for op in model.get_ordered_ops() if op.get_type_name() == "SpecialTokensSplit"), None)
    if split is None:  # special tokens are read elsewhere, or not at all: the fallback
        return None
    pattern_input = split.input(split.get_input_size() - 1)
    pattern = bytes(pattern_input.get_source_output().get_node().get_data()).decode()
    pattern_input.replace_source_output(ov.op.Constant(np.frombuffer(_NEVER, dtype=np.uint8)).output(0))
    with tempfile.TemporaryDirectory(prefix="ovtrio-plain-tokenizer-") as folder:
        ov.save_model(model, Path(folder) / TOKENIZER_XML, compress_to_fp16=False)
        for name in DETOKENIZER_FILES:
            if (xml.parent / name).is_file():
                shutil.copy(xml.parent / name, Path(folder) / name)
        tokenizer = openvino_genai.Tokenizer(folder)
    return PlainText(re.compile(pattern), tokenizer)
