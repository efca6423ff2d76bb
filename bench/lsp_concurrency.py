"""Many requests at once through the LSP door, from a real LSP client (pygls's ``LanguageClient``)
talking to ``codespec serve`` over stdio (docs/benchmarks.md, "Many requests at once").

One editor connection, N documents: the same N requests (``codespec/edit`` rewrites of a region
from a real project's commits, or invoked ``textDocument/inlineCompletion`` at a real cursor) are
sent one at a time, then by 2, 4, 8... at once, as an editor does with a rewrite, a chat and ghost
text in flight, or a plugin that rewrites several files. Per level: aggregate completion tokens per
second (the server's own count), request latency p50 / p95, the mean batch the scheduler ran, and
whether every answer equals the one-at-a-time answer (greedy). Every level opens fresh documents
(so each prefills every prompt) and clears the session history; the workspace index is off, as
in the HTTP door's benchmark (``bench.concurrency``), so a later level never drafts from an
earlier level's answers.

    python -m bench.lsp_concurrency --model-shape qwen2.5-coder-0.5b --kind edit --requests 8 \\
        --concurrency 1 2 4 8 --json /tmp/lsp-concurrency.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from bench.concurrency import WORKLOADS, completion_bodies, edit_cases


def lsp_edit_cases(path: Path, count: int, chars: int) -> list[dict]:
    """The HTTP benchmark's rewrites (``bench.concurrency``): the region before the commit is the document."""
    return [
        {"text": case.reference, "instruction": (case.instruction or "").strip() or None}
        for case in edit_cases(path, count, chars)
    ]


def lsp_completion_cases(path: Path, count: int, chars: int) -> list[dict]:
    """The HTTP benchmark's completions (``bench.concurrency``): the window's text, the cursor between
    its prefix and suffix."""
    bodies = completion_bodies(path, count, chars, 1, None)
    return [{"text": body["prompt"] + body["suffix"], "offset": len(body["prompt"])} for body in bodies]


def model_option(args, scratch: Path) -> str | None:
    """What ``initializationOptions.model`` names: a model directory or GGUF file, a random-weight
    model of a published shape saved to ``scratch``, or None for the shipped default."""
    if args.model_shape:
        from bench.shapes import save_shape

        return str(save_shape(args.model_shape, scratch / args.model_shape, dtype=args.dtype))
    return args.model


