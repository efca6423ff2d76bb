"""Literal lookups: longest match wins, nearest / newest preferred, token-boundary matches, history."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codespec.index import WorkspaceIndex
from codespec.index.ranking import Occurrence, rank


def ids(adapter, text):
    return adapter.encode(text)


def decode(tokenizer, token_ids):
    return tokenizer.decode(list(token_ids))


@pytest.fixture(params=["overlay", "level"])
def make_index(request, index_tokenizer):
    """Both homes of a document: the scanned overlay, and an immutable level (overlay_tokens=0
    moves every document but the few most recently changed ones into levels)."""

    def make(**kwargs):
        if request.param == "level":
            kwargs.setdefault("overlay_tokens", 0)
        return WorkspaceIndex(index_tokenizer, **kwargs)

    make.mode = request.param
    return make


def settle(index, count=5):
    """Push earlier documents out of the hot overlay set by adding unrelated filler documents."""
    for n in range(count):
        index.add_document(f"mem://filler{n}", f"zz{n} = {n} * {n}\n")


def test_longest_match_wins(make_index, index_adapter, index_tokenizer):
    index = make_index(max_ngram=32)
    index.add_document("mem://a", "value = alpha beta gamma delta(first_choice)\n")
    index.add_document("mem://b", "value = gamma delta(second_choice)\n" * 3)
    settle(index)
    found = index.lookup(ids(index_adapter, "x = alpha beta gamma delta("), max_len=8)
    assert found[0].source == "mem://a"
    assert decode(index_tokenizer, found[0].token_ids).startswith("first")
    shorter = len(ids(index_adapter, " gamma delta("))
    assert found[0].match_len >= len(ids(index_adapter, " alpha beta gamma delta(")) > shorter
    assert all(c.match_len == found[0].match_len for c in found)
    index.check_integrity()


def test_nearest_occurrence_in_same_document_first(make_index, index_adapter, index_tokenizer):
    index = make_index()
    lines = (
        ["result = compute(left_value)\n"]
        + [f"pad_{n} = {n}\n" for n in range(40)]
        + ["result = compute(right_value)\n"]
        + [f"tail_{n} = {n}\n" for n in range(40)]
    )
    text = "".join(lines)
    index.add_document("mem://doc", text)
    index.add_document("mem://other", "result = compute(other_value)\n")
    settle(index)
    context = ids(index_adapter, "result = compute(")
    near_second = index.token_offset("mem://doc", text.index("tail_0"))
    near_first = index.token_offset("mem://doc", text.index("pad_0"))
    assert near_second == len(ids(index_adapter, text[: text.index("tail_0")]))
    second = index.lookup(context, 8, uri="mem://doc", cursor=near_second)
    first = index.lookup(context, 8, uri="mem://doc", cursor=near_first)
    assert decode(index_tokenizer, second[0].token_ids).startswith("right")
    assert decode(index_tokenizer, first[0].token_ids).startswith("left")
    assert first[0].source == second[0].source == "mem://doc"
    assert any(c.source == "mem://other" for c in first)
    assert first[0].score > max(c.score for c in first if c.source != "mem://doc")


def test_most_recent_document_preferred(make_index, index_adapter, index_tokenizer):
    index = make_index()
    index.add_document("mem://old", "handler = make_handler(old_style)\n")
    index.add_document("mem://new", "handler = make_handler(new_style)\n")
    settle(index)
    found = index.lookup(ids(index_adapter, "h = make_handler("), 3)
    assert [c.source for c in found[:2]] == ["mem://new", "mem://old"]
    index.update_document("mem://old", 0, 0, "# touched\n", version=2)
    found = index.lookup(ids(index_adapter, "h = make_handler("), 3)
    assert found[0].source == "mem://old"


def test_recency_beats_frequency_after_many_ticks(make_index, index_adapter):
    """Hundreds of clock ticks (touches) make neighbouring ticks nearly equal as fractions of the
    clock; the newer document must still win over an older one with more occurrences."""
    index = make_index()
    for _ in range(300):
        index.add_document("mem://busy", "zz = 0\n")  # unchanged text: each call only ticks the clock
    index.add_document("mem://old", "h = make_handler(old_style)\n" * 4)
    index.add_document("mem://new", "h = make_handler(new_style)\n")
    settle(index)
    found = index.lookup(ids(index_adapter, "x = make_handler("), 3)
    assert [c.source for c in found[:2]] == ["mem://new", "mem://old"]
    assert found[0].score > found[1].score


def test_frequency_breaks_a_recency_tie(index_tokenizer, index_adapter):
    for order in (["mem://once", "mem://many"], ["mem://many", "mem://once"]):
        index = WorkspaceIndex(index_tokenizer)
        texts = {"mem://once": "h = make_handler(single)\n", "mem://many": "h = make_handler(repeated)\n" * 3}
        index.add_documents({uri: texts[uri] for uri in order})  # one batch: one tick for both
        found = index.lookup(ids(index_adapter, "x = make_handler("), 3)
        assert [c.source for c in found] == ["mem://many", "mem://once"]
        assert found[0].score > found[1].score


def test_same_document_near_cursor_beats_recency_and_frequency(make_index, index_adapter, index_tokenizer):
    index = make_index()
    text = "h = make_handler(local_style)\n" + "".join(f"pad_{n} = {n}\n" for n in range(20))
    index.add_document("mem://here", text)
    for _ in range(300):
        index.add_document("mem://busy", "zz = 0\n")
    index.add_document("mem://newer", "h = make_handler(remote_style)\n" * 4)
    settle(index)
    cursor = index.token_offset("mem://here", len(text))
    found = index.lookup(ids(index_adapter, "x = make_handler("), 3, uri="mem://here", cursor=cursor)
    assert [c.source for c in found[:2]] == ["mem://here", "mem://newer"]
    assert decode(index_tokenizer, found[0].token_ids).startswith("local")


occurrences = st.lists(
    st.builds(
        Occurrence,
        source=st.sampled_from(["mem://a", "mem://b", "history:accepted"]),
        position=st.integers(0, 50),
        continuation=st.lists(st.integers(0, 3), min_size=1, max_size=3).map(tuple),
        same_document=st.booleans(),
        distance=st.integers(0, 500),
        recency=st.integers(0, 1000),
    ),
    max_size=30,
)


@given(occurrences, st.integers(0, 10**6))
@settings(max_examples=300, deadline=None)
def test_rank_is_lexicographic(found, extra_ticks):
    """Same document (nearer first), then recency, then frequency: never a trade between them,
    however far the clock has run; ``score`` never increases down the list."""
    found = [o if o.same_document else replace(o, distance=0) for o in found]
    ranked = rank(found, max_candidates=100, newest=1000 + extra_ticks)
    keys = [
        (not r.occurrence.same_document, r.occurrence.distance, -r.occurrence.recency, -r.frequency) for r in ranked
    ]
    assert keys == sorted(keys)
    assert all(a.score >= b.score for a, b in zip(ranked, ranked[1:]))
    assert sum(r.frequency for r in ranked) == len(found)


def test_match_across_token_boundary(make_index, index_adapter):
    """The context ends inside an identifier (as the document's tokens split it), and the
    continuation starts mid-word: matching is on tokens, not words."""
    index = make_index()
    text = "def configure_everything(settings):\n    return settings.unusualattribute + 1\n"
    index.add_document("mem://doc", text)
    settle(index)
    tokens = index.document_tokens("mem://doc")
    word_start = text.index("unusualattribute")
    starts = index_adapter.char_starts(text, index_adapter.encode_array(text)).tolist()
    inside = [i for i, s in enumerate(starts) if word_start < s < word_start + len("unusualattribute")]
    assert inside, "the test word must span several tokens"
    cut = inside[0]
    found = index.lookup(tokens[:cut], 5)
    assert found[0].token_ids == tuple(tokens[cut : cut + 5])
    assert found[0].position == cut and found[0].source == "mem://doc"


def test_cursor_occurrence_and_short_contexts_are_skipped(make_index, index_adapter):
    index = make_index()
    text = "unique_name = 1\nunique_name = 2\n"
    index.add_document("mem://doc", text)
    tokens = index.document_tokens("mem://doc")
    cut = len(ids(index_adapter, "unique_name = 1\nunique_name ="))
    found = index.lookup(tokens[:cut], 2, uri="mem://doc", cursor=cut)
    assert found and all(c.position != cut for c in found)
    assert index.lookup(tokens[:1], 4) == []
    assert index.lookup(tokens[:cut], 0) == []


def test_history_sources_and_replaced_text(make_index, index_adapter, index_tokenizer):
    index = make_index()
    index.add_history("accepted", "response = client.send_request(payload, timeout=30)\n", uri="mem://x")
    found = index.lookup(ids(index_adapter, "r = client.send_request("), 12)
    assert found[0].source == "history:accepted"
    assert decode(index_tokenizer, found[0].token_ids).startswith("payload, ti")
    index.add_document("mem://doc", "limit = compute_limit(original_argument)\n")
    start = index.document_text("mem://doc").index("original_argument")
    index.update_document("mem://doc", start, start + len("original_argument"), "new", version=1)
    found = index.lookup(ids(index_adapter, "x = compute_limit("), 8)
    sources = {c.source: decode(index_tokenizer, c.token_ids) for c in found}
    assert sources["mem://doc"].startswith("new")
    assert "history:replaced" not in sources  # replaced text alone has no "compute_limit(" before it
    found = index.lookup(ids(index_adapter, "original_"), 3)
    assert found[0].source == "history:replaced"
    index.check_integrity()


def test_history_takes_the_ids_a_model_generated(make_index, index_adapter, index_tokenizer):
    """A model's output is kept as the ids it generated (its later outputs repeat those, which the
    text encoded again need not be); with an id no token of this vocabulary has, its text encoded."""
    index = make_index()
    text = "response = client.send_request(payload, timeout=30)\n"
    generated = ids(index_adapter, text)
    spelled = [token for character in text for token in ids(index_adapter, character)]  # not the encoding
    assert spelled != generated
    index.add_history("generated", text, tokens=spelled)
    index.add_history("generated", text, tokens=[*generated[:3], index_adapter.vocab_size, *generated[3:]])
    assert [entry.token_ids for entry in index.history_entries("generated")] == [tuple(spelled), tuple(generated)]
    found = index.lookup(ids(index_adapter, "r = client.send_request("), 12)
    assert found[0].source == "history:generated"
    assert decode(index_tokenizer, found[0].token_ids).startswith("payload, ti")
    index.check_integrity()


def test_edits_are_visible_to_the_next_lookup(make_index, index_adapter, index_tokenizer):
    index = make_index()
    index.add_document("mem://doc", "alpha = first_function(one)\n")
    settle(index)
    index.update_document("mem://doc", 0, len("alpha = first_function(one)"), "alpha = second_function(two)", 1)
    stale = index.lookup(ids(index_adapter, "x = first_function("), 3)
    assert [c.source for c in stale] == ["history:replaced"]  # the old text lives on only as history
    found = index.lookup(ids(index_adapter, "x = second_function("), 8)
    assert decode(index_tokenizer, found[0].token_ids).startswith("two")
    index.remove_document("mem://doc")
    assert all(c.source != "mem://doc" for c in index.lookup(ids(index_adapter, "x = second_function("), 3))
    with pytest.raises(KeyError):
        index.document_text("mem://doc")
    index.check_integrity()


def test_add_documents_in_bulk(tmp_path, index_tokenizer, index_adapter):
    documents = {f"mem://{n}": f"item_{n} = build_item({n}, flag_{n})\n" for n in range(20)}
    index = WorkspaceIndex(index_tokenizer, db_path=tmp_path / "index.db")
    index.add_documents(documents, version=2)
    assert sorted(index.documents()) == sorted(documents)
    found = index.lookup(ids(index_adapter, "x = build_item(7,"), 6)
    assert found[0].source == "mem://7"
    index.update_document("mem://7", 0, 0, "# edited\n", version=3)
    index.check_integrity()
    index.close()
    with WorkspaceIndex(index_tokenizer, db_path=tmp_path / "index.db") as reopened:
        assert reopened.document_text("mem://3") == documents["mem://3"]
        assert reopened.document_text("mem://7") == "# edited\n" + documents["mem://7"]


def test_bad_input_is_refused_and_loses_nothing(index_tokenizer, index_adapter):
    index = WorkspaceIndex(index_tokenizer)
    index.add_document("mem://doc", "kept = 1\n")
    with pytest.raises(ValueError, match="outside"):
        index.update_document("mem://doc", 5, 50, "x", version=2)
    assert index.document_text("mem://doc") == "kept = 1\n"
    with pytest.raises(KeyError):
        index.update_document("mem://missing", 0, 0, "x", version=1)
    assert index.lookup([-5, 10**7, *index_adapter.encode("kept =")], 4)[0].source == "mem://doc"
    assert index.lookup([-5, 10**7], 4) == []
    index.check_integrity()
