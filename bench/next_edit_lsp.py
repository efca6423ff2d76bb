"""Next-edit latency through a real LSP client (a benchmark, not a test; docs/next-edit.md).

    python -P bench/next_edit_lsp.py [--model DIR] [--cases N] [--out FILE.json]

Starts `codespec serve` over stdio (the shipped model unless ``--model``), and for each case of
the next-edit workload (bench/next_edit_workload.py): opens the file as it was before the user's
edit, sends the edit as one ``didChange`` (the state after the edit pause; the editor's debounce
is the client's), and at once asks ``textDocument/copilotInlineEdit`` at the cursor. Reports the
client-observed time from the ``didChange`` to the answer (p50/p95, ms), the engine's own time and
first-token time, and how often an edit came back; then, after ``--think-ms``, accepts the edit (one ``didChange``, the
cursor at its end, as the editors do) and asks again: **after accept** is that second answer's
time, which the server's speculation (lsp/next_edits.py) has prepared. The first ``--warm-up``
cases are not counted.

``--cross-file``: the cross-file cases (the user's edit in one file, the next site in another,
``cross_file_cases``). Every case's other file is written to the workspace, which the server
indexes at start; per case the edited lines are opened as a document of their own, the edit is
sent, and the next edit is asked with ``otherDocuments: true``. Reported: the time to that answer,
whether it names the case's own file (or a copy of it: cases share files; the others' files
compete, as a workspace's do), and the
time of the request the client makes once it has opened the file the answer names (``didOpen``,
then the request at the edit's start), which finds the answer ready.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared" / "workloads"


async def bench(args) -> dict:
    from lsprotocol import types
    from pygls.lsp.client import LanguageClient

    from bench.next_edit_workload import load
    from codespec.service.requests.positions import position_at

    cases = load(SHARED / "edits-httpx.jsonl", args.cases + args.warm_up)
    root = Path(tempfile.mkdtemp(prefix="codespec-next-edit-"))
    client = LanguageClient("codespec-bench", "1")
    await client.start_io(sys.executable, "-m", "codespec.commands.cli", "serve")
    options: dict = {"device": "cpu", "index": {"enabled": False}, "limits": {"deadlineMs": 60_000}}
    if args.model:
        options["model"] = args.model
    if args.no_speculate:
        options["nextEditSpeculate"] = False
    await client.initialize_async(
        types.InitializeParams(
            capabilities=types.ClientCapabilities(),
            root_uri=root.as_uri(),
            initialization_options=options,
        )
    )
    client.initialized(types.InitializedParams())
    rows = []
    for number, case in enumerate(cases):
        uri = (root / f"case{number}.py").as_uri()
        edit_start = case.cursor - len(case.edit_after)
        original = case.document[:edit_start] + case.edit_before + case.document[case.cursor :]
        client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                types.TextDocumentItem(uri=uri, language_id="python", version=1, text=original)
            )
        )
        start, end = position_at(original, edit_start), position_at(original, edit_start + len(case.edit_before))
        cursor = position_at(case.document, case.cursor)
        sent = time.perf_counter()
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                types.VersionedTextDocumentIdentifier(version=2, uri=uri),
                [
                    types.TextDocumentContentChangePartial(
                        range=types.Range(
                            types.Position(start.line, start.character), types.Position(end.line, end.character)
                        ),
                        text=case.edit_after,
                    )
                ],
            )
        )
        params = {
            "textDocument": {"uri": uri, "version": 2},
            "position": {"line": cursor.line, "character": cursor.character},
        }
        result = await client.protocol.send_request_async("textDocument/copilotInlineEdit", params)
        answer_ms = (time.perf_counter() - sent) * 1e3
        stats = await client.protocol.send_request_async("codespec/stats", {})
        last = stats.last_requests[-1]
        after_accept_ms = None
        if result.edits:  # accept it as the editors do (one change; the cursor at its end), ask again
            edit = result.edits[0]
            await asyncio.sleep(args.think_ms / 1000)  # the user reads the suggestion, then presses Tab
            client.text_document_did_change(
                types.DidChangeTextDocumentParams(
                    types.VersionedTextDocumentIdentifier(version=3, uri=uri),
                    [types.TextDocumentContentChangePartial(range=_range(edit.range), text=edit.text)],
                )
            )
            after = _apply(case.document, edit)
            end = position_at(after, _offset(case.document, edit.range.start) + len(edit.text))
            sent = time.perf_counter()
            await client.protocol.send_request_async(
                "textDocument/copilotInlineEdit",
                {
                    "textDocument": {"uri": uri, "version": 3},
                    "position": {"line": end.line, "character": end.character},
                },
            )
            after_accept_ms = (time.perf_counter() - sent) * 1e3
        client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=uri)))
        if number < args.warm_up:
            continue
        rows.append(
            {
                "id": case.id,
                "answer_ms": answer_ms,
                "engine_ms": last.elapsed_ms,
                "ttft_ms": last.ttft_ms,
                "prompt_tokens": last.prompt_tokens,
                "tokens": last.tokens,
                "tokens_per_forward": last.tokens / last.target_forwards if last.target_forwards else None,
                "edits": len(result.edits),
                "after_accept_ms": after_accept_ms,
            }
        )
        print(f"case {number + 1}/{len(cases)}: {answer_ms:.0f} ms", file=sys.stderr, flush=True)
    await _stop(client)
    return {
        "model": args.model or "shipped",
        "speculate": not args.no_speculate,
        "think_ms": args.think_ms,
        "backend": "pytorch fp32 (cpu)" if not str(args.model or "").endswith(".gguf") else "llama.cpp",
        "cases": len(rows),
        "answer_ms": _stat(rows, "answer_ms"),
        "engine_ms": _stat(rows, "engine_ms"),
        "ttft_ms": _stat(rows, "ttft_ms"),
        "prompt_tokens": _stat(rows, "prompt_tokens"),
        "with_an_edit": sum(row["edits"] > 0 for row in rows),
        "after_accept_ms": _stat(rows, "after_accept_ms"),
        "rows": rows,
    }


async def bench_cross_file(args) -> dict:
    from lsprotocol import types
    from pygls.lsp.client import LanguageClient

    from bench.next_edit_workload import load
    from codespec.service.engine.indexing import uri_to_path
    from codespec.service.requests.positions import position_at

    cases = load(SHARED / "edits-httpx.jsonl", args.cases + args.warm_up, cross_file=True)
    root = Path(tempfile.mkdtemp(prefix="codespec-next-edit-cross-"))
    for number, case in enumerate(cases):
        (root / f"site{number}.py").write_text(case.document, encoding="utf-8")
    client = LanguageClient("codespec-bench", "1")
    await client.start_io(sys.executable, "-m", "codespec.commands.cli", "serve")
    options: dict = {"device": "cpu", "limits": {"deadlineMs": 60_000}, "index": {"path": str(root / ".index.db")}}
    if args.model:
        options["model"] = args.model
    indexed = asyncio.get_running_loop().create_future()

    @client.feature("$/progress")
    def progress(ls, params):
        value = params.value
        kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
        if kind == "end" and not indexed.done():
            indexed.set_result(True)

    @client.feature("window/workDoneProgress/create")
    def create(ls, params):
        return None

    await client.initialize_async(
        types.InitializeParams(
            capabilities=types.ClientCapabilities(window=types.WindowClientCapabilities(work_done_progress=True)),
            root_uri=root.as_uri(),
            initialization_options=options,
        )
    )
    client.initialized(types.InitializedParams())
    await asyncio.wait_for(indexed, 120)
    rows = []
    for number, case in enumerate(cases):
        uri = (root / f"edit{number}.py").as_uri()  # not on disk: an unsaved buffer of the edited lines
        client.text_document_did_open(
            types.DidOpenTextDocumentParams(types.TextDocumentItem(uri, "python", 1, case.edit_before))
        )
        sent = time.perf_counter()
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                types.VersionedTextDocumentIdentifier(version=2, uri=uri),
                [types.TextDocumentContentChangeWholeDocument(text=case.edit_after)],
            )
        )
        cursor = position_at(case.edit_after, len(case.edit_after.rstrip("\n")))
        result = await client.protocol.send_request_async(
            "textDocument/copilotInlineEdit",
            {
                "textDocument": {"uri": uri, "version": 2},
                "position": {"line": cursor.line, "character": cursor.character},
                "otherDocuments": True,
            },
        )
        answer_ms = (time.perf_counter() - sent) * 1e3
        named = result.edits[0].textDocument.uri if result.edits else None
        reopen_ms, same, own, again = None, None, None, None
        on_disk = uri_to_path(named) if named is not None else None
        text = on_disk.read_text(encoding="utf-8") if on_disk is not None and on_disk.is_file() else None
        own = text == case.document if text is not None else None  # its own file, or an identical copy
        if named is not None and text is not None and named != uri and result.edits[0].textDocument.version is None:
            edit = result.edits[0]
            sent = time.perf_counter()
            client.text_document_did_open(
                types.DidOpenTextDocumentParams(types.TextDocumentItem(named, "python", 1, text))
            )
            again = await client.protocol.send_request_async(
                "textDocument/copilotInlineEdit",
                {"textDocument": {"uri": named, "version": 1}, "position": _position(edit.range.start)},
            )
            reopen_ms = (time.perf_counter() - sent) * 1e3
            same = bool(again.edits) and (again.edits[0].text, _position(again.edits[0].range.start)) == (
                edit.text,
                _position(edit.range.start),
            )
            again = [(e.text, _position(e.range.start)) for e in again.edits]
            client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=named)))
        client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=uri)))
        if number < args.warm_up:
            continue
        rows.append(
            {
                "id": case.id,
                "answer_ms": answer_ms,
                "named": "none" if named is None else "asking" if named == uri else ("own" if own else "other"),
                "reopen_ms": reopen_ms,
                "reopen_same_edit": same,
                "first": [(e.text, _position(e.range.start)) for e in result.edits],
                "again": again,
            }
        )
        print(f"case {number + 1}/{len(cases)}: {answer_ms:.0f} ms, {rows[-1]['named']}", file=sys.stderr, flush=True)
    await _stop(client)
    return {
        "model": args.model or "shipped",
        "mode": "cross-file",
        "cases": len(rows),
        "answer_ms": _stat(rows, "answer_ms"),
        "named_own_file": sum(row["named"] == "own" for row in rows),
        "named_another_file": sum(row["named"] == "other" for row in rows),
        "named_the_asking_document": sum(row["named"] == "asking" for row in rows),
        "no_edit": sum(row["named"] == "none" for row in rows),
        "reopen_ms": _stat(rows, "reopen_ms"),
        "reopen_same_edit": sum(bool(row["reopen_same_edit"]) for row in rows),
        "rows": rows,
    }


async def _stop(client) -> None:
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()


def _stat(rows: list[dict], key: str) -> dict:
    """p50 and p95 of ``key`` over the rows that have it."""
    from codespec.core.stats import percentile

    values = [row[key] for row in rows if row[key] is not None]
    return {"p50": round(percentile(values, 50), 1), "p95": round(percentile(values, 95), 1)} if values else {}


def _position(position) -> dict:
    return {"line": position.line, "character": position.character}


def _range(rng):
    from lsprotocol import types

    return types.Range(
        types.Position(rng.start.line, rng.start.character), types.Position(rng.end.line, rng.end.character)
    )


def _offset(text: str, position) -> int:
    """Code point offset of an LSP position (UTF-16 columns) in ``text``."""
    from codespec.service.requests.positions import LineIndex

    return LineIndex(text, "utf-16").offset(position.line, position.character, clamp=True)


def _apply(text: str, edit) -> str:
    return text[: _offset(text, edit.range.start)] + edit.text + text[_offset(text, edit.range.end) :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--cases", type=int, default=40)
    parser.add_argument("--warm-up", type=int, default=3)
    parser.add_argument("--think-ms", type=int, default=300, help="pause before accepting a suggestion")
    parser.add_argument("--no-speculate", action="store_true", help="the server does not speculate")
    parser.add_argument("--cross-file", action="store_true", help="the next site in another file (module docstring)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    report = asyncio.run(bench_cross_file(args) if args.cross_file else bench(args))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    raise SystemExit(main())
