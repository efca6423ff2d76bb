"""The LSP door on the engine service: index updates that fail are logged, a newer inline request
supersedes the older one (moved here from the service's tests: they drive ``lsp.server``)."""

from __future__ import annotations

import asyncio

from service.engine import EngineService

WAIT_S = 120
LONG_TEXT = "".join(f"def function_{i}(value):\n    return value + {i}\n\n" for i in range(10))


def test_a_failed_background_index_update_is_logged_not_lost(server_target, caplog):
    from index import WorkspaceIndex
    from lsp.server import CodespecServer

    server = CodespecServer()
    server.service = EngineService(server_target, proposer="context")
    try:
        server.service.attach_index(WorkspaceIndex(server_target.tokenizer, db_path=None))
        document = server.documents.open("file:///never-indexed.py", "a = 1\n", 1)
        document.indexed_text = "a = 0\n"  # the index is believed to hold it, but does not
        with caplog.at_level("ERROR", logger="lsp.server"):
            server.sync_index(document.uri)
            # Index updates are idle calls, which run in order: after this one the update is done.
            server.service.call(lambda: None, idle=True).result(WAIT_S)
        assert any(
            "index update of file:///never-indexed.py failed" in record.getMessage() for record in caplog.records
        )
    finally:
        server.service.close()


async def test_newer_inline_request_supersedes_the_older_one(server_target):
    from lsprotocol import types

    from lsp.server import CodespecServer, complete_at
    from service.options import CompletionOptions, ServerOptions

    server = CodespecServer(ServerOptions())
    server.options = ServerOptions(completion=CompletionOptions(mode="block", block_tokens=600, deadline_ms=600_000))
    service = EngineService(server_target, proposer="auto", max_draft=8)
    server.service = service
    try:
        uri = "file:///supersede.py"
        server.documents.open(uri, LONG_TEXT + "\n", 1)
        position = types.Position(LONG_TEXT.count("\n"), 0)
        cancelled_before = service.snapshot()["finish_reasons"].get("cancelled", 0)
        # Tasks start in creation order: the older one submits its job and waits before the newer starts.
        older = asyncio.ensure_future(complete_at(server, uri, position, invoked=False))
        newer = asyncio.ensure_future(complete_at(server, uri, position, invoked=False))
        assert await asyncio.wait_for(older, WAIT_S) is None  # superseded: no item
        await asyncio.wait_for(newer, WAIT_S)
        assert service.snapshot()["finish_reasons"]["cancelled"] == cancelled_before + 1  # the older job stopped
    finally:
        service.close()
