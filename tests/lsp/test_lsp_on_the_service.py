"""The LSP door on the engine service: index updates that fail are logged, a newer inline request
supersedes the older one (moved here from the service's tests: they drive ``lsp.server``)."""

from __future__ import annotations

import asyncio

from codespec.service.engine.service import EngineService

WAIT_S = 120
LONG_TEXT = "".join(f"def function_{i}(value):\n    return value + {i}\n\n" for i in range(10))


def test_a_failed_background_index_update_is_logged_not_lost(server_target, caplog):
    from codespec.index import WorkspaceIndex
    from codespec.lsp.server import CodespecServer

    server = CodespecServer()
    server.service = EngineService(server_target, proposer="context")
    try:
        server.service.attach_index(WorkspaceIndex(server_target.tokenizer, db_path=None))
        document = server.documents.open("file:///never-indexed.py", "a = 1\n", 1)
        document.indexed_text = "a = 0\n"  # the index is believed to hold it, but does not
        with caplog.at_level("ERROR", logger="codespec.lsp.server"):
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

    from codespec.lsp.server import CodespecServer, complete_at
    from codespec.service.requests.options import CompletionOptions, ServerOptions

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


async def test_a_next_edit_after_an_accept_is_drafted_from_its_speculation_and_is_the_same_answer():
    """The shipped model (it ends its rewrites): answer, accept, answer again. The second request
    finds the speculated answer ready and drafts from it; the answer is what a request without the
    speculation gets, and a speculation for other text is dropped."""
    from pathlib import Path

    from bench.next_edit_workload import load
    from codespec.core.default_model import target_path
    from codespec.core.model import TargetModel
    from codespec.lsp.server import CodespecServer
    from codespec.service.requests.next_edit import FINISHED
    from codespec.service.requests.positions import position_at

    server = CodespecServer()
    service = EngineService(TargetModel.load(str(target_path()), device="cpu"), proposer="auto")
    server.service = service
    try:
        cases = load(Path(__file__).resolve().parents[1] / "data" / "edits-httpx-sample.jsonl", 12)
        # The first case whose answer is speculated on to a finished rewrite: which case that is may
        # differ between machines (fp32 reductions follow the core count), so each is tried in turn.
        usable = None
        for number, case in enumerate(cases):
            uri = f"file:///speculate{number}.py"
            start = case.cursor - len(case.edit_after)
            before = case.document[:start] + case.edit_before + case.document[case.cursor :]
            document = server.documents.open(uri, before, 1)
            document.apply_change(None, None, case.document, 2)
            server.edit_history.record(uri, before, start, start + len(case.edit_before), case.edit_after, 2)
            cursor = position_at(case.document, case.cursor)
            raw = {"textDocument": {"uri": uri, "version": 2}, "position": cursor.__dict__}
            edits = await asyncio.wait_for(server.next_edits.answer(server, uri, raw), WAIT_S)
            if not edits:
                continue
            await asyncio.sleep(0)  # the speculation is submitted by a task
            for _ in range(200):
                speculation = server.next_edits.speculations.get(uri)
                if speculation is not None:
                    break
                await asyncio.sleep(0.05)
            assert speculation is not None, "an answer was given but nothing was speculated after it"
            ahead = await asyncio.wait_for(speculation.job.result(), WAIT_S)
            if ahead.reason in FINISHED and ahead.text:
                usable = (uri, document, edits, speculation)
                break
        assert usable is not None, "no case of 12 had an answer speculated on to a finished rewrite"
        uri, document, (edit,), speculation = usable

        # accept: one change, the cursor at the end of the applied text
        lines = document.line_index()
        first, last = lines.offset(**edit["range"]["start"]), lines.offset(**edit["range"]["end"])
        text = document.text
        document.apply_change(None, None, text[:first] + edit["text"] + text[last:], 3)
        server.edit_history.record(uri, text, first, last, edit["text"], 3)
        server.next_edits.changed(uri, document.text)
        assert server.next_edits.speculations.get(uri) is speculation  # the text it was made for
        end = position_at(document.text, first + len(edit["text"]))
        raw = {"textDocument": {"uri": uri, "version": 3}, "position": end.__dict__}
        drafted = await asyncio.wait_for(server.next_edits.answer(server, uri, raw), WAIT_S)
        assert uri not in server.next_edits.speculations or server.next_edits.speculations[uri] is not speculation
        used = service.snapshot()["last_requests"][-1]
        server.next_edits.clear()  # the same request again, with nothing speculated
        plain = await asyncio.wait_for(server.next_edits.answer(server, uri, raw), WAIT_S)
        assert drafted == plain
        assert used["accepted_prediction_tokens"] > 0  # drafted from the speculated answer

        # any other change drops a speculation
        server.next_edits.clear()
        await asyncio.sleep(0.2)
        if (pending := server.next_edits.speculations.get(uri)) is not None:
            server.next_edits.changed(uri, document.text + "# typed\n")
            assert uri not in server.next_edits.speculations and pending.job.job._cancel.is_set()
    finally:
        server.next_edits.clear()
        service.close()
