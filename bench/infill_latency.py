"""A keystroke's first token through llama-server's ``/infill`` against codespec's own LSP door, on one
server and one model, in the same run (a benchmark, not a test).

    python -m bench.infill_latency --limit 30 --json docs/bench/infill-vs-lsp-latency.json

Starts ``codespec serve --stdio --http`` (the LSP on stdio, the HTTP door beside it, one engine). For
each completion case, the document is opened in the LSP and one completion asked at the cursor through
each door (the keystroke before: each door's KV cache holds the document, as when typing); then the
first character of the case's target is typed and each door asked again, the order alternating by
case. Measured, client side: the LSP's time to its inline completion reply (the LSP door does not
stream; the engine's time to first token is read from ``codespec/stats``), the ``/infill`` time to its
first streamed token and to its last event (the whole reply; the engine's time to first token is in
its ``timings``). The ``/infill`` request is llama.vim's (n_predict 128, n_indent, top_k/top_p/infill
samplers, t_max_predict_ms 250 for a first request; streamed here, not by llama.vim), its document
split as llama.vim splits it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import tempfile
import time
from pathlib import Path

from codespec.core.stats import percentile

TOKEN = "infill-latency-token"
WORKLOADS = Path("/work/shared/workloads")


def llama_vim_body(text: str, offset: int) -> dict:
    """llama.vim's /infill for a cursor at ``offset`` (autoload/llama.vim s:fim_ctx_local: 256 lines
    before, the line up to the cursor as ``prompt``, the rest of the line and 64 lines after)."""
    line_start = text.rfind("\n", 0, offset) + 1
    line_end = text.find("\n", offset)
    line_end = len(text) if line_end < 0 else line_end
    before = text[:line_start].splitlines(keepends=True)[-256:]
    after = text[line_end:].splitlines(keepends=True)[:65]
    middle = text[line_start:offset]
    indent = len(middle) - len(middle.lstrip(" \t"))
    return {
        "id_slot": 0,
        "input_prefix": "".join(before),
        "input_suffix": text[offset:line_end] + "".join(after),
        "input_extra": [],
        "prompt": middle,
        "n_predict": 128,
        "stop": [],
        "n_indent": indent,
        "top_k": 40,
        "top_p": 0.90,
        "samplers": ["top_k", "top_p", "infill"],
        "stream": False,
        "cache_prompt": True,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 250,
        "response_fields": ["content", "timings/prompt_ms", "timings/predicted_n", "tokens_cached"],
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def run(args) -> dict:
    try:
        import httpx2 as httpx
    except ImportError:  # pragma: no cover
        import httpx  # type: ignore[no-redef]
    from lsprotocol import types
    from pygls.lsp.client import LanguageClient

    from codespec.service.requests.positions import position_at

    root = Path(tempfile.mkdtemp(prefix="codespec-infill-latency-"))
    cases = [json.loads(line) for line in args.cases.read_text().splitlines() if line.strip()][: args.limit]
    port = free_port()
    client = LanguageClient("codespec-bench", "1")
    command = [sys.executable, "-m", "codespec.commands.cli", "serve", "--stdio", "--http"]
    await client.start_io(*command, "--http-port", str(port), "--token", TOKEN)
    await client.initialize_async(
        types.InitializeParams(
            capabilities=types.ClientCapabilities(
                text_document=types.TextDocumentClientCapabilities(
                    inline_completion=types.InlineCompletionClientCapabilities()
                )
            ),
            root_uri=root.as_uri(),
            initialization_options={"limits": {"deadlineMs": 60_000}, "index": {"enabled": False}},
        )
    )
    client.initialized(types.InitializedParams())
    http = httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120
    )
    for _ in range(600):  # the HTTP door starts beside the LSP
        try:
            if (await http.get("/health")).status_code == 200:
                break
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.1)

    measured: dict[str, list[float]] = {
        "lsp_reply_ms": [],
        "lsp_engine_ttft_ms": [],
        "infill_first_token_ms": [],
        "infill_reply_ms": [],
        "infill_engine_ttft_ms": [],
    }

    async def lsp(uri: str, text: str, offset: int, record: bool) -> None:
        position = position_at(text, offset)
        started = time.perf_counter()
        await client.text_document_inline_completion_async(
            types.InlineCompletionParams(
                text_document=types.TextDocumentIdentifier(uri=uri),
                position=types.Position(position.line, position.character),
                context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
            )
        )
        reply_ms = (time.perf_counter() - started) * 1e3
        if record:
            stats = await client.protocol.send_request_async("codespec/stats", {})
            measured["lsp_reply_ms"].append(reply_ms)
            if stats.last_requests[-1].ttft_ms is not None:
                measured["lsp_engine_ttft_ms"].append(stats.last_requests[-1].ttft_ms)

    async def infill(text: str, offset: int, record: bool) -> None:
        body = {**llama_vim_body(text, offset), "stream": True}
        started = time.perf_counter()
        first_ms, last = None, {}
        async with http.stream("POST", "/infill", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    last = json.loads(line[6:])
                    if first_ms is None and last.get("content"):
                        first_ms = (time.perf_counter() - started) * 1e3
        reply_ms = (time.perf_counter() - started) * 1e3
        if record:
            if first_ms is not None:
                measured["infill_first_token_ms"].append(first_ms)
            measured["infill_reply_ms"].append(reply_ms)
            measured["infill_engine_ttft_ms"].append(last["timings"]["prompt_ms"])

    for number, case in enumerate(cases):
        uri = (root / f"case_{number}.py").as_uri()
        text = case["prefix"] + case["suffix"]
        offset = len(case["prefix"])
        client.text_document_did_open(
            types.DidOpenTextDocumentParams(types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text))
        )

        typed = case["target"][:1]
        position = position_at(text, offset)
        here = types.Position(position.line, position.character)
        typed_text, typed_offset = text[:offset] + typed + text[offset:], offset + len(typed)

        doors = ["lsp", "infill"]
        if number % 2:
            doors.reverse()
        for door in doors:
            # each door on its own: the other door's answer to the same keystroke, in the session's
            # earlier outputs, would draft this one's (its own keystroke before stays: an editor's)
            await client.workspace_execute_command_async(types.ExecuteCommandParams(command="codespec.clearHistory"))
            if door == "infill":
                await infill(text, offset, False)  # the keystroke before: the door's cache holds the document
                await infill(typed_text, typed_offset, True)
                continue
            await lsp(uri, text, offset, False)
            client.text_document_did_change(
                types.DidChangeTextDocumentParams(
                    text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
                    content_changes=[types.TextDocumentContentChangePartial(range=types.Range(here, here), text=typed)],
                )
            )
            await lsp(uri, typed_text, typed_offset, True)
        client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=uri)))

    await http.aclose()
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    summary = {
        name: {"p50": percentile(values, 50), "p95": percentile(values, 95), "n": len(values)}
        for name, values in measured.items()
    }
    return {
        "workload": args.cases.name,
        "cases": len(cases),
        "model": "shipped default target (CPU, 1 torch thread)",
        "server": "codespec serve --stdio --http (one process, one engine)",
        "phase": "keystroke (the first character of the target typed; each door asked once before, the session history cleared before each door)",
        "ms": summary,
        "ratio_first_token_infill_over_lsp_reply_p50": (
            summary["infill_first_token_ms"]["p50"] / summary["lsp_reply_ms"]["p50"]
        ),
        "ratio_engine_ttft_infill_over_lsp_p50": (
            summary["infill_engine_ttft_ms"]["p50"] / summary["lsp_engine_ttft_ms"]["p50"]
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, default=WORKLOADS / "completions-httpx.jsonl")
    parser.add_argument("--limit", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report = asyncio.run(run(args))
    text = json.dumps(report, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
