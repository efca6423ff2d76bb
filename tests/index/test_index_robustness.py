"""Bad conditions around the index: concurrent opens, corrupted files, failed merges, odd files."""

from __future__ import annotations

import logging
import multiprocessing
import os
import sqlite3

import numpy as np
import pytest

from index import WorkspaceIndex
from index.persist import SCHEMA_VERSION, IndexDB

ROUNDS = 30


def _open_each(barrier, paths, errors) -> None:
    """One of two processes: open each fresh database at the same moment as the other one."""
    from index.persist import IndexDB

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
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("index.db.corrupt-") and not p.name.endswith(
        ("-wal", "-shm"))]
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
    with pytest.raises(sqlite3.OperationalError):
        IndexDB(tmp_path / "missing-dir" / "index.db", "tokenizer", np.uint16)
    assert not (tmp_path / "missing-dir").exists()
