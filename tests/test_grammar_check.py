"""The grammar checker (ovtrio/constraints/check.py) with its real worker process and
XGrammar: what compiles comes back as the EBNF the engine is given, without free
whitespace; what does not, or runs past the limits, is refused with XGrammar's reason
and no build paths; a worker killed past its limits or from outside is started again,
and every result the constraint decides is kept, none that the machine does.

Where a race or a misbehaving worker is the point, a stand-in worker (a few lines of
Python run in the real worker's place) sleeps, dies or speaks out of turn on cue."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest
import trio

from fake_engine import VOCABULARY
from ovtrio.constraints import check as grammar_check
from ovtrio.constraints import worker as grammar_worker
from ovtrio.constraints.check import CheckerBusy, CheckerClosed, ConstraintRefused, GrammarChecker, GrammarLimits


def schema_request(schema: object) -> dict:
    return {"kind": "json_schema", "schema": json.dumps(schema), "stop_token_ids": [0]}


@pytest.fixture(autouse=True)
def compiles_are_timed_by_cpu_only(monkeypatch):
    """The worker runs at a low priority: on a loaded machine its clock time is many times
    its CPU time, and these tests are about what it compiles, not the clock (the tests
    of the clock set WALL_FACTOR themselves)."""
    monkeypatch.setattr(grammar_check, "WALL_FACTOR", 10_000)


def checker(**limits: float) -> GrammarChecker:
    return GrammarChecker(lambda: (VOCABULARY.token_bytes, 0), GrammarLimits(**limits))  # type: ignore[arg-type]


async def test_a_schema_compiles_to_a_grammar_without_free_whitespace():
    grammars = checker()
    try:
        grammar = await grammars.grammar(schema_request({"type": "object", "properties": {"a": {"type": "integer"}}}))
        root = next(line for line in grammar.splitlines() if line.startswith("root ::="))
        # The engine's default would allow any whitespace between the tokens ([ \n\t]*);
        # XGrammar's own separators without it are ", " and ": ".
        assert root == 'root ::= (("{" "\\"a\\"" ":" basic_integer "}") | ("{" "}"))'
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


async def test_a_compile_past_its_time_is_killed_and_the_next_gets_a_new_worker(monkeypatch):
    # Only its CPU time decides, however little of it the load leaves the worker.
    monkeypatch.setattr(grammar_check, "WALL_FACTOR", 10_000)
    grammars = checker(seconds=0.01)
    try:
        slow = schema_request({"type": "string", "pattern": "^((a{100}){100}){100}$"})  # 2.5 s of CPU time
        with pytest.raises(ConstraintRefused, match="takes more than"):
            await grammars.grammar(slow)
        assert grammars.restarts == 1
        with pytest.raises(ConstraintRefused, match="takes more than"):  # kept: its cost is its own
            await grammars.grammar(slow)
        assert grammars.compiles == 1
        grammars.limits = GrammarLimits()
        assert await grammars.grammar(schema_request({"type": "boolean"}))
    finally:
        grammars.close()


async def test_a_worker_killed_from_outside_is_started_again():
    grammars = checker()
    try:
        await grammars.grammar(schema_request({"type": "boolean"}))
        assert grammars._process is not None
        killed = grammars._process
        os.kill(killed.pid, signal.SIGKILL)
        with trio.fail_after(120):  # gone, however long a loaded machine takes to reap it
            await killed.wait()
        assert await grammars.grammar(schema_request({"type": "integer"}))
    finally:
        grammars.close()


@pytest.fixture
def spawned(monkeypatch) -> list[trio.Process]:
    """The workers the checker starts, in order."""
    started: list[trio.Process] = []
    open_process = trio.lowlevel.open_process

    async def spawn(*args, **kwargs) -> trio.Process:
        process = await open_process(*args, **kwargs)
        started.append(process)
        return process

    monkeypatch.setattr(trio.lowlevel, "open_process", spawn)
    return started


def stand_in(monkeypatch, tmp_path: Path, ready: str = '{"ready": true}', first: str = "") -> None:
    """Run a stand-in worker in the real one's place: it reads the vocabulary, says
    `ready`, then answers each request with a grammar, its id echoed; the first request
    any stand-in gets runs `first` before (Python: sleep, exit, ...)."""
    marker = tmp_path / "first-request-seen"
    script = tmp_path / "stand_in_worker.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, os, sys, time
            source = sys.stdin.buffer
            source.read(int(source.readline()))
            print({ready!r}, flush=True)
            for line in source:
                request = json.loads(line)
                if not os.path.exists({str(marker)!r}):
                    open({str(marker)!r}, "w").close()
                    {first or "pass"}
                print(json.dumps({{"grammar": "root ::= " + request["schema"], "id": request.get("id")}}), flush=True)
            """
        )
    )
    monkeypatch.setattr(grammar_check, "WORKER", script)


