"""Stop strings are never streamed past, even across token boundaries."""

from __future__ import annotations

from codespec.core.text import TextStream

PIECES = {0: "ab", 1: "c\n", 2: "EN", 3: "D", 4: "x", 5: "\xe2", 6: "\x82\xac"}


def decode(ids):
    """A byte-level-like decoder: pieces are latin-1 "bytes" joined, then UTF-8 decoded."""
    raw = "".join(PIECES[i] for i in ids).encode("latin-1")
    return raw.decode("utf-8", errors="replace")


def run(ids, stop=()):
    stream = TextStream(decode, stop)
    deltas = [stream.push(i) for i in ids]
    deltas.append(stream.flush())
    return stream, deltas


def test_plain_stream_concatenates():
    stream, deltas = run([0, 1, 4])
    assert "".join(deltas) == "abc\nx" == stream.text


def test_stop_spanning_tokens_is_held_back_then_cut():
    stream, deltas = run([0, 2, 3, 4], stop=("END",))
    assert deltas[1] == ""  # "EN" might start "END": held back
    assert "".join(deltas) == "ab" and stream.stopped
    assert all("E" not in delta for delta in deltas)


def test_held_back_prefix_is_released_when_it_does_not_complete():
    stream, deltas = run([0, 2, 4], stop=("END",))
    assert deltas[1] == "" and deltas[2] == "ENx"
    assert not stream.stopped


def test_incomplete_utf8_waits_for_the_rest_of_the_character():
    stream, deltas = run([4, 5, 6])
    assert deltas[1] == "" and deltas[2] == "\u20ac"
    assert stream.text == "x\u20ac"


def test_earliest_of_several_stops_wins():
    stream, _ = run([0, 1, 2, 3], stop=("END", "c\n"))
    assert stream.text == "ab"
