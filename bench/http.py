"""The OpenAI-compatible HTTP API, measured (docs/benchmarks.md, "HTTP API").

`python -m bench.http` loads the default model pair (or --model), serves the API on a loopback
port in this process and, for each edit of the workload, sends the same chat request side by side
(order rotated per case):

- **prediction**: the region in a fenced block, ``prediction`` = the file before the edit
  (OpenAI Predicted Outputs), streamed;
- **no prediction**: the same request without it (the rewrite still drafts from the region);
- **plain**: without prediction and with ``proposer: "none"``: plain greedy decoding through the
  same API, the baseline;

then measures what the HTTP path costs: the *prediction* request run on the engine directly
(``EngineService.submit``, the request the HTTP handler builds) against the same request over HTTP
(non-streamed), per request, and for every streamed chunk the time from the engine emitting its
last text to the client reading it. All outputs are checked token-identical across the three
configurations (greedy). Client-side clocks; one process, so the engine's and the client's
timestamps share ``time.perf_counter``.

    python -m bench.http --workload ../shared/workloads/edits-httpx.jsonl --json /tmp/http.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from codespec.service.engine.service import EngineService

CONFIGS = ("prediction", "no prediction", "plain")
TOKEN = "bench-http"


def percentile(values, q: float) -> float | None:
    from codespec.core.stats import percentile as pct

    return pct(list(values), q) if values else None


def _round(value: float | None, digits: int) -> float | None:
    return round(value, digits) if value is not None else None


class TimedService:
    """The engine service, recording when each delta of each job is emitted (engine thread)."""

    def __init__(self, service) -> None:
        self.service = service
        self.emitted: dict[int, list[tuple[float, int]]] = {}  # id(request) -> (time, cumulative chars)

    def submit(self, request, on_delta=None):
        marks: list[tuple[float, int]] = []
        self.emitted[id(request)] = marks
        total = [0]

        def timed(text: str) -> None:
            total[0] += len(text)
            marks.append((time.perf_counter(), total[0]))
            if on_delta is not None:
                on_delta(text)

        return self.service.submit(request, timed)

    def __getattr__(self, name):
        return getattr(self.service, name)


def chat_body(case, prediction: bool, proposer: str | None, stream: bool, max_tokens: int | None, path: str) -> dict:
    """``path`` keys the prompt cache: a fresh one per request, so every request prefills its prompt."""
    instruction = (case.instruction or "").strip().splitlines()[0] if (case.instruction or "").strip() else ""
    content = f"{instruction}\n```python\n{case.reference}```" if instruction else f"```python\n{case.reference}```"
    body: dict = {
        "model": "codespec",
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
        "path": path,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if prediction:
        body["prediction"] = {"type": "content", "content": case.reference}
    if proposer:
        body["proposer"] = proposer
    if max_tokens:
        body["max_tokens"] = max_tokens
    return body


def stream_once(client, url: str, body: dict) -> dict:
    """One streamed request: TTFT, chunk arrival times (with cumulative text length), usage."""
    start = time.perf_counter()
    arrivals, text, usage, extra = [], "", None, None
    with client.stream(
        "POST", url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
    ) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.read()!r}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage, extra = chunk["usage"], chunk.get("codespec")
            for choice in chunk.get("choices", []):
                piece = choice["delta"].get("content") or ""
                if piece:
                    text += piece
                    arrivals.append((time.perf_counter(), len(text)))
    end = time.perf_counter()
    return {
        "text": text,
        "elapsed_s": end - start,
        "ttft_s": (arrivals[0][0] - start) if arrivals else None,
        "chunks": len(arrivals),
        "arrivals": arrivals,
        "usage": usage,
        "codespec": extra,
    }


def chunk_delays(arrivals, marks) -> list[float]:
    """For each chunk: arrival minus the emission of the engine delta that completed its text."""
    delays, index = [], 0
    for arrived, length in arrivals:
        while index < len(marks) and marks[index][1] < length:
            index += 1
        if index < len(marks):
            delays.append(arrived - marks[index][0])
    return delays


def run(args) -> dict:
    try:  # the HTTP client the openai package depends on (httpx2 in recent releases, httpx before)
        import httpx2
    except ImportError:
        import httpx as httpx2  # type: ignore[no-redef]

    from bench.workload import load_cases
    from codespec.http_api import parse_chat, start_http_server
    from codespec.service.doors.auth import Listen
    from codespec.service.engine.runtime import LoopThread, close_service, load_service
    from codespec.service.requests.options import EngineOptions, ServerOptions

    cases = load_cases(Path(args.workload), max_records=args.max_records, max_chars=args.max_chars, stride=args.stride)
    cases = [case for case in cases if case.kind == "edit"]
    options = ServerOptions(engine=EngineOptions(model=args.model, threads=args.threads))
    service = load_service(options)
    timed = TimedService(service)
    loop = LoopThread("bench-http")
    server = loop.run(start_http_server(cast("EngineService", timed), Listen(TOKEN), options))  # it forwards all else
    url = f"http://127.0.0.1:{server.port}"
    door = server.door
    rows = []
    try:
        with httpx2.Client(timeout=600) as client:
            for number, case in enumerate(cases):
                row: dict = {"id": case.id, "chars": len(case.reference), "reference": case.reference}
                # The recorded edit's length plus a margin: a small model that misses the end of its copy
                # would otherwise write to the context's end at plain-decoding speed.
                budget = args.max_tokens or len(service.target.encode(case.output)) + args.margin
                order = CONFIGS[number % 3 :] + CONFIGS[: number % 3]  # rotate which goes first
                for config in order:
                    body = chat_body(
                        case,
                        config == "prediction",
                        "none" if config == "plain" else None,
                        True,
                        budget,
                        f"bench/{number}/{config}",
                    )
                    # each config a first request: the session's outputs would hold the case's
                    # answer from the config before
                    service.clear_history().result()
                    before = set(timed.emitted)
                    result = stream_once(client, url, body)
                    (job_key,) = set(timed.emitted) - before
                    result["chunk_delays"] = chunk_delays(result.pop("arrivals"), timed.emitted.pop(job_key))
                    row[config] = result
                # The HTTP path against the engine called directly: the same short request (8 tokens, its
                # prompt cached after the first run, so both sides do the same little work), alternated.
                body = chat_body(case, True, None, False, 8, f"bench/{number}/overhead")
                request = asyncio.run_coroutine_threadsafe(door.chat(parse_chat(body)), loop.loop).result()
                service.submit(request).wait()  # fills the prompt cache
                row["direct_s"], row["http_s"] = [], []
                for _ in range(args.overhead_pairs):
                    start = time.perf_counter()
                    service.submit(request).wait()
                    row["direct_s"].append(time.perf_counter() - start)
                    start = time.perf_counter()
                    response = client.post(
                        url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
                    )
                    row["http_s"].append(time.perf_counter() - start)
                    assert response.status_code == 200, response.text
                timed.emitted.clear()
                rows.append(row)
                same = len({row[config]["text"] for config in CONFIGS}) == 1
                print(
                    f"[{number + 1}/{len(cases)}] {case.id}: {row['prediction']['usage']['completion_tokens']} "
                    f"tokens, {row['plain']['elapsed_s'] / row['prediction']['elapsed_s']:.2f}x, "
                    f"identical={same}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        loop.run(server.stop())
        loop.stop()
        close_service(service)
    return summarize(rows, args)


def summarize(rows: list[dict], args) -> dict:
    out: dict = {
        "cases": len(rows),
        "model": args.model or "default",
        "max_chars": args.max_chars,
        "finish_reasons": {},
        "configs": {},
    }
    for config in CONFIGS:
        results = [row[config] for row in rows]
        tokens = sum(r["usage"]["completion_tokens"] for r in results)
        seconds = sum(r["elapsed_s"] for r in results)
        details = [r["usage"]["completion_tokens_details"] for r in results]
        ttft = [r["ttft_s"] * 1e3 for r in results if r["ttft_s"] is not None]
        out["configs"][config] = {
            "tokens": tokens,
            "seconds": round(seconds, 3),
            "tokens_per_s": round(tokens / seconds, 1),
            "tokens_per_s_p50": round(
                statistics.median(r["usage"]["completion_tokens"] / r["elapsed_s"] for r in results), 1
            ),
            "ttft_ms_p50": _round(percentile(ttft, 50), 1),
            "ttft_ms_p95": _round(percentile(ttft, 95), 1),
            "accepted_prediction_tokens": sum(d["accepted_prediction_tokens"] for d in details),
            "rejected_prediction_tokens": sum(d["rejected_prediction_tokens"] for d in details),
            "engine_accepted_draft_tokens": sum(
                r["codespec"]["speculation"]["accepted_prediction_tokens"] for r in results
            ),
            "engine_rejected_draft_tokens": sum(
                r["codespec"]["speculation"]["rejected_prediction_tokens"] for r in results
            ),
            "tokens_per_forward": round(
                statistics.median(r["codespec"]["stats"]["tokens_per_forward"] for r in results), 2
            ),
        }
    for row in rows:
        reason = row["prediction"]["codespec"]["finish_reason"]
        out["finish_reasons"][reason] = out["finish_reasons"].get(reason, 0) + 1
    out["prediction_copied_exactly"] = sum(row["prediction"]["text"] == row["reference"] for row in rows)
    plain = out["configs"]["plain"]["tokens_per_s"]
    for config in CONFIGS:
        out["configs"][config]["speedup_vs_plain"] = round(out["configs"][config]["tokens_per_s"] / plain, 2)
    out["per_request_speedup_p50"] = round(
        statistics.median(row["plain"]["elapsed_s"] / row["prediction"]["elapsed_s"] for row in rows), 2
    )
    out["identical_outputs"] = sum(len({row[c]["text"] for c in CONFIGS}) == 1 for row in rows)
    overhead = [(http - direct) * 1e3 for row in rows for http, direct in zip(row["http_s"], row["direct_s"])]
    delays = [d * 1e3 for row in rows for c in CONFIGS for d in row[c]["chunk_delays"]]
    out["http_overhead"] = {
        "direct_ms_p50": _round(percentile([s * 1e3 for row in rows for s in row["direct_s"]], 50), 2),
        "http_ms_p50": _round(percentile([s * 1e3 for row in rows for s in row["http_s"]], 50), 2),
        "per_request_ms_p50": _round(percentile(overhead, 50), 2),
        "per_request_ms_p95": _round(percentile(overhead, 95), 2),
        "per_chunk_ms_p50": _round(percentile(delays, 50), 3),
        "per_chunk_ms_p95": _round(percentile(delays, 95), 3),
        "chunks": len(delays),
    }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="../shared/workloads/edits-httpx.jsonl")
    parser.add_argument("--model", default=None, help="default: the shipped model pair")
    parser.add_argument("--max-records", type=int, default=25)
    parser.add_argument("--stride", type=int, default=6, help="every N-th record (a spread-out subsample)")
    parser.add_argument(
        "--max-chars",
        type=int,
        default=600,
        help="edits cut to their changed lines and this many characters (the default model's "
        "context is 1,024 tokens: the region and its rewrite must both fit)",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=None, help="per request (default: the recorded edit's tokens + --margin)"
    )
    parser.add_argument("--margin", type=int, default=32)
    parser.add_argument(
        "--overhead-pairs", type=int, default=3, help="direct / HTTP pairs per case for the HTTP path's overhead"
    )
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    summary = run(args)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
