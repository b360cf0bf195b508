"""The process that compiles output constraints before the engine sees them.

Run by check.py as `python worker.py MEMORY TEXT COMPILED`, it
reads the model's vocabulary (a line with its size, then the pickled tokens and
end-of-sequence id: its parent's, trusted) and compiles each constraint it is sent
then (one JSON object a line on stdin) exactly as the
engine will: with XGrammar 0.1.31, the version that openvino-genai 2026.4 builds in
(its src/cpp/CMakeLists.txt, XGRAMMAR_VERSION), its GrammarCompiler on a TokenizerInfo
of the model's vocabulary (raw token bytes, the end-of-sequence id, as the engine's
XGrammarStructuredOutput builds it), and a GrammarMatcher with the request's stop ids
(the engine's XGrammarLogitsTransformer). It answers one JSON object a line on stdout:
the grammar as EBNF text, which the engine is then given instead of the schema
(`StructuredOutputConfig(grammar=...)`), or the compiler's error.

Why EBNF: the engine would build the grammar from the schema with XGrammar's defaults,
which allow any whitespace between JSON tokens; converted here with
`any_whitespace=False`, the output is compact JSON (as vLLM's option to disable free
whitespace makes it) and a small model cannot spend its token budget on blank lines.
And the engine parses this very text with the same XGrammar's EBNF parser and compiles
it with the same compiler as done here first, so what compiled here compiles there.

Why a process of its own: a compile can take seconds and hundreds of megabytes
(docs/benchmarks.md#structured-output-grammars), and some of XGrammar's faults end the
process that meets them. Here it meets
an address-space limit (MEMORY bytes beyond what the process holds once ready), bounds
on the grammar's size (TEXT characters of EBNF, COMPILED bytes compiled, by XGrammar's
own estimate) and its parent's timeout, and a fault ends only this process.

XGrammar's Python package imports torch and transformers; only its compiled bindings
are loaded here, which need neither.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import resource
import sys
from pathlib import Path
from typing import Any

XGRAMMAR_VERSION = "0.1.31"
VOCAB_RAW = 0  # xgrammar.VocabType.RAW: token strings are the tokens' own bytes
# JSON's separators, comma and colon, with no space after them.
COMPACT = [",", ":"]


def xgrammar_missing() -> str | None:
    """Why the XGrammar the engine compiles with is not installed (read from the
    installed distributions, nothing loaded); None when it is."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("xgrammar")
    except PackageNotFoundError:
        return "xgrammar is not installed"
    if found != XGRAMMAR_VERSION:
        return f"xgrammar {found} is installed; the engine compiles with {XGRAMMAR_VERSION}"
    return None


def load_bindings() -> Any:
    """XGrammar's compiled module, without its Python package's imports (torch)."""
    missing = xgrammar_missing()
    if missing is not None:
        raise ImportError(missing)
    spec = importlib.util.find_spec("xgrammar")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the xgrammar package is not installed")
    folder = Path(next(iter(spec.submodule_search_locations)))
    library = next(folder.glob("xgrammar_bindings*.so"), None)
    if library is None:
        raise ImportError(f"no xgrammar_bindings library in {folder}")
    bindings_spec = importlib.util.spec_from_file_location("xgrammar_bindings", library)
    assert bindings_spec is not None and bindings_spec.loader is not None
    module = importlib.util.module_from_spec(bindings_spec)
    bindings_spec.loader.exec_module(module)
    return module


def structural_tag_json(tags: list[dict[str, str]], triggers: list[str]) -> str:
    """The structural tag the engine builds from a StructuralTagsConfig (its to_json:
    triggered tags, each a JSON schema between its begin and end)."""
    return json.dumps(
        {
            "type": "structural_tag",
            "format": {
                "type": "triggered_tags",
                "triggers": triggers,
                "tags": [
                    {
                        "type": "tag",
                        "begin": tag["begin"],
                        "content": {"type": "json_schema", "json_schema": json.loads(tag["schema"])},
                        "end": tag["end"],
                    }
                    for tag in tags
                ],
                "at_least_one": False,
                "stop_after_first": False,
            },
        }
    )


# One character of a JSON string: any but the control characters U+0000-U+001F (which
# JSON forbids raw), '"' and '\', or an escape.
JSON_CHAR_RULE = "ovtrio_json_char"
_JSON_CHAR = r'(([^\0-\x1f\"\\]) | ("\\" (([\"\\/bfnrt]) | ("u" [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9]))))'
# The classes XGrammar 0.1.31 writes for a string's characters where it counts them
# (minLength, maxLength) and for a pattern's ".": raw control characters, no escapes
# ('"' and '\' raw too, for "."), which no JSON parser takes.
_LOOSE_CLASSES = ('[^\\"\\\\\\r\\n]', "[\\0-\\U0010ffff]")
_CONTROLS_OUT = '\\0-\\x1f\\"\\\\'  # what a negated class must leave out, as EBNF writes it


def json_safe(grammar: str) -> str:
    """The EBNF `grammar` with every character class that stands for a string's
    characters kept to what JSON allows there: the classes of _LOOSE_CLASSES become one
    JSON string character (escapes included), and any other negated class (a pattern's
    `[^a]`) leaves out control characters, '"' and '\' too. Quoted literals and the
    classes that already do (XGrammar's plain strings) are left as they are."""
    out: list[str] = []
    pos, replaced = 0, False
    while pos < len(grammar):
        char = grammar[pos]
        if char == '"':
            end = _closing(grammar, pos + 1, '"')
            out.append(grammar[pos : end + 1])
            pos = end + 1
        elif char == "[":
            end = _closing(grammar, pos + 1, "]")
            cls = grammar[pos : end + 1]
            if cls in _LOOSE_CLASSES:
                out.append(JSON_CHAR_RULE)
                replaced = True
            elif cls.startswith("[^") and not cls.startswith("[^\\0-\\x1f"):
                out.append("[^" + _CONTROLS_OUT + cls[2:])
            else:
                out.append(cls)
            pos = end + 1
        else:
            out.append(char)
            pos += 1
    if replaced:
        out.append(f"\n{JSON_CHAR_RULE} ::= {_JSON_CHAR}\n")
    return "".join(out)