async def test_a_request_cancelled_while_the_worker_starts_leaves_no_answer_out_of_step(spawned):
    grammars = checker()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(grammars.grammar, schema_request({"type": "boolean"}))
            with trio.fail_after(30):
                while not spawned:
                    await trio.sleep(0.001)
            nursery.cancel_scope.cancel()  # its client left before the worker was ready
        # Each request gets its own grammar, not the ready line or the one before's.
        assert "true" in await grammars.grammar(schema_request({"type": "boolean"}))
        assert "basic_integer" in await grammars.grammar(schema_request({"type": "integer"}))
        assert spawned[0].returncode is not None  # killed, and reaped
    finally:
        grammars.close()


@pytest.mark.parametrize(
    "ready, first, refused",
    [
        ('{"ready": true}', "time.sleep(2)", "too busy to compile it"),
        ('{"ready": true}', "sys.exit(1)", "the grammar compiler ended"),
        ('{"ready": true}', 'print("{}", flush=True)', "the grammar compiler ended"),
        ("not JSON", "", "cannot be checked on this server"),
    ],
    ids=["starved", "died", "out-of-step", "bad-ready-line"],
)
async def test_what_the_machine_does_to_the_worker_is_a_busy_refusal_and_not_kept(
    monkeypatch, tmp_path, spawned, ready, first, refused
):
    stand_in(monkeypatch, tmp_path, ready, first)
    # A second of CPU time, far more than a sleep uses (CPU time is counted in ticks of
    # 10 ms, which a loaded machine may charge), and for the starved worker 0.1 s on the
    # clock: the sleep is past it. The others end by themselves, told by the worker's
    # exit or its answer, which a loaded machine may take longer than 0.1 s to give.
    wall_factor = grammar_check.WALL_FACTOR
    monkeypatch.setattr(grammar_check, "WALL_FACTOR", 0.1 if "sleep" in first else 10_000)
    grammars = checker(seconds=4.0)
    try:
        # CheckerBusy: the machine's doing, answered as an overload (429), not a 400.
        with pytest.raises(CheckerBusy, match=refused):
            await grammars.grammar(schema_request({"type": "boolean"}))
        if ready != "not JSON":
            monkeypatch.setattr(grammar_check, "WALL_FACTOR", wall_factor)
            grammars.limits = GrammarLimits()  # time enough, however loaded the machine
            assert await grammars.grammar(schema_request({"type": "boolean"})) == 'root ::= {"type": "boolean"}'
            assert len(spawned) == 2  # a new worker for the same constraint, compiled this time
    finally:
        grammars.close()


async def test_a_compile_whose_client_left_runs_to_its_end_and_is_kept(monkeypatch, tmp_path, spawned):
    stand_in(monkeypatch, tmp_path, first="time.sleep(0.5)")
    grammars = checker()
    try:
        with trio.move_on_after(10) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(grammars.grammar, schema_request({"type": "boolean"}))
                while grammars.compiles == 0:
                    await trio.sleep(0.001)
                nursery.cancel_scope.cancel()  # its client left mid-compile
        assert not scope.cancelled_caught
        assert await grammars.grammar(schema_request({"type": "boolean"})) == 'root ::= {"type": "boolean"}'
        assert (grammars.compiles, grammars.restarts, len(spawned)) == (1, 0, 1)  # kept: no compile, no new worker
    finally:
        grammars.close()


async def test_after_close_every_request_waiting_or_new_is_told_the_server_is_stopping(monkeypatch, tmp_path, spawned):
    stand_in(monkeypatch, tmp_path, first="time.sleep(1)")
    grammars = checker()
    outcomes: list[Exception] = []

    async def ask(schema: object) -> None:
        try:
            await grammars.grammar(schema_request(schema))
        except Exception as exc:  # noqa: BLE001 - any, to be compared below
            outcomes.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask, {"type": "boolean"})  # awaits its answer
        with trio.fail_after(120):
            while grammars.compiles == 0 and not outcomes:
                await trio.sleep(0.001)
        nursery.start_soon(ask, {"type": "integer"})  # waits for the first
        await trio.sleep(0.05)
        grammars.close()
    await ask({"type": "string"})
    assert [type(exc) for exc in outcomes] == [CheckerClosed] * 3, outcomes
    assert len(spawned) == 1  # none started after close


