"""Memory budget: least recently used documents are evicted first and come back on demand."""

from __future__ import annotations

from index import WorkspaceIndex


def _body(n):
    return "".join(f"entry_{n}_{k} = lookup_table_{n}[{k}]\n" for k in range(20))


def test_lru_eviction_and_reload(tmp_path, index_tokenizer, index_adapter):
    per_doc = len(index_adapter.encode(_body(0)))
    budget = per_doc * 3 + per_doc // 2
    for db in (tmp_path / "index.db", None):
        index = WorkspaceIndex(index_tokenizer, db_path=db, memory_budget_tokens=budget, overlay_tokens=0)
        for n in range(3):
            index.add_document(f"mem://{n}", _body(n), version=10 + n)
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
