"""Persistence: round trip, restart without re-tokenizing, a killed writer, integrity checks."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from codespec.index import WorkspaceIndex
from codespec.index import ngram as ngram_module


def _workspace(root, files=6):
    root.mkdir(parents=True, exist_ok=True)
    for n in range(files):
        body = "".join(f"def function_{n}_{k}(argument):\n    return argument * {k} + {n}\n\n" for k in range(30))
        (root / f"module_{n}.py").write_text(body)
    return root


def test_round_trip(tmp_path, index_tokenizer, index_adapter):
    db = tmp_path / "index.db"
    started = time.time()
    with WorkspaceIndex(index_tokenizer, db_path=db) as index:
        index.add_document("mem://a", "first = make_thing(alpha)\n", version=3)
        index.update_document("mem://a", 0, 5, "second", version=4)
        index.add_history("accepted", "accepted_value = compute_accepted(42)\n", uri="mem://a")
        index.add_history("generated", "generated_value = 7\n")
        index.record_outcome("mem://a", drafted=10, accepted=7)
        index.record_outcome("history:accepted", drafted=4, accepted=4)
        expected_tokens = index.document_tokens("mem://a")
        history = index.history_entries()
        assert [(h.kind, h.uri) for h in history] == [
            ("replaced", "mem://a"),
            ("accepted", "mem://a"),
            ("generated", None),
        ]
        assert history[0].token_ids == tuple(index_adapter.encode("first"))
        assert history[1].token_ids == tuple(index_adapter.encode("accepted_value = compute_accepted(42)\n"))
        assert started <= history[0].time <= history[1].time <= history[2].time <= time.time()
        assert index.history_entries("accepted") == [history[1]] and index.history_entries("unknown") == []
    with WorkspaceIndex(index_tokenizer, db_path=db) as index:
        assert index.history_entries() == history  # kind, document, time and tokens survive a restart
        assert index.document_text("mem://a") == "second = make_thing(alpha)\n"
        assert index.document_tokens("mem://a") == expected_tokens
        assert index.document_version("mem://a") == 4
        assert index.source_stats("mem://a") == (10, 7)
        assert index.source_stats("history:accepted") == (4, 4)
        found = index.lookup(index_adapter.encode("x = compute_accepted("), 4)
        assert found[0].source == "history:accepted"
        found = index.lookup(index_adapter.encode("y = make_thing("), 4)
        assert found[0].source == "mem://a"
        index.check_integrity()


def test_document_versions_survive_a_restart(tmp_path, index_tokenizer):
    """A new version with unchanged text (an editor re-opening or saving a file) is stored too."""
    db = tmp_path / "index.db"
    with WorkspaceIndex(index_tokenizer, db_path=db) as index:
        index.add_document("mem://same", "x = 1\n", version=1)
        index.add_document("mem://same", "x = 1\n", version=5)
        index.add_document("mem://edited", "alpha = beta(gamma)\n", version=1)
        index.update_document("mem://edited", 0, 5, "delta", version=2)
        index.add_document("mem://edited", "delta = beta(gamma)\n", version=3)  # unsaved edit, then same text
        index.add_documents({"mem://bulk": "y = 2\n"}, version=7)
        index.add_document("mem://bulk", "y = 2\n", version=8)
        assert [index.document_version(u) for u in ("mem://same", "mem://edited", "mem://bulk")] == [5, 3, 8]
    with WorkspaceIndex(index_tokenizer, db_path=db) as index:
        assert [index.document_version(u) for u in ("mem://same", "mem://edited", "mem://bulk")] == [5, 3, 8]
        assert index.document_text("mem://edited") == "delta = beta(gamma)\n"
        index.update_document("mem://edited", 0, 0, "# note\n", version=4)
    with WorkspaceIndex(index_tokenizer, db_path=db) as index:
        assert index.document_version("mem://edited") == 4
        with pytest.raises(KeyError):
            index.document_version("mem://missing")
        index.check_integrity()


def test_clear_history_forgets_it_across_restarts(tmp_path, index_tokenizer, index_adapter):
    db = tmp_path / "index.db"
    context = index_adapter.encode("x = compute_accepted(")
    with WorkspaceIndex(index_tokenizer, db_path=db) as index:
        index.add_document("mem://a", "first = make_thing(alpha)\n")
        index.add_history("accepted", "accepted_value = compute_accepted(42)\n", uri="mem://a")
        assert index.lookup(context, 4)[0].source == "history:accepted"
        index.clear_history()
        assert index.lookup(context, 4) == []
    with WorkspaceIndex(index_tokenizer, db_path=db) as index:
        assert index.lookup(context, 4) == []
        assert index.document_text("mem://a") == "first = make_thing(alpha)\n"
        index.check_integrity()


def test_restart_reuses_tokens_and_tables(tmp_path, index_tokenizer, monkeypatch):
    root = _workspace(tmp_path / "ws")
    db = tmp_path / "index.db"
    with WorkspaceIndex(index_tokenizer, db_path=db) as index:
        report = index.index_workspace([root])
        assert (report.files, report.tokenized, report.reused) == (6, 6, 0)
        before = index.lookup(index.document_tokens((root / "module_2.py").as_uri())[:20], 8)

    def refuse(*args, **kwargs):
        raise AssertionError("an unchanged workspace must not be re-tokenized or re-sorted")

    with WorkspaceIndex(index_tokenizer, db_path=db) as index:
        monkeypatch.setattr(index.adapter, "encode_batch", refuse)
        monkeypatch.setattr(index.adapter, "encode_array", refuse)
        monkeypatch.setattr(ngram_module, "sort_positions", refuse)
        report = index.index_workspace([root])
        assert (report.files, report.tokenized, report.reused) == (6, 0, 6)
        assert index.lookup(index.document_tokens((root / "module_2.py").as_uri())[:20], 8) == before
        monkeypatch.undo()
        index.check_integrity()
    (root / "module_1.py").write_text("changed_body = 1\n")
    (root / "module_5.py").unlink()
    with WorkspaceIndex(index_tokenizer, db_path=db) as index:
        report = index.index_workspace([root])
        assert (report.files, report.tokenized, report.reused, report.removed) == (5, 1, 4, 1)
        assert index.document_text((root / "module_1.py").as_uri()) == "changed_body = 1\n"
        with pytest.raises(KeyError):
            index.document_text((root / "module_5.py").as_uri())
        index.check_integrity()


GROUP = 8  # documents saved together in each grouped save of the killed writer
KILL_ROUNDS = 3

WRITER = textwrap.dedent("""
    import sys
    from transformers import PreTrainedTokenizerFast
    from codespec.index import WorkspaceIndex
    from codespec.index.persist import content_hash
    tokenizer = PreTrainedTokenizerFast.from_pretrained(sys.argv[1])
    index = WorkspaceIndex(tokenizer, db_path=sys.argv[2], flush_seconds=0.0)
    n, group_size = int(sys.argv[3]), int(sys.argv[4])
    texts = {f"mem://group{k}": "".join(f"line_{k}_{j} = value_{j} + {k}\\n" for j in range(1500))
             for k in range(group_size)}
    index.add_documents(texts, version=n)
    group = [(uri, content_hash(text), text, index.adapter.encode_array(text)) for uri, text in texts.items()]
    index.add_document("mem://edited", "".join(f"line_{k} = value_{k} + {k}\\n" for k in range(100)), version=n)
    index.flush(wait=True)  # everything committed once before the parent may kill us
    print(n, flush=True)
    while True:
        n += 1
        # one grouped save: the whole group at revision n (same texts, so the tokens above stay right)
        index.db.save_documents([(uri, digest, n, text, tokens) for uri, digest, text, tokens in group])
        index.update_document("mem://edited", 0, 6, f"edit{n}_", version=n)
        index.add_history("generated", f"generated_output_{n} = {n}\\n", uri="mem://edited")
        index.record_outcome("mem://edited", drafted=3, accepted=2)
        index.flush(wait=True)
        print(n, flush=True)