async def test_without_xgrammar_every_constraint_is_refused_at_once_with_how_to_install_it(
    monkeypatch, tmp_path, spawned, caplog
):
    # A distribution of another version first on the worker's path: as without one.
    metadata = tmp_path / "xgrammar-0.0.1.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text("Metadata-Version: 2.1\nName: xgrammar\nVersion: 0.0.1\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    grammars = checker()
    try:
        with caplog.at_level(logging.WARNING, logger="ovtrio"):
            for schema in ({"type": "boolean"}, {"type": "integer"}, {"type": "boolean"}):
                with pytest.raises(ConstraintRefused, match=r"pip install --no-deps xgrammar==0\.1\.31"):
                    await grammars.grammar(schema_request(schema))
        assert len(spawned) == 1
        assert len([r for r in caplog.records if "xgrammar" in r.getMessage()]) == 1
    finally:
        grammars.close()


@pytest.mark.parametrize(
    "string",
    [{"type": "string"}, {"type": "string", "maxLength": 8}, {"type": "string", "pattern": "^a.*$"}],
    ids=["plain", "max-length", "pattern-dot"],
)
def test_the_grammar_lets_no_raw_control_character_into_a_string(string):
    """What the engine is given admits JSON only: no raw U+0000-U+001F (nor a raw quote)
    in a string, its escapes still allowed, counted strings and patterns included."""
    from ovtrio.constraints.worker import VOCAB_RAW, json_safe, load_bindings

    xgr = load_bindings()
    vocab = [bytes([i]) for i in range(256)] + [b"</s>"]
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo(vocab, VOCAB_RAW, len(vocab), [256], True), 1, False, -1)
    schema = json.dumps({"type": "object", "properties": {"city": string}, "required": ["city"]})
    text = json_safe(xgr.Grammar.from_json_schema(schema, False, None, None, True, None, False).to_string())
    compiled = compiler.compile_grammar(xgr.Grammar.from_ebnf(text, "root"))

    def accepted(output: str) -> bool:
        matcher = xgr.GrammarMatcher(compiled, [256], False, 0)
        return bool(matcher.accept_string(output, False) and matcher.accept_token(256, False))

    for raw in ('{"city": "a\x01b"}', '{"city": "a\tb"}', '{"city": "a"b"}'):
        assert not accepted(raw), raw
    for valid in ('{"city": "a\\tb"}', '{"city": "a\\u0001"}', '{"city": "ab"}'):
        assert accepted(valid) and json.loads(valid), valid


SPACE = "\u2581"  # sentencepiece's space


async def test_on_a_sentencepiece_vocabulary_a_grammars_spaces_are_spelt_as_its_pieces_spell_them():
    """The engine matches a sentencepiece model's pieces as written ("▁York"), where no
    token holds a space: the grammar it is given spells every space of a literal, an enum
    or a pattern's class as "▁", and the pieces then write what the schema allows."""
    from ovtrio.constraints.worker import VOCAB_RAW, load_bindings

    pieces = ["<pad>", "</s>", "{", "}", '"', ":", ",", "c", "p", "New", SPACE + "York", SPACE, "a", "b", "~", "\u00e9"]
    vocab = [piece.encode() for piece in pieces]
    assert grammar_worker.space_piece(vocab) == SPACE
    assert grammar_worker.space_piece(VOCABULARY.token_bytes) is None  # byte-level: spaces are spaces
    schema = {
        "type": "object",
        "properties": {
            "c": {"enum": ["New York", "b"]},
            "p": {"type": "string", "pattern": "^[ -~]+$"},  # a space bounding a range
        },
        "required": ["c", "p"],
        "additionalProperties": False,
    }
    grammars = GrammarChecker(lambda: (vocab, 1))
    try:
        text = await grammars.grammar({"kind": "json_schema", "schema": json.dumps(schema), "stop_token_ids": [1]})
    finally:
        grammars.close()
    assert '"\\"New' + SPACE + 'York\\""' in text

    xgr = load_bindings()
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo(vocab, VOCAB_RAW, len(vocab), [1], True), 1, False, -1)
    grammar = compiled.compile_grammar(xgr.Grammar.from_ebnf(text, "root"))

    def writes(*written: str) -> bool:
        matcher = xgr.GrammarMatcher(grammar, [1], False, 0)
        return all(matcher.accept_token(pieces.index(piece), False) for piece in (*written, "</s>"))

    quoted = ('"', "c", '"', ":", '"', "New", SPACE + "York", '"', ",", '"', "p", '"', ":", '"')
    assert writes("{", *quoted, "a", SPACE, "~", '"', "}")
    # The pattern's class still holds its range and nothing outside it.
    assert not writes("{", *quoted, "a", "\u00e9", '"', "}")
    assert not writes("{", '"', "c", '"', ":", '"', "New", '"', "}")  # "New" alone is no enum value
