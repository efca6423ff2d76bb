"""Random operation sequences against a plain model: every lookup's answer is checked by brute force.

Small ``overlay_tokens`` and a memory budget push documents through every path: overlay, new
levels, merges, rebuilds of half-dead levels, eviction and reload.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codespec.index import WorkspaceIndex

WORDS = ["alpha", "beta", "gamma", " ", "\n", "(", ")", " = ", "x", "1", "\n    ", "return", ":"]
texts = st.lists(st.sampled_from(WORDS), min_size=0, max_size=40).map("".join)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 9), texts),
        st.tuples(st.just("add"), st.integers(0, 9), texts),
        st.tuples(st.just("edit"), st.integers(0, 9), st.floats(0, 1), st.integers(0, 6), texts),
        st.tuples(st.just("remove"), st.integers(0, 9)),
        st.tuples(st.just("history"), st.sampled_from(["accepted", "generated"]), texts),
        st.tuples(st.just("lookup"), st.integers(0, 9), st.integers(0, 200), st.integers(2, 10)),
        st.tuples(st.just("lookup"), st.integers(0, 9), st.integers(0, 200), st.integers(2, 10)),
        st.tuples(st.just("jobs"), st.integers(0, 3)),
    ),
    min_size=8,
    max_size=40,
)


def brute_force_longest(index, context, max_ngram, min_ngram):
    """Longest suffix match of ``context`` over resident documents and history, by definition."""
    sequences = [index.document_tokens(u) for u in index.documents()]
    sequences += [[t for t in b.tokens.tolist()] for b in index._history.buffers.values()]
    best = 0
    for tokens in sequences:
        for end in range(1, len(tokens)):  # continuation starts at `end`
            if tokens[end] == index.adapter.sep:
                continue
            n = 0
            while n < min(max_ngram, len(context)) and end - 1 - n >= 0 and tokens[end - 1 - n] == context[-1 - n]:
                n += 1
            best = max(best, n)
    return best if best >= min_ngram else 0


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations, with_db=st.booleans(), background=st.booleans())
def test_random_operations(tmp_path_factory, index_tokenizer, ops, with_db, background):
    """``background``: every rebuild / merge is a deferred background job, run only at "jobs"
    steps, so documents change between a job's snapshot and its install."""
    db = tmp_path_factory.mktemp("ops") / "index.db" if with_db else None
    index = WorkspaceIndex(
        index_tokenizer,
        db_path=db,
        max_ngram=6,
        overlay_tokens=8,
        hot_documents=1,
        memory_budget_tokens=60,
        background_tokens=0 if background else 1 << 20,
    )
    if background:
        index._levels.deferred = []
    model: dict[str, str] = {}
    version = 0
    for op in ops:
        version += 1
        if op[0] == "add":
            uri = f"mem://{op[1]}"
            index.add_document(uri, op[2], version)
            model[uri] = op[2]
        elif op[0] == "edit" and f"mem://{op[1]}" in model:
            uri, text = f"mem://{op[1]}", model[f"mem://{op[1]}"]
            start = int(op[2] * len(text))
            end = min(len(text), start + op[3])
            index.update_document(uri, start, end, op[4], version)
            model[uri] = text[:start] + op[4] + text[end:]
        elif op[0] == "remove":
            index.remove_document(f"mem://{op[1]}")
            model.pop(f"mem://{op[1]}", None)
        elif op[0] == "history":
            index.add_history(op[1], op[2])
        elif op[0] == "jobs" and background:
            jobs = index._levels.deferred
            for job in jobs[: op[1] + 1]:
                job()
            del jobs[: op[1] + 1]
        elif op[0] == "lookup" and model:
            uri = sorted(model)[op[1] % len(model)]
            tokens = index.document_tokens(uri)  # (re)loads an evicted document
            if len(tokens) < 2:
                continue
            cut = 1 + op[2] % (len(tokens) - 1)
            context = tokens[max(0, cut - op[3]) : cut]
            found = index.lookup(context, 4, max_candidates=8)
            expected = brute_force_longest(index, context, index.max_ngram, index.min_ngram)
            assert (found[0].match_len if found else 0) == expected
            for candidate in found:  # each candidate really follows a match of that length
                if candidate.source.startswith("history:"):
                    source = index._history.buffers[candidate.source.split(":")[1]].tokens.tolist()
                else:
                    source = index.document_tokens(candidate.source)
                p, k = candidate.position, candidate.match_len
                assert source[p - k : p] == context[-k:]
                assert tuple(source[p : p + len(candidate.token_ids)]) == candidate.token_ids
        index.check_integrity()
    if background:
        for job in index._levels.deferred:
            job()
        index.check_integrity()
    for uri, text in model.items():
        assert index.document_text(uri) == text
        assert index.document_tokens(uri) == index.adapter.encode(text)
    index.close()
    if with_db:  # everything survives a restart
        with WorkspaceIndex(index_tokenizer, db_path=db, max_ngram=6) as reopened:
            for uri, text in model.items():
                assert reopened.document_text(uri) == text
            reopened.check_integrity()


def test_background_merges_with_a_real_thread(index_tokenizer, index_adapter):
    """Merges run on the worker thread while documents keep changing; the result is consistent."""
    index = WorkspaceIndex(index_tokenizer, overlay_tokens=0, hot_documents=1, background_tokens=0)
    model = {}
    for n in range(40):
        uri = f"mem://{n % 13}"
        text = f"name_{n} = function_{n % 5}(argument_{n})\n" * (1 + n % 3)
        index.add_document(uri, text, version=n)
        model[uri] = text
        if n % 4 == 0:
            edited = f"mem://{(n * 7) % 13}"
            if edited in model:
                index.update_document(edited, 0, 0, f"# {n}\n", version=100 + n)
                model[edited] = f"# {n}\n" + model[edited]
        index.lookup(index_adapter.encode(f"x = function_{n % 5}("), 4)
    index._levels.wait_idle()
    index.check_integrity()
    for uri, text in model.items():
        assert index.document_text(uri) == text
    found = index.lookup(index_adapter.encode("x = function_3("), 4, max_candidates=8)
    assert found and all(c.source in model for c in found)