""")


def _run_and_kill(script, tokenizer_dir, db, first_revision, rng):
    """Start the writer, let it commit a few rounds, SIGKILL it at a random moment."""
    env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
    writer = subprocess.Popen(
        [sys.executable, str(script), str(tokenizer_dir), str(db), str(first_revision), str(GROUP)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 120
        for line in writer.stdout:
            if int(line) >= first_revision + 10 or time.monotonic() > deadline:
                break
        time.sleep(rng.uniform(0.0, 0.03))  # anywhere inside the next writes
        writer.send_signal(signal.SIGKILL)
    finally:
        writer.kill()
        writer.wait()
    assert writer.returncode == -signal.SIGKILL


@pytest.mark.slow
def test_killed_writer_leaves_a_consistent_database(tmp_path, index_tokenizer):
    """A writer SIGKILLed at random moments (several times, one database) leaves a file that opens,
    passes the integrity checks, and holds each grouped save whole or not at all: the documents of
    one save call share one revision. Per-row commits would fail this (each row alone is atomic
    anyway, so per-row checks cannot tell)."""
    tokenizer_dir = tmp_path / "tokenizer"
    index_tokenizer.save_pretrained(tokenizer_dir)
    db = tmp_path / "index.db"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    rng = random.Random()
    group = [f"mem://group{k}" for k in range(GROUP)]
    for round_number in range(KILL_ROUNDS):
        first_revision = round_number * 1_000_000
        _run_and_kill(script, tokenizer_dir, db, first_revision, rng)
        with WorkspaceIndex(index_tokenizer, db_path=db) as index:
            index.check_integrity()  # includes sqlite's integrity_check and hash/blob checks
            revisions = [index.document_version(uri) for uri in group]
            assert len(set(revisions)) == 1, f"round {round_number}: a grouped save was split: {revisions}"
            assert revisions[0] >= first_revision + 10
            for uri in group + ["mem://edited"]:
                assert index.document_tokens(uri) == index.adapter.encode(index.document_text(uri))
            edited_version = index.document_version("mem://edited")
            assert index.document_text("mem://edited").startswith(f"edit{edited_version}_")
            drafted, accepted = index.source_stats("mem://edited")
            assert drafted % 3 == 0 and accepted == drafted // 3 * 2
            index.check_integrity()


def test_integrity_check_detects_disagreement(index_tokenizer):
    index = WorkspaceIndex(index_tokenizer, overlay_tokens=0)
    for n in range(8):
        index.add_document(f"mem://{n}", f"name_{n} = function_{n}(argument_{n})\n" * 3)
    index.check_integrity()
    doc = index._docs["mem://0"]
    level = doc.level
    assert level is not None
    saved = level.table.order.copy()
    level.table.order[:] = level.table.order[::-1]  # unsorted positions
    with pytest.raises(AssertionError, match="sorted"):
        index.check_integrity(deep=False)
    level.table.order[:] = saved
    index.check_integrity()
    doc.tokens[0] = (int(doc.tokens[0]) + 1) % 500  # the level and a fresh encode now disagree
    with pytest.raises(AssertionError):
        index.check_integrity()


def test_table_from_persisted_parts_matches_scan():
    """The trie + sorted positions answer exactly what a brute-force scan answers, through every
    path: trie only, binary search in large groups, filtering in small ones."""
    rng = np.random.default_rng(7)
    for dtype, sep in ((np.dtype(np.uint16), 65535), (np.dtype(np.int32), 2**31 - 1)):
        for trial in range(80):
            if trial % 4 == 0:  # long, low-entropy documents: first-word groups over 256 entries
                arrays = [rng.integers(0, 2, rng.integers(2000, 6000)).astype(dtype) for _ in range(2)]
            else:
                arrays = [rng.integers(0, 4, rng.integers(0, 30)).astype(dtype) for _ in range(rng.integers(1, 5))]
            depth = int(rng.integers(1, 4))
            table = ngram_module.NgramTable(arrays, dtype, sep, 6, 2, trie_depth=depth)
            again = ngram_module.NgramTable(
                arrays, dtype, sep, 6, 2, trie_depth=depth, order=table.order, groups=table.groups()
            )
            reversed_context = rng.integers(0, 4 if trial % 4 else 2, rng.integers(0, 9)).tolist()[::-1]
            for candidate in (table, again):
                found = candidate.matches(reversed_context)
                scanned = ngram_module.scan_longest(candidate.tokens, reversed_context, 6, 2, sep=sep)
                if not found:
                    assert scanned.length == 0
                    continue
                assert [k for k, _ in found] == list(range(found[0][0], 1, -1))
                length, positions = found[0]
                assert length == scanned.length
                assert sorted(positions.tolist()) == sorted(scanned.positions.tolist())
                for k, positions in found[1:]:  # every shorter match length too
                    shorter = ngram_module.scan_longest(candidate.tokens, reversed_context[:k], k, 2, sep=sep)
                    assert sorted(positions.tolist()) == sorted(shorter.positions.tolist())


def test_failed_background_write_is_reported(tmp_path, index_adapter):
    from codespec.index.writebehind import WriteBehindDB

    db = WriteBehindDB(tmp_path / "index.db", index_adapter.fingerprint, index_adapter.dtype)
    db.save_documents([("mem://a", None, 1, "a = 1\n", index_adapter.encode_array("a = 1\n"))])
    assert db.document("mem://a").text == "a = 1\n"
    db._submit("no_such_write")
    with pytest.raises(RuntimeError, match="database write failed"):
        db.wait()
    assert db.document_hashes().keys() == {"mem://a"}  # the error is reported once; the database works
    db.close()
