"""Memory budget: least recently used documents are evicted first and come back on demand."""

from __future__ import annotations

from codespec.index import WorkspaceIndex


def _body(n):
    return "".join(f"entry_{n}_{k} = lookup_table_{n}[{k}]\n" for k in range(20))


def test_lru_eviction_and_reload(tmp_path, index_tokenizer, index_adapter):
    per_doc = len(index_adapter.encode(_body(0)))
    budget = per_doc * 3 + per_doc // 2
    for db in (tmp_path / "index.db", None):
        index = WorkspaceIndex(index_tokenizer, db_path=db, memory_budget_tokens=budget, overlay_tokens=0)
        for n in range(3):
            index.add_document(f"mem://{n}", _body(n), version=10 + n)
            index.close_document(f"mem://{n}")  # closed in the editor: may be evicted
        index.document_text("mem://0")  # used: now the most recent
        index.add_document("mem://3", _body(3))
        assert sorted(index.documents()) == ["mem://0", "mem://2", "mem://3"]  # mem://1 was least recent
        assert all(c.source != "mem://1" for c in index.lookup(index_adapter.encode("x = lookup_table_1["), 4))
        index.check_integrity()
        assert index.document_text("mem://1") == _body(1)  # reloaded (from the database, or kept text)
        assert index.document_version("mem://1") == 11  # with its version
        assert "mem://1" in index.documents() and len(index.documents()) == 3
        found = index.lookup(index_adapter.encode("x = lookup_table_1["), 4)
        assert found and found[0].source == "mem://1"
        index.check_integrity()
        index.close()


def test_open_buffers_are_never_evicted_and_a_scan_keeps_them(tmp_path, index_tokenizer, index_adapter):
    """An open editor buffer is pinned: evicted and reloaded it would no longer be known as a
    buffer, and a rescan would install the file on disk in its place (the editor's next change,
    in buffer coordinates, would then land in the wrong text). Closed, it may go."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.py").write_text("def on_disk():\n    return 1\n")
    for n in range(6):
        (root / f"f{n}.py").write_text(_body(n))
    uri = (root / "a.py").as_uri()
    budget = len(index_adapter.encode(_body(0))) * 2
    index = WorkspaceIndex(index_tokenizer, db_path=tmp_path / "index.db", memory_budget_tokens=budget)
    buffer = "def in_editor_buffer(alpha, beta):\n    return alpha + beta\n"  # unsaved editor text
    index.add_document(uri, buffer, 7)  # didOpen
    for _ in range(2):  # the first scan, then a reindex
        index.index_workspace([root])
        assert uri in index.documents()
        assert index.document_text(uri) == buffer and index.document_version(uri) == 7
        index.check_integrity()
    index.update_document(uri, len(buffer), len(buffer), "# more\n", 8)  # didChange, buffer coordinates
    assert index.document_text(uri) == buffer + "# more\n"
    index.close_document(uri)  # didClose: now an ordinary document, evicted when least recently used
    for n in range(6):
        index.document_text((root / f"f{n}.py").as_uri())
    assert uri not in index.documents()
    index.check_integrity()
    index.close()


def test_reading_every_text_uses_none_of_them(index_tokenizer, index_adapter):
    """A search over the workspace (next edits in other files) must not decide what is evicted next."""
    per_doc = len(index_adapter.encode(_body(0)))
    index = WorkspaceIndex(index_tokenizer, memory_budget_tokens=per_doc * 3 + per_doc // 2, overlay_tokens=0)
    for n in range(3):
        index.add_document(f"mem://{n}", _body(n))
        index.close_document(f"mem://{n}")
    index.document_text("mem://0")  # used: the most recent
    assert index.texts() == [("mem://0", _body(0)), ("mem://2", _body(2)), ("mem://1", _body(1))]
    index.add_document("mem://3", _body(3))
    assert sorted(index.documents()) == ["mem://0", "mem://2", "mem://3"]  # mem://1 still went first
    index.close()
