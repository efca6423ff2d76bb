"""Bad conditions around the index: concurrent opens, corrupted files, failed merges, odd files."""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import sqlite3

import numpy as np
import pytest

from codespec.index import WorkspaceIndex
from codespec.index.persist import SCHEMA_VERSION, IndexDB

ROUNDS = 30


def _open_each(barrier, paths, errors) -> None:
    """One of two processes: open each fresh database at the same moment as the other one."""
    from codespec.index.persist import IndexDB

    for path in paths:
        barrier.wait()
        try:
            db = IndexDB(path, "tokenizer", np.uint16)
            db.save_documents([(f"mem://{os.getpid()}", None, 1, "x = 1\n", np.arange(3, dtype=np.uint16))])
            db.close()
        except Exception as error:  # reported to the parent: any error is the failure under test
            errors.put(f"{path}: {type(error).__name__}: {error}")


def test_two_processes_create_the_same_new_database_at_once(tmp_path):
    """Two editor windows starting the server on one workspace: both opens succeed, one schema."""
    context = multiprocessing.get_context("spawn")
    paths = [str(tmp_path / f"index{n}.db") for n in range(ROUNDS)]
    barrier, errors = context.Barrier(2), context.Queue()
    workers = [context.Process(target=_open_each, args=(barrier, paths, errors)) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    assert [w.exitcode for w in workers] == [0, 0]
    assert failures == []
    for path in paths:
        conn = sqlite3.connect(path)
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
        assert conn.execute("SELECT count(*) FROM documents").fetchone() == (2,)  # both writers' rows
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        conn.close()


def _filled_db(path, index_tokenizer) -> None:
    with WorkspaceIndex(index_tokenizer, db_path=path) as index:
        for n in range(20):
            index.add_document(f"mem://{n}", "".join(f"value_{n}_{k} = compute({k})\n" for k in range(200)))
        index.add_history("accepted", "accepted_value = compute_accepted(42)\n")
        index.flush(wait=True)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def _truncate(path) -> None:
    with open(path, "r+b") as file:
        file.truncate(os.path.getsize(path) // 2)


def _overwrite_header(path) -> None:
    with open(path, "r+b") as file:
        file.write(b"\0" * 100)


def _garbage(path) -> None:
    path.write_bytes(b"definitely not an SQLite database\n" * 200)


@pytest.mark.parametrize("damage", [_truncate, _overwrite_header, _garbage])
def test_corrupted_database_is_moved_aside_and_rebuilt(tmp_path, index_tokenizer, index_adapter, caplog, damage):
    db = tmp_path / "index.db"
    _filled_db(db, index_tokenizer)
    original = db.read_bytes()
    damage(db)
    damaged = db.read_bytes()
    assert damaged != original
    with caplog.at_level(logging.ERROR, logger="codespec.index"):
        with WorkspaceIndex(index_tokenizer, db_path=db) as index:
            index.add_document("mem://new", "fresh_value = build_fresh(1)\n")
            assert index.lookup(index_adapter.encode("y = build_fresh("), 4)[0].source == "mem://new"
            index.check_integrity()
    aside = [
        p
        for p in tmp_path.iterdir()
        if p.name.startswith("index.db.corrupt-") and not p.name.endswith(("-wal", "-shm"))
    ]
    assert len(aside) == 1 and aside[0].read_bytes() == damaged  # kept as it was, for inspection
    assert any(str(aside[0]) in record.getMessage() for record in caplog.records)
    with WorkspaceIndex(index_tokenizer, db_path=db) as index:  # the rebuilt file persists as usual
        assert index.document_text("mem://new") == "fresh_value = build_fresh(1)\n"


def test_other_schema_version_is_an_error_and_left_in_place(tmp_path):
    db = tmp_path / "index.db"
    IndexDB(db, "tokenizer", np.uint16).close()
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE schema_version SET version = ?", [SCHEMA_VERSION + 1])
    conn.close()
    with pytest.raises(RuntimeError, match="schema"):
        IndexDB(db, "tokenizer", np.uint16)
    assert sorted(p.name for p in tmp_path.iterdir() if "corrupt" in p.name) == []


def test_unopenable_path_is_a_clear_error(tmp_path):
    with pytest.raises(sqlite3.OperationalError, match="missing-dir"):
        IndexDB(tmp_path / "missing-dir" / "index.db", "tokenizer", np.uint16)
    assert not (tmp_path / "missing-dir").exists()


def _text(n: int) -> str:
    return "".join(f"value_{n}_{k} = compute_{n}(argument_{k})\n" for k in range(20))


def _fail_once(index, monkeypatch, when=lambda: True):
    """Make the level set's next build (where ``when()`` holds) raise; return the call log."""
    real_build = index._levels.build
    calls = []

    def build(*args, **kwargs):
        failing = when() and not any(failed for _, failed in calls)
        calls.append((__import__("threading").current_thread().name, failing))
        if failing:
            raise MemoryError("injected: no memory for the sort")
        return real_build(*args, **kwargs)

    monkeypatch.setattr(index._levels, "build", build)
    return calls


def _all_found(index, index_adapter, ns) -> None:
    for n in ns:
        found = index.lookup(index_adapter.encode(f"x = compute_{n}("), 4, max_candidates=8)
        assert found and found[0].source == f"mem://{n}", n


def test_failed_background_merge_keeps_levels_reports_and_retries(index_tokenizer, index_adapter, monkeypatch, caplog):
    import threading

    index = WorkspaceIndex(index_tokenizer, overlay_tokens=0, hot_documents=1, background_tokens=0)
    index.add_document("mem://0", _text(0))
    index.add_document("mem://1", _text(1))  # mem://0 becomes a level (built here: one level, no merge)
    assert len(index._levels.levels) == 1
    calls = _fail_once(index, monkeypatch, when=lambda: threading.current_thread().name == "codespec-index-merge")
    with caplog.at_level(logging.ERROR, logger="codespec.index"):
        index.add_document("mem://2", _text(2))  # mem://1 becomes a level; merging the two runs on the worker
        index._levels.wait_idle()
    assert ("codespec-index-merge", True) in calls
    assert len(index._levels.levels) == 2  # the merge did not happen; both old levels still answer
    health = index.health()  # what the server's codespec/stats reports
    assert health["last_error"]["failures"] == 1 and health["database_moved_aside"] == []
    assert "merge of 2 levels" in health["last_error"]["what"] and "injected" in health["last_error"]["error"]
    logged = [r for r in caplog.records if "merge of 2 levels" in r.getMessage()]
    assert logged and logged[0].exc_info is not None  # logged with its traceback, not printed to stderr
    index.check_integrity()
    _all_found(index, index_adapter, range(3))

    index.update_document("mem://2", 0, 0, "# edited\n", version=2)  # the next maintenance retries the merge
    index._levels.wait_idle()
    assert [name for name, failed in calls if not failed][-1] == "codespec-index-merge"
    assert len(index._levels.levels) == 1 and index._levels.health()["last_error"] is None
    index.check_integrity()
    _all_found(index, index_adapter, range(3))
    index.close()


def test_failed_merge_in_the_editing_thread_does_not_fail_the_edit(index_tokenizer, index_adapter, monkeypatch):
    index = WorkspaceIndex(index_tokenizer, overlay_tokens=0, hot_documents=1)
    index.add_document("mem://0", _text(0))
    index.add_document("mem://1", _text(1))
    calls = _fail_once(index, monkeypatch)
    index.add_document("mem://2", _text(2))  # new level for mem://1 fails: it stays in the overlay
    assert calls == [("MainThread", True)]
    assert index._levels.health()["last_error"]["what"] == "new level of 1 documents"
    assert set(index._levels.overlay) == {"mem://1", "mem://2"}
    index.check_integrity()
    _all_found(index, index_adapter, range(3))
    index.add_document("mem://3", _text(3))  # retried: levels built and merged, nothing lost
    assert index._levels.health()["last_error"] is None and len(index._levels.levels) == 1
    assert set(index._levels.overlay) == {"mem://3"}
    index.check_integrity()
    _all_found(index, index_adapter, range(4))

    index.remove_document("mem://0")
    index.remove_document("mem://1")  # the level is now less than half alive
    calls = _fail_once(index, monkeypatch)
    index.update_document("mem://3", 0, 0, "# a\n", version=2)  # its rebuild fails; the edit does not
    assert calls == [("MainThread", True)]
    assert index._levels.health()["last_error"]["what"].startswith("rebuild of a level")
    assert index.document_text("mem://3").startswith("# a\n")
    index.check_integrity()
    _all_found(index, index_adapter, [2, 3])
    index.update_document("mem://3", 0, 0, "# b\n", version=3)
    assert index._levels.health()["last_error"] is None
    assert index._levels.health()["level_live_tokens"] == [len(index.document_tokens("mem://2"))]
    index.check_integrity()
    _all_found(index, index_adapter, [2, 3])


def _damage_pages(path, first_page=2, pages=6) -> None:
    """Overwrite b-tree pages after the schema (the file still opens; reads of those pages fail)."""
    rng = np.random.default_rng(0)
    with open(path, "r+b") as file:
        file.seek(4096 * first_page)
        file.write(rng.integers(0, 256, 4096 * pages, dtype=np.uint8).tobytes())


def test_damage_found_by_a_read_after_opening_is_moved_aside(tmp_path, index_tokenizer, index_adapter, caplog):
    db = tmp_path / "index.db"
    _filled_db(db, index_tokenizer)
    _damage_pages(db)
    IndexDB(db, index_adapter.fingerprint, index_adapter.dtype).close()  # opening alone does not notice
    assert not [p for p in tmp_path.iterdir() if "corrupt" in p.name]
    with caplog.at_level(logging.ERROR, logger="codespec.index"):
        with WorkspaceIndex(index_tokenizer, db_path=db) as index:  # reads stats and history: damaged pages
            assert index.db.moved_aside
            index.add_document("mem://new", "fresh_value = build_fresh(1)\n")
            index.check_integrity()
    assert any("moved it to" in record.getMessage() for record in caplog.records)
    with WorkspaceIndex(index_tokenizer, db_path=db) as index:
        assert index.document_text("mem://new") == "fresh_value = build_fresh(1)\n"
        index.check_integrity()


def test_damage_found_by_a_write_keeps_that_write(tmp_path, index_tokenizer, index_adapter):
    from codespec.index.writebehind import WriteBehindDB

    db_path = tmp_path / "index.db"
    _filled_db(db_path, index_tokenizer)
    db = WriteBehindDB(db_path, index_adapter.fingerprint, index_adapter.dtype)
    assert len(db.document_hashes()) == 20
    _damage_pages(db_path)  # under the open connections, which have not cached those pages
    tokens = index_adapter.encode_array("late = 1\n")
    for n in range(40):  # writes that need the damaged pages
        db.save_documents([(f"mem://late{n}", None, 1, "late = 1\n", tokens)])
    db._jobs.join()
    assert db._corrupt is not None  # the writer met the damage (no read has run since)
    db.wait()  # new file, held writes applied, nothing raised
    assert db.moved_aside
    assert {f"mem://late{n}" for n in range(40)} <= set(db.document_hashes())
    db.check()
    db.close()


def test_files_that_vanish_or_change_kind_during_a_scan_are_skipped(tmp_path):
    from codespec.index.discovery import Found, discover

    root = tmp_path / "ws"
    (root / "sub").mkdir(parents=True)
    for name in ("a.py", "b.py", "c.py", "sub/d.py"):
        (root / name).write_text(f"name = {name!r}\n")
    seen = []
    for item in discover([root]):  # the directory is listed before its files are read
        seen.append(item)
        if isinstance(item, Found) and item.path.name == "a.py":
            (root / "b.py").unlink()  # an editor saving by rename, at the wrong moment
            (root / "c.py").unlink()
            os.mkfifo(root / "c.py")  # reading this would block forever
            shutil.rmtree(root / "sub")
    outcome = {item.path.name: (type(item).__name__, getattr(item, "reason", "")) for item in seen}
    assert outcome["a.py"] == ("Found", "")
    assert outcome["b.py"][0] == "Skipped" and outcome["b.py"][1].startswith("unreadable")
    assert outcome["c.py"] == ("Skipped", "not a regular file")
    assert outcome["sub"][0] == "Skipped" and "d.py" not in outcome


def test_odd_file_names_and_special_files(tmp_path, index_tokenizer, index_adapter):
    root = tmp_path / "ws"
    root.mkdir()
    raw_root = os.fsencode(root)
    with open(os.path.join(raw_root, b"caf\xe9_latin1_name.py"), "wb") as file:  # not UTF-8: a surrogate in str
        file.write(b"def latin_named(argument):\n    return argument + 1\n")
    os.mkdir(os.path.join(raw_root, b"dir\xff"))
    with open(os.path.join(raw_root, b"dir\xff", b"inner.py"), "wb") as file:
        file.write(b"inner_value = compute_inner(1)\n")
    (root / "caf\u00e9.py").write_text("utf8_named = compute_utf8(2)\n")
    os.mkfifo(root / "pipe.py")  # never opened
    db = tmp_path / "index.db"
    with WorkspaceIndex(index_tokenizer, db_path=db) as index:
        report = index.index_workspace([root])
        assert (report.files, report.tokenized, report.skipped) == (3, 3, [])
        for uri in index.documents():
            assert uri.isascii()  # percent-encoded bytes
        found = index.lookup(index_adapter.encode("x = compute_inner("), 4)
        assert found and found[0].source.endswith("/dir%FF/inner.py")
        index.check_integrity()
    with WorkspaceIndex(index_tokenizer, db_path=db) as index:
        report = index.index_workspace([root])
        assert (report.files, report.tokenized, report.reused, report.removed) == (3, 0, 3, 0)
        latin = (root / os.fsdecode(b"caf\xe9_latin1_name.py")).as_uri()
        assert index.document_text(latin).startswith("def latin_named(")
        index.check_integrity()


def _answers(index, index_adapter):
    return [(c.token_ids, c.source, c.position) for c in index.lookup(index_adapter.encode("y = function_3_7("), 8)]


def test_stored_values_that_cannot_be_right_are_rebuilt_not_trusted(tmp_path, index_tokenizer, index_adapter, caplog):
    """Rows SQLite accepts but this code never writes (damage its checks miss, another tool):
    each is ignored with a log line and rebuilt from the workspace; nothing crashes."""
    root = tmp_path / "ws"
    root.mkdir()
    for n in range(6):
        (root / f"module_{n}.py").write_text(
            "".join(f"def function_{n}_{k}(x):\n    return x * {k}\n\n" for k in range(20))
        )
    db = tmp_path / "index.db"
    with WorkspaceIndex(index_tokenizer, db_path=db) as index:
        index.index_workspace([root])
        index.add_history("accepted", "accepted_value = compute_accepted(42)\n")
        before = _answers(index, index_adapter)
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE documents SET tokens = substr(tokens, 2) WHERE uri LIKE '%module_1.py'")
        conn.execute("UPDATE tables SET positions = zeroblob(length(positions) - 1)")
        conn.execute("UPDATE history SET tokens = x'0102ff'")
    conn.close()
    with WorkspaceIndex(index_tokenizer, db_path=db) as index:
        report = index.index_workspace([root])
        assert (report.files, report.tokenized, report.reused) == (6, 1, 5)
        assert _answers(index, index_adapter) == before
        assert index.lookup(index_adapter.encode("x = compute_accepted("), 4)[0].source == "history:accepted"
        index.check_integrity()
    conn = sqlite3.connect(db)
    with conn:  # a table whose bounds are wrong: sorted again
        conn.execute("UPDATE tables SET positions = CAST(? AS BLOB)", [np.full(4000, 10**9, np.int32).tobytes()])
    conn.close()
    with WorkspaceIndex(index_tokenizer, db_path=db) as index, caplog.at_level(logging.WARNING, "codespec.index"):
        report = index.index_workspace([root])
        assert (report.tokenized, report.reused) == (0, 6)
        assert any("sorting again" in record.getMessage() for record in caplog.records)
        assert _answers(index, index_adapter) == before
        index.check_integrity()


def test_stored_document_with_a_wrong_hash_is_not_reloaded(tmp_path, index_tokenizer):
    db = tmp_path / "index.db"
    with WorkspaceIndex(index_tokenizer, db_path=db) as index:
        index.add_document("mem://a", "alpha = 1\n")
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE documents SET text = 'tampered = 2\n'")
    conn.close()
    with WorkspaceIndex(index_tokenizer, db_path=db) as index:
        with pytest.raises(KeyError):
            index.document_text("mem://a")


def test_history_bound_too_small_is_refused(index_tokenizer, index_adapter):
    from codespec.index.history import HistoryBuffer, HistoryEntry

    with pytest.raises(ValueError, match="history_tokens"):
        WorkspaceIndex(index_tokenizer, history_tokens=1)
    buffer = HistoryBuffer("accepted", index_adapter.dtype, index_adapter.sep, max_tokens=2)
    for n in range(3):
        buffer.append(index_adapter.encode_array(f"value_{n} = {n}\n"), HistoryEntry(None, 0.0, n))
        assert len(buffer.tokens) <= 2
        buffer.check()
