"""The grammar checker (ovtrio/model/grammar_check.py) with its real worker process and
XGrammar: what compiles comes back as the EBNF the engine is given, without free
whitespace; what does not, or runs past the limits, is refused with XGrammar's reason
and no build paths; a worker killed past its limits or from outside is started again,
and every result is kept."""

from __future__ import annotations

import json
import os
import signal

import pytest
import trio

from fake_engine import VOCABULARY
from ovtrio.model.grammar_check import ConstraintRefused, GrammarChecker, GrammarLimits


def schema_request(schema: object) -> dict:
    return {"kind": "json_schema", "schema": json.dumps(schema), "stop_token_ids": [0]}


def checker(**limits: float) -> GrammarChecker:
    return GrammarChecker(lambda: (VOCABULARY.token_bytes, 0), GrammarLimits(**limits))  # type: ignore[arg-type]


async def test_a_schema_compiles_to_a_grammar_without_free_whitespace():
    grammars = checker()
    try:
        grammar = await grammars.grammar(schema_request({"type": "object", "properties": {"a": {"type": "integer"}}}))
        root = next(line for line in grammar.splitlines() if line.startswith("root ::="))
        # The engine's default would allow any whitespace between the tokens ([ \n\t]*).
        assert root == 'root ::= (("{" "\\"a\\"" ": " basic_integer "}") | ("{" "}"))'
        assert await grammars.grammar(schema_request({"type": "object", "properties": {"a": {"type": "integer"}}}))
        assert grammars.compiles == 1  # the second came from the cache
    finally:
        grammars.close()


@pytest.mark.parametrize(
    "schema, reason",
    [
        ({"enum": []}, "EBNF parser error"),
        ({"type": "string", "pattern": "(?<=a)b"}, "Lookbehind is not supported"),
        ({"type": "integer", "minimum": -1e30, "maximum": 1e30}, "Integer exceeds minimum limit"),
    ],
)
async def test_what_xgrammar_cannot_build_is_refused_with_its_reason(schema, reason):
    grammars = checker()
    try:
        with pytest.raises(ConstraintRefused) as refused:
            await grammars.grammar(schema_request(schema))
        assert reason in str(refused.value) and ".cc" not in str(refused.value)
        with pytest.raises(ConstraintRefused):  # kept: refused again without a compile
            await grammars.grammar(schema_request(schema))
        assert grammars.compiles == 1
    finally:
        grammars.close()


async def test_a_grammar_over_the_size_bound_is_refused():
    grammars = checker(text=2000)
    try:
        with pytest.raises(ConstraintRefused, match="more than 2000"):
            await grammars.grammar(schema_request({"type": "string", "pattern": "^((a{10}){10}){10}$"}))
    finally:
        grammars.close()


async def test_a_compile_past_its_time_is_killed_and_the_next_gets_a_new_worker():
    grammars = checker(seconds=0.01)
    try:
        with pytest.raises(ConstraintRefused, match="takes more than"):
            await grammars.grammar(schema_request({"type": "string", "pattern": "^((a{100}){100}){10}$"}))
        assert grammars.restarts == 1
        grammars.limits = GrammarLimits()
        assert await grammars.grammar(schema_request({"type": "boolean"}))
    finally:
        grammars.close()


async def test_a_worker_killed_from_outside_is_started_again():
    grammars = checker()
    try:
        await grammars.grammar(schema_request({"type": "boolean"}))
        assert grammars._process is not None
        os.kill(grammars._process.pid, signal.SIGKILL)
        await trio.sleep(0.2)
        assert await grammars.grammar(schema_request({"type": "integer"}))
    finally:
        grammars.close()
