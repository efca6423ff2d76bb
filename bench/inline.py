"""Inline-completion latency through a real LSP client (a benchmark, not a test).

    python -m bench.inline --cases FILE.jsonl [--workspace FILE.jsonl] [--model DIR] [--mode line]

Starts `codespec serve` over stdio, indexes the workspace records, and for each completion case:
opens the document (prefix + suffix) and at once asks for an inline completion at the cursor
(**cold**: the worst case, nothing prepared, the whole prompt prefilled); opens it again under
another name and asks after ``--think-ms`` (**opened**: a user opens a file, then types; the server
spent the pause prefilling the document's first window in the background; session history is
cleared before each of these two, so neither drafts what the other generated); then types the first
character of the case's target and asks again (**keystroke**: the editor's steady state; prompt
caching and the shown suggestion as reference apply); with ``--large-open MB``, two keystrokes per
case, one of them (alternating) right after a document of MB megabytes is opened (a user opening a
big file while typing), and every case twice, the other keystroke beside the open the second time,
so both phases hold the same keystrokes. Reports, per phase, the client-observed time
to the full item, the engine's time from submission to result, and the engine's time to first
token (from ``codespec/stats``), p50/p95, in milliseconds. The workload files are inputs for
measurement only; the product never reads them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from codespec.core.stats import percentile


def _load(path: Path, limit: int | None) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return rows[:limit] if limit else rows


def large_text(seed: str, megabytes: float) -> str:
    """A document of ``megabytes`` MB of real code (``seed`` repeated), as a user opens a big file."""
    size = int(megabytes * 1_000_000)
    return (seed * (size // max(len(seed), 1) + 1))[:size]


async def bench(args) -> dict:
    from lsprotocol import types
    from pygls.lsp.client import LanguageClient

    from codespec.service.requests.positions import position_at

    root = Path(tempfile.mkdtemp(prefix="codespec-bench-"))
    workspace = root / "workspace"
    for record in _load(args.workspace, None) if args.workspace else []:
        target = workspace / record["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(record["text"], encoding="utf-8")
    workspace.mkdir(exist_ok=True)
    cases = _load(args.cases, args.limit)

    client = LanguageClient("codespec-bench", "1")
    indexed = asyncio.Event()

    @client.feature(types.WINDOW_WORK_DONE_PROGRESS_CREATE)
    def create_progress(params):
        return None

    @client.feature(types.PROGRESS)
    def progress(params):
        value = params.value
        kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
        if kind == "end":
            indexed.set()

    @client.feature(types.WINDOW_SHOW_MESSAGE)
    def show_message(params):
        print(f"server: {params.message}", file=sys.stderr)

    command = [sys.executable, "-m", "codespec.commands.cli", "serve"]
    await client.start_io(*command)
    options = {
        "device": args.device,
        "mode": args.mode,
        "index": {"path": str(root / "index.db")},
        "limits": {"deadlineMs": 60_000},
    }
    if args.model:
        options["model"] = args.model
    if args.proposer:
        options["proposer"] = args.proposer
    if args.prefix_chars:
        options["limits"]["prefixChars"] = args.prefix_chars
    if args.suffix_chars:
        options["limits"]["suffixChars"] = args.suffix_chars
    started = time.perf_counter()
    await client.initialize_async(
        types.InitializeParams(
            capabilities=types.ClientCapabilities(
                window=types.WindowClientCapabilities(work_done_progress=True),
                text_document=types.TextDocumentClientCapabilities(
                    inline_completion=types.InlineCompletionClientCapabilities()
                ),
            ),
            root_uri=workspace.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=workspace.as_uri(), name="workspace")],
            initialization_options=options,
        )
    )
    client.initialized(types.InitializedParams())
    startup_s = time.perf_counter() - started
    if args.workspace:
        await asyncio.wait_for(indexed.wait(), 600)
    index_s = time.perf_counter() - started - startup_s

    phases: dict[str, dict[str, list[float]]] = {"cold": {}, "opened": {}, "keystroke": {}}
    if args.large_open:
        phases["keystroke_beside_large_open"] = {}
    lines: dict[str, int] = {"one-line": 0, "multi-line": 0}

    async def ask(uri: str, text: str, offset: int, phase: str) -> None:
        position = position_at(text, offset)
        start = time.perf_counter()
        items = await client.text_document_inline_completion_async(
            types.InlineCompletionParams(
                text_document=types.TextDocumentIdentifier(uri=uri),
                position=types.Position(position.line, position.character),
                context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
            )
        )
        item_ms = (time.perf_counter() - start) * 1e3
        stats = await client.protocol.send_request_async("codespec/stats", {})
        last = stats.last_requests[-1]
        record = phases[phase]
        record.setdefault("item_ms", []).append(item_ms)
        if last.ttft_ms is not None:
            record.setdefault("ttft_ms", []).append(last.ttft_ms)
        record.setdefault("engine_ms", []).append(last.elapsed_ms)  # submit to result, engine side
        record.setdefault("door_ms", []).append(item_ms - last.elapsed_ms)  # the rest: transport, handler
        record.setdefault("tokens", []).append(last.tokens)
        record.setdefault("forwards", []).append(last.target_forwards)
        if last.prompt_tokens:
            record.setdefault("prompt_reuse", []).append(last.cached_prompt_tokens / last.prompt_tokens)
        if isinstance(items, types.InlineCompletionList):
            items = items.items
        insert = items[0].insert_text if items else ""
        text_out = insert.value if isinstance(insert, types.StringValue) else insert
        lines["multi-line" if "\n" in text_out.rstrip("\n") else "one-line"] += 1

    def open_document(uri: str, text: str) -> None:
        client.text_document_did_open(
            types.DidOpenTextDocumentParams(types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text))
        )

    async def forget() -> None:
        """Clear session history: otherwise a phase drafts the answer the previous phase generated
        for the same text (measured: opened p50 46 ms with it, the cold figure without it)."""
        await client.workspace_execute_command_async(types.ExecuteCommandParams(command="codespec.clearHistory"))

    passes = [
        (number, case, sweep) for sweep in range(2 if args.large_open else 1) for number, case in enumerate(cases)
    ]
    for number, case, sweep in passes:
        uri = (root / "cases" / f"case_{number}_{sweep}.py").as_uri()
        text = case["prefix"] + case["suffix"]
        offset = len(case["prefix"])
        await forget()
        open_document(uri, text)
        await ask(uri, text, offset, "cold")
        client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=uri)))
        if args.think_ms > 0:  # a user opens the file, then types: the server had that long to prepare
            uri = (root / "cases" / f"case_{number}_{sweep}_opened.py").as_uri()
            await forget()
            open_document(uri, text)
            await asyncio.sleep(args.think_ms / 1000)
            await ask(uri, text, offset, "opened")
        # keystrokes: the first character of the target; with --large-open the first two, one of
        # them (alternating by case, the other one in the second sweep) right after another
        # document of that size is opened
        keys = case["target"][: 2 if args.large_open else 1]
        for typed_number, typed in enumerate(keys):
            phase = "keystroke"
            large_uri = None
            if args.large_open and (number + typed_number + sweep) % 2 == 1:
                phase = "keystroke_beside_large_open"
                large_uri = (root / "large" / f"large_{number}_{typed_number}_{sweep}.py").as_uri()
                open_document(large_uri, large_text(text, args.large_open))
            position = position_at(text, offset)
            client.text_document_did_change(
                types.DidChangeTextDocumentParams(
                    text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2 + typed_number),
                    content_changes=[
                        types.TextDocumentContentChangePartial(
                            range=types.Range(
                                types.Position(position.line, position.character),
                                types.Position(position.line, position.character),
                            ),
                            text=typed,
                        )
                    ],
                )
            )
            text = text[:offset] + typed + text[offset:]
            offset += len(typed)
            await ask(uri, text, offset, phase)
            if large_uri is not None:
                client.text_document_did_close(
                    types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=large_uri))
                )
        client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=uri)))

    stats = await client.protocol.send_request_async("codespec/stats", {})
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()

    report = {
        "cases": len(cases),
        "sweeps": 2 if args.large_open else 1,
        "mode": args.mode,
        "model": stats.model,
        "proposer": stats.proposer,
        "startup_s": round(startup_s, 2),
        "index_s": round(index_s, 2),
        "items": lines,
        "engine": stats.engine._asdict(),
    }
    for phase, values in phases.items():
        for name, series in values.items():
            report[f"{phase}_{name}_p50"] = round(percentile(series, 50), 2)
            report[f"{phase}_{name}_p95"] = round(percentile(series, 95), 2)
    return report


def bench_in_process(args) -> dict:
    """The same cold / keystroke requests straight into the engine service (no LSP transport, no
    index): separates engine latency from protocol overhead."""
    from codespec.service.engine.runtime import close_service, start_service
    from codespec.service.requests.inline import completion_request
    from codespec.service.requests.options import CompletionOptions, EngineOptions, ServerOptions

    options = ServerOptions(
        engine=EngineOptions(model=args.model, device=args.device, proposer=args.proposer or "auto"),
        completion=CompletionOptions(mode=args.mode),
    )
    service = start_service(options)
    series: dict[str, list[float]] = {
        "cold_item_ms": [],
        "cold_ttft_ms": [],
        "keystroke_item_ms": [],
        "keystroke_ttft_ms": [],
    }

    def ask(text: str, offset: int, key: str, phase: str) -> None:
        request, _ = completion_request(
            text, offset, options, service.target, invoked=False, cache_key=key, deadline=False
        )
        started = time.perf_counter()
        result = service.submit(request).wait()
        series[f"{phase}_item_ms"].append((time.perf_counter() - started) * 1e3)
        if result.stats["ttft_ms"] is not None:
            series[f"{phase}_ttft_ms"].append(result.stats["ttft_ms"])

    try:
        for number, case in enumerate(_load(args.cases, args.limit)):
            text, offset = case["prefix"] + case["suffix"], len(case["prefix"])
            ask(text, offset, f"case-{number}", "cold")
            typed = case["target"][:1]
            if typed:
                ask(text[:offset] + typed + text[offset:], offset + len(typed), f"case-{number}", "keystroke")
    finally:
        close_service(service)
    report = {
        "cases": len(_load(args.cases, args.limit)),
        "mode": args.mode,
        "in_process": True,
        "proposer": options.engine.proposer,
    }
    for name, values in series.items():
        report[f"{name}_p50"] = round(percentile(values, 50), 2)
        report[f"{name}_p95"] = round(percentile(values, 95), 2)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=Path, required=True, help="completion records (JSON lines)")
    parser.add_argument("--workspace", type=Path, default=None, help="workspace records {path, text} to index")
    parser.add_argument("--model", default=None, help="model directory (default: the shipped model)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--proposer", default=None)
    parser.add_argument("--mode", choices=("auto", "line", "block"), default="line")
    parser.add_argument("--prefix-chars", type=int, default=None, help="limits.prefixChars (default: the server's)")
    parser.add_argument("--suffix-chars", type=int, default=None, help="limits.suffixChars (default: the server's)")
    parser.add_argument(
        "--think-ms",
        type=int,
        default=500,
        help="the 'opened' phase: wait this long after opening the document before asking (0: skip)",
    )
    parser.add_argument("--limit", type=int, default=None, help="first N cases only")
    parser.add_argument(
        "--large-open",
        type=float,
        default=0.0,
        metavar="MB",
        help="type two keystrokes per case, one of them right after a document of MB megabytes is opened "
        "(phase keystroke_beside_large_open against keystroke, in the same run)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="call the engine service directly (no LSP, no index): engine latency only",
    )
    args = parser.parse_args(argv)
    report = bench_in_process(args) if args.in_process else asyncio.run(bench(args))
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