SENTENCEPIECE_SPACE = "\u2581".encode()


def space_piece(tokens: list[bytes]) -> str | None:
    """What stands for a space in the tokens as the engine reads them: "▁" in a
    sentencepiece vocabulary, whose pieces spell a space so (the engine gives XGrammar the
    pieces as written, VocabType RAW, so a grammar's space must be spelt the same way to
    be writable at all); None where tokens hold spaces themselves (byte-level ones, which
    the engine reads decoded)."""
    marked = sum(1 for token in tokens if SENTENCEPIECE_SPACE in token)
    spaced = sum(1 for token in tokens if b" " in token)
    return SENTENCEPIECE_SPACE.decode() if marked > spaced else None


def spaces_as(grammar: str, piece: str) -> str:
    """The EBNF `grammar` with each space in its quoted literals and character classes
    spelt `piece`, as the vocabulary the engine matches against spells it (a
    sentencepiece vocabulary's "▁"): there a space is written by the pieces that hold
    "▁" and decodes to a space, and no token holds a space itself, so a grammar that
    asks for one would leave the model no token to write (the engine then takes the
    first id of an all-masked step, the padding token, to the end of max_tokens).
    A class gains `piece` beside its space rather than in its place, where the space may
    bound a range (`[ -~]`). Spaces outside literals and classes are the grammar's own
    syntax and stay."""
    out: list[str] = []
    pos = 0
    while pos < len(grammar):
        char = grammar[pos]
        if char == '"':
            end = _closing(grammar, pos + 1, '"')
            out.append(grammar[pos : end + 1].replace(" ", piece))
            pos = end + 1
        elif char == "[":
            end = _closing(grammar, pos + 1, "]")
            cls = grammar[pos : end + 1]
            out.append(cls[:-1] + piece + "]" if " " in cls else cls)
            pos = end + 1
        else:
            out.append(char)
            pos += 1
    return "".join(out)


def _closing(text: str, pos: int, quote: str) -> int:
    """Where the literal or class opened before `pos` closes (past escapes)."""
    while pos < len(text) and text[pos] != quote:
        pos += 2 if text[pos] == "\\" else 1
    return pos


class Compiler:
    def __init__(
        self,
        xgr: Any,
        vocab: list[bytes],
        eos_token_id: int,
        max_text: int,
        max_compiled: int,
        space: str | None = None,
    ) -> None:
        self._xgr = xgr
        self._space = space
        info = xgr.TokenizerInfo(vocab, VOCAB_RAW, len(vocab), [eos_token_id], True)
        # One thread, no cache: the parent caches what it learns, and a compile here
        # should not take the cores the engine steps on.
        self._compiler = xgr.GrammarCompiler(info, 1, False, -1)
        self._max_text = max_text
        self._max_compiled = max_compiled

    def compile(self, request: dict[str, Any]) -> dict[str, Any]:
        xgr = self._xgr
        if request["kind"] == "json_schema":
            # Grammar::FromJSONSchema's arguments: any_whitespace, indent, separators
            # (without spaces: XGrammar's own are ", " and ": "), strict_mode (the
            # engine's default), max_whitespace_cnt, print_converted_ebnf.
            grammar = xgr.Grammar.from_json_schema(request["schema"], False, None, COMPACT, True, None, False)
        else:
            grammar = xgr.Grammar.from_structural_tag(structural_tag_json(request["tags"], request["triggers"]))
        text = json_safe(grammar.to_string())
        if self._space is not None:
            text = spaces_as(text, self._space)
        if len(text) > self._max_text:
            return {"error": f"its grammar is {len(text)} characters, more than {self._max_text}", "size": True}
        compiled = self._compiler.compile_grammar(xgr.Grammar.from_ebnf(text, "root"))
        if compiled.memory_size_bytes > self._max_compiled:
            size = compiled.memory_size_bytes
            return {"error": f"it compiles to {size} bytes, more than {self._max_compiled}", "size": True}
        xgr.GrammarMatcher(compiled, list(request["stop_token_ids"]), False, 0)
        return {"grammar": text}


def _address_space() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    memory, max_text, max_compiled = (int(arg) for arg in sys.argv[1:4])
    # Below the server: compiles are background work, and the event loop and the
    # engine's steps come first (the time limit is on this process's CPU time).
    os.nice(10)
    source = sys.stdin.buffer
    vocab, eos_token_id, space = pickle.loads(source.read(int(source.readline())))
    out = sys.stdout
    try:
        bindings = load_bindings()
    except ImportError as exc:  # the parent refuses every constraint from now on, at once
        out.write(json.dumps({"unavailable": str(exc)}) + "\n")
        out.flush()
        return
    compiler = Compiler(bindings, vocab, eos_token_id, max_text, max_compiled, space)
    if memory > 0:
        limit = _address_space() + memory
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    out.write('{"ready": true}\n')
    out.flush()
    for line in source:
        request = json.loads(line)
        try:
            answer = compiler.compile(request)
        except MemoryError:
            answer = {"error": "it needs more memory to compile than this server allows", "size": True}
        except Exception as exc:  # noqa: BLE001 - XGrammar's refusals are RuntimeErrors and its own types
            answer = {"error": str(exc)}
        # Echoed, so that the parent knows the answer for the request it sent.
        answer["id"] = request.get("id")
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
