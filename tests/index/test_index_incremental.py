"""Incremental edits equal a full rebuild (hypothesis-generated edit sequences)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codespec.index import WorkspaceIndex
from codespec.index.retokenize import full_encode, splice

# Fragments that stress pre-tokenizer edge cases: whitespace runs that merge, newlines with
# indentation, contractions, digits, multi-byte characters, a special token, CRLF, odd spaces.
FRAGMENTS = [
    "a",
    "bc",
    "def",
    " ",
    "  ",
    "    ",
    "\n",
    "\n    ",
    "\t",
    "x1",
    "(",
    "):",
    ".",
    "'s",
    "'",
    "123",
    "é",
    "中文",
    "\U0001f600",
    "<|endoftext|>",
    "\r\n",
    "\u3000",
    "#",
    "return",
    "_",
]
texts = st.lists(st.sampled_from(FRAGMENTS), max_size=30).map("".join)
edit = st.tuples(st.floats(0, 1), st.integers(0, 8), texts.filter(lambda t: len(t) <= 12))
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _apply(text, fraction, length, replacement):
    start = int(fraction * len(text))
    end = min(len(text), start + length)
    return start, end, text[:start] + replacement + text[end:]


def check_splices(adapter, initial, edits):
    """Apply ``edits`` one by one through ``splice``: after each, text, tokens and starts equal a
    full encode of the new text."""
    text = initial
    token_ids, starts = full_encode(adapter, text)
    for fraction, length, replacement in edits:
        start, end, expected_text = _apply(text, fraction, length, replacement)
        result = splice(adapter, text, token_ids, starts, start, end, replacement)
        text, token_ids, starts = result.text, result.token_ids, result.starts
        assert text == expected_text
        full_ids, full_starts = full_encode(adapter, text)
        assert np.array_equal(token_ids, full_ids)
        assert np.array_equal(starts, full_starts)


@SETTINGS
@given(initial=texts, edits=st.lists(edit, min_size=1, max_size=8))
def test_splice_equals_full_encode(index_adapter, initial, edits):
    check_splices(index_adapter, initial, edits)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(initial=texts, edits=st.lists(edit, min_size=1, max_size=4))
def test_splice_without_byte_table(index_tokenizer, initial, edits):
    """The generic path (token starts from the tokenizer's offsets) gives the same result."""
    from codespec.index.tokens import TokenizerAdapter

    adapter = TokenizerAdapter(index_tokenizer)
    adapter.byte_lengths = None
    check_splices(adapter, initial, edits)


@SETTINGS
@given(initial=texts, edits=st.lists(edit, min_size=1, max_size=6), in_level=st.booleans())
def test_index_edits_equal_rebuild(index_tokenizer, index_adapter, initial, edits, in_level):
    """Through the index, with the document starting in the overlay or in an immutable level;
    lookups see each edit immediately."""
    index = WorkspaceIndex(index_tokenizer, overlay_tokens=0 if in_level else 1 << 20)
    index.add_document("mem://doc", initial + "\nmarker_line = 1\n")
    for n in range(5):
        index.add_document(f"mem://filler{n}", f"filler_{n} = {n}\n")
    text = index.document_text("mem://doc")
    for version, (fraction, length, replacement) in enumerate(edits, start=1):
        start, end, text = _apply(text, fraction, length, replacement)
        index.update_document("mem://doc", start, end, replacement, version)
        assert index.document_text("mem://doc") == text
        assert index.document_tokens("mem://doc") == index_adapter.encode(text)
        tokens = index.document_tokens("mem://doc")
        if len(tokens) >= 3:  # the document's own ending is found again, with a full-length match
            found = index.lookup(tokens[:-1], 1, max_candidates=64)
            assert found and found[0].match_len == min(index.max_ngram, len(tokens) - 1)
            assert (tokens[-1],) in [c.token_ids for c in found]
    index.check_integrity()


def test_one_line_edit_touches_a_small_window(index_adapter):
    """A one-character edit in a long file re-encodes tens of tokens, not the file."""
    line = "    value = compute(alpha, beta) + 1\n"
    text = "".join(line.replace("value", f"value{n}") for n in range(2000))
    token_ids, starts = full_encode(index_adapter, text)
    position = text.index("value1000 =") + 5
    result = splice(index_adapter, text, token_ids, starts, position, position + 1, "X")
    assert result.inserted < 40 and result.stop - result.first < 40
    assert np.array_equal(result.token_ids, full_encode(index_adapter, result.text)[0])
