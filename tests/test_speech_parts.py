"""The speech route's parts in process (no model, no server): how a text is split into
the pieces spoken one at a time, how samples are written in each response format, and
how the voices folder is read."""

from __future__ import annotations

import io

import numpy as np
import pytest

from ovtrio.speech.encode import FORMATS, Encoder, pcm16, wav_header
from ovtrio.speech.pieces import MAX_PIECE_CHARACTERS, pieces
from ovtrio.speech.tempo import factors, stretched
from ovtrio.speech.voices import DEFAULT, OPENAI_VOICES, read_embedding, read_voices


def test_a_text_is_split_at_its_sentence_ends():
    assert pieces("Hello there. How are you?  Fine!\nNew line") == ["Hello there.", "How are you?", "Fine!", "New line"]
    assert pieces("Wait… what?! Yes.") == ["Wait…", "what?!", "Yes."]
    assert pieces("你好。再见！好") == ["你好。", "再见！", "好"]
    assert pieces("3.14 is pi. e.g.no") == ["3.14 is pi.", "e.g.no"]  # a stop inside a word is not an end
    assert pieces("  \n\t ") == [] and pieces("") == []


def test_a_long_sentence_is_cut_at_a_clause_then_a_space_then_anywhere():
    clauses = "one, two; three: " * 40
    for piece in pieces(clauses):
        assert len(piece) <= MAX_PIECE_CHARACTERS and piece.endswith((",", ";", ":")), piece
    words = "word " * 200
    cut = pieces(words)
    assert all(len(piece) <= MAX_PIECE_CHARACTERS and not piece.endswith(" ") for piece in cut)
    assert " ".join(cut).split() == words.split()  # every word kept, none split
    run = "x" * 700
    assert pieces(run) == ["x" * 300, "x" * 300, "x" * 100]


@pytest.mark.parametrize("text", ["A. B! C? D", "a" * 1000, "Dr. Who, " * 100, "Line\n\n\nline"])
def test_the_pieces_keep_every_character_but_blanks(text):
    assert "".join("".join(piece.split()) for piece in pieces(text)) == "".join(text.split())


def test_pcm_is_round_x_times_32767_clipped():
    samples = np.array([0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -3.0, 1 / 32767 * 0.49], dtype=np.float32)
    written = np.frombuffer(pcm16(samples), dtype="<i2")
    assert written.tolist() == [0, 32767, -32767, 16384, -16384, 32767, -32767, 0]


def test_the_wav_header_says_the_length_or_that_it_is_unknown():
    known = wav_header(16000, 3200)
    assert known[:4] == b"RIFF" and int.from_bytes(known[4:8], "little") == 36 + 3200
    assert int.from_bytes(known[24:28], "little") == 16000 and int.from_bytes(known[34:36], "little") == 16
    assert int.from_bytes(known[40:44], "little") == 3200 and len(known) == 44
    unknown = wav_header(16000, None)
    assert int.from_bytes(unknown[4:8], "little") == int.from_bytes(unknown[40:44], "little") == 0xFFFFFFFF


def _decoded(data: bytes) -> tuple[int, int]:
    import av

    count, rate = 0, 0
    with av.open(io.BytesIO(data)) as container:
        for frame in container.decode(container.streams.audio[0]):
            count += frame.samples
            rate = frame.sample_rate
    return rate, count


@pytest.mark.parametrize("response_format", [name for name in FORMATS if name != "pcm"])
def test_each_format_written_in_pieces_decodes_to_the_samples_length(response_format):
    tone = (0.3 * np.sin(np.arange(32000) / 16000 * 2 * np.pi * 220)).astype(np.float32)
    encoder = Encoder(response_format, 16000)
    parts = [encoder.add(tone[:12000]), encoder.add(tone[12000:], last=True), encoder.finish()]
    assert parts[0], "the first piece's bytes leave with it"
    rate, count = _decoded(b"".join(parts))
    assert rate == (48000 if response_format == "opus" else 16000)
    assert 2.0 <= count / rate <= 2.15, count / rate
    again = Encoder(response_format, 16000)
    assert b"".join([again.add(tone[:12000]), again.add(tone[12000:], last=True), again.finish()]) == b"".join(parts)


def test_a_wav_of_one_piece_says_its_length_and_of_more_does_not():
    tone = np.zeros(1600, dtype=np.float32)
    one = Encoder("wav", 16000).add(tone, last=True)
    assert int.from_bytes(one[40:44], "little") == 3200 == len(one) - 44
    two = Encoder("wav", 16000)
    first = two.add(tone)
    assert int.from_bytes(first[40:44], "little") == 0xFFFFFFFF and len(two.add(tone)) == 3200


def test_the_voices_are_the_folders_files_of_the_right_size(tmp_path, caplog):
    model, voices = tmp_path / "model", tmp_path / "voices"
    model.mkdir()
    voices.mkdir()
    anna = np.linspace(-1, 1, 512, dtype=np.float32)
    (voices / "anna.bin").write_bytes(anna.astype("<f4").tobytes())
    np.save(voices / "bert.npy", anna[::-1].astype(np.float64))
    (voices / "short.bin").write_bytes(b"\0" * 100)
    np.save(voices / "ints.npy", np.arange(512))
    np.save(voices / "nan.npy", np.full(512, np.nan, dtype=np.float32))
    (voices / "notes.txt").write_text("not a voice")
    found = read_voices(model, voices, 512)
    assert found.names == [DEFAULT, "anna", "bert"]
    assert found.named(DEFAULT) is None  # the pipeline's own x-vector
    assert np.array_equal(found.named("anna"), anna.reshape(1, 512))
    assert np.array_equal(found.named("bert"), anna[::-1].reshape(1, 512))
    assert all(found.named(name) is None for name in OPENAI_VOICES)
    with pytest.raises(KeyError):
        found.named("short")
    assert "short.bin" in caplog.text and "ints.npy" in caplog.text and "nan.npy" in caplog.text


def test_the_folders_own_embedding_is_the_default_and_a_file_can_take_an_openai_name(tmp_path):
    model = tmp_path / "model"
    (model / "voices").mkdir(parents=True)
    own = np.full((1, 512), 0.01, dtype=np.float32)
    np.save(model / "speaker_embedding.npy", own)
    alloy = np.full(512, 0.02, dtype=np.float32)
    (model / "voices" / "alloy.bin").write_bytes(alloy.tobytes())
    found = read_voices(model, None, 512)  # the folder's voices/ by default
    assert np.array_equal(found.named(DEFAULT), own) and np.array_equal(found.named("echo"), own)
    assert np.array_equal(found.named("alloy"), alloy.reshape(1, 512))
    with pytest.raises(ValueError, match="not 256 float32 numbers"):
        read_embedding(model / "voices" / "alloy.bin", 256)


@pytest.mark.parametrize("speed", [0.25, 0.3, 0.5, 0.8, 1.5, 2.0, 3.0, 4.0])
def test_speed_is_a_chain_of_atempo_factors_and_stretches_by_it(speed):
    chain = factors(speed)
    assert all(0.5 <= factor <= 2.0 for factor in chain) and np.isclose(np.prod(chain), speed)
    tone = (0.3 * np.sin(np.arange(48000) / 16000 * 2 * np.pi * 220)).astype(np.float32)
    out = stretched(tone, 16000, speed)
    assert out.dtype == np.float32 and 0.95 <= len(out) * speed / len(tone) <= 1.05


def test_speed_one_leaves_the_samples_as_they_are():
    tone = np.linspace(-1, 1, 1000, dtype=np.float32)
    assert stretched(tone, 16000, 1.0) is tone