def plain(value):
    """pygls's reply objects (named tuples) as dicts and lists."""
    if hasattr(value, "_asdict"):
        return {key: plain(item) for key, item in value._asdict().items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value


async def run(args) -> dict:
    from lsprotocol import types
    from pygls.lsp.client import LanguageClient

    from codespec.core.stats import percentile
    from codespec.service.requests.positions import position_at

    scratch = Path(tempfile.mkdtemp(prefix="codespec-lsp-concurrency-"))
    default = "edits-httpx.jsonl" if args.kind == "edit" else "completions-httpx.jsonl"
    workload = Path(args.workload) if args.workload else WORKLOADS / default
    make_cases = lsp_edit_cases if args.kind == "edit" else lsp_completion_cases
    cases = make_cases(workload, args.requests, args.chars)
    levels = sorted(set(args.concurrency))
    options: dict = {
        "index": {"enabled": False},
        "maxBatch": max(args.max_batch or max(levels), 1),
        "limits": {"deadlineMs": 3_600_000, "editTokens": args.max_tokens, "blockTokens": args.max_tokens},
        "completionFallback": False,
    }
    model = model_option(args, scratch)
    if model:
        options["model"] = model
    for key in ("proposer", "threads", "device"):
        if getattr(args, key):
            options[key] = getattr(args, key)

    client = LanguageClient("codespec-lsp-concurrency", "1")
    await client.start_io(sys.executable, "-m", "codespec.commands.cli", "serve")
    await client.initialize_async(
        types.InitializeParams(
            capabilities=types.ClientCapabilities(
                text_document=types.TextDocumentClientCapabilities(
                    inline_completion=types.InlineCompletionClientCapabilities()
                )
            ),
            root_uri=scratch.as_uri(),
            initialization_options=options,
        )
    )
    client.initialized(types.InitializedParams())

    @client.feature("codespec/editDelta")
    def edit_delta(params) -> None:  # streamed rewrite text: the answer carries all of it
        return None

    async def stats() -> dict:
        return plain(await client.protocol.send_request_async("codespec/stats", {}))

    async def ask(uri: str, case: dict) -> str:
        """Open the document, ask, close it: the answer's text."""
        text = case["text"]
        client.text_document_did_open(
            types.DidOpenTextDocumentParams(types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text))
        )
        try:
            if args.kind == "edit":
                end = position_at(text, len(text))
                params = {
                    "textDocument": {"uri": uri},
                    "range": {
                        "start": {"line": 0, "character": 0},
                        "end": {"line": end.line, "character": end.character},
                    },
                    "instruction": case["instruction"],
                }
                result = await client.protocol.send_request_async("codespec/edit", params)
                return result.edits[0].newText
            position = position_at(text, case["offset"])
            items = await client.text_document_inline_completion_async(
                types.InlineCompletionParams(
                    context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
                    text_document=types.TextDocumentIdentifier(uri=uri),
                    position=types.Position(position.line, position.character),
                )
            )
            found = items.items if isinstance(items, types.InlineCompletionList) else items or []
            insert = found[0].insert_text if found else ""
            return insert.value if isinstance(insert, types.StringValue) else insert
        finally:
            client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=uri)))

    async def level(clients: int, name: str) -> dict:
        await client.workspace_execute_command_async(types.ExecuteCommandParams(command="codespec.clearHistory"))
        before = await stats()
        gate = asyncio.Semaphore(clients)
        latencies: list[float] = [0.0] * len(cases)

        async def one(index: int) -> str:
            async with gate:
                start = time.perf_counter()
                text = await ask((scratch / name / f"doc_{index}.py").as_uri(), cases[index])
                latencies[index] = time.perf_counter() - start
                return text

        start = time.perf_counter()
        texts = await asyncio.gather(*(one(index) for index in range(len(cases))))
        wall = time.perf_counter() - start
        after = await stats()
        tokens = after["completion_tokens"] - before["completion_tokens"]
        cycles = after["batching"]["cycles"] - before["batching"]["cycles"]
        served = after["batching"]["mean_batch"] * after["batching"]["cycles"]
        served -= before["batching"]["mean_batch"] * before["batching"]["cycles"]
        return {
            "clients": clients,
            "texts": list(texts),
            "wall_s": round(wall, 3),
            "tokens": tokens,
            "tokens_per_s": round(tokens / wall, 2),
            "latency_p50_s": round(percentile(latencies, 50), 3),
            "latency_p95_s": round(percentile(latencies, 95), 3),
            "latencies_s": sorted(round(latency, 2) for latency in latencies),
            "mean_batch": round(served / cycles, 2) if cycles else 0.0,
        }

    report: dict = {
        "door": "LSP (stdio, pygls LanguageClient)",
        "kind": args.kind,
        "workload": workload.name,
        "requests": len(cases),
        "max_tokens": args.max_tokens,
        "levels": [],
    }
    try:
        alone = None
        for round_number in range(args.rounds):
            for clients in [1, *[level for level in levels if level != 1]]:
                result = await level(clients, f"r{round_number}-c{clients}")
                if clients == 1:
                    alone = result
                assert alone is not None
                result["round"] = round_number
                result["identical_requests"] = sum(a == b for a, b in zip(result["texts"], alone["texts"], strict=True))
                result["speedup"] = (
                    round(result["tokens_per_s"] / alone["tokens_per_s"], 3) if alone["tokens_per_s"] else 0.0
                )
                result["p95_vs_one_at_a_time"] = round(result["latency_p95_s"] / alone["latency_p95_s"], 3)
                print(
                    f"bench: lsp {args.kind} x{clients} (round {round_number + 1}): {result['tokens_per_s']} tokens/s "
                    f"({result['speedup']}x one at a time), p50 {result['latency_p50_s']} s, p95 "
                    f"{result['latency_p95_s']} s, mean batch {result['mean_batch']}, identical "
                    f"{result['identical_requests']}/{len(cases)}",
                    file=sys.stderr,
                    flush=True,
                )
                report["levels"].append({key: value for key, value in result.items() if key != "texts"})
        final = await stats()
        report["model"] = final.get("model")
        if args.show_requests:
            for entry in final["last_requests"]:
                print(entry, file=sys.stderr)
    finally:
        await client.shutdown_async(None)
        client.exit(None)
        await client.stop()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lsp_concurrency", description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--model", help="model directory or GGUF file (default: the shipped model)")
    where.add_argument("--model-shape", help="a random-weight model of this published shape (bench.shapes)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="for --model-shape")
    parser.add_argument("--kind", choices=["edit", "completion"], default="edit")
    parser.add_argument("--workload", help="a workload .jsonl (default: shared/workloads' httpx edits or completions)")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--chars", type=int, default=1500, help="characters of code per request")
    parser.add_argument("--max-tokens", type=int, default=96, help="edit budget beyond the region / block budget")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-batch", type=int, help="the server's maxBatch (default: the largest level)")
    parser.add_argument("--proposer")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--device")
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--show-requests", action="store_true", help="print the server's last requests at the end")
    args = parser.parse_args(argv)
    report = asyncio.run(run(args))
    text = json.dumps(report, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0 if all(level["identical_requests"] == report["requests"] for level in report["levels"]) else 1


if __name__ == "__main__":
    sys.exit(main())
