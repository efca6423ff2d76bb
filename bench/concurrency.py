"""Many clients at once through the OpenAI-compatible HTTP door, with the official ``openai`` client
(docs/benchmarks.md, "Many requests at once").

The server is what ``codespec serve --http`` runs (an ``EngineService`` and ``http_api``'s server on
a loopback port, in this process), serving a model directory or a random-weight model of a named
shape. The same N requests (completions at the cursor from a real project, or rewrites with a
Predicted Outputs ``prediction``) are sent one at a time, then by 2, 4, 8... concurrent clients,
each client closed-loop over its share. Per level: aggregate completion tokens per second, request
latency p50 / p95, the mean batch the scheduler ran, and whether every output is token-identical to
the one-at-a-time run (greedy). Every request keys its own prompt cache, so each level prefills
every prompt, as the one-at-a-time run does.

    python -m bench.concurrency --model-shape qwen2.5-coder-0.5b --kind completion --requests 8 \\
        --concurrency 1 2 4 8 --json /tmp/concurrency.json --plot /tmp/concurrency.svg
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import time
from pathlib import Path

TOKEN = "bench-concurrency"
WORKLOADS = Path(__file__).resolve().parents[2] / "shared" / "workloads"


def completion_bodies(
    path: Path, count: int, chars: int, max_tokens: int, proposer: str | None, fim: bool = True
) -> list[dict]:
    """``count`` requests from a completions workload, spread over its records: fill-in-the-middle
    over ``chars`` characters around the cursor (three quarters before it), or (``fim`` False) the
    ``chars`` characters before the cursor as a plain continuation prompt (OpenAI's completions
    without ``suffix``: no line or repetition stops, so each runs to ``max_tokens``)."""
    from bench.sim_workload import read_jsonl

    before = chars * 3 // 4 if fim else chars
    records = [r for r in read_jsonl(path) if len(r["prefix"]) >= before]
    step = max(1, len(records) // count)
    bodies = []
    for record in records[::step][:count]:
        body = {"model": "codespec", "prompt": record["prefix"][-before:], "max_tokens": max_tokens, "temperature": 0}
        if fim:
            body["suffix"] = record["suffix"][: chars // 4]
        if proposer:
            body["proposer"] = proposer
        bodies.append(body)
    return bodies


def chat_bodies(path: Path, count: int, chars: int, max_tokens: int) -> list[dict]:
    """``count`` chat requests, each the ``chars`` characters before a completion workload's cursor
    in a fenced block of the user's message, without a prediction (a model without a chat template
    rewrites the block, drafting from it): no completion stop rules, each decodes up to ``max_tokens``."""
    bodies = completion_bodies(path, count, chars, max_tokens, None, fim=False)
    return [
        {
            "model": "codespec",
            "messages": [{"role": "user", "content": f"```python\n{body['prompt']}\n```"}],
            "max_tokens": max_tokens,
        }
        for body in bodies
    ]


def edit_cases(path: Path, count: int, chars: int) -> list:
    """``count`` rewrites of an edits workload (``bench.workload.BenchCase``), regions of at most
    ``chars`` characters, every third record."""
    from bench.workload import load_cases

    return [case for case in load_cases(path, max_chars=chars, stride=3) if case.kind == "edit"][:count]


def edit_bodies(path: Path, count: int, chars: int, max_tokens: int, proposer: str | None) -> list[dict]:
    """``count`` rewrites with the region as the prediction (bench.http's requests)."""
    from bench.http import chat_body

    return [chat_body(case, True, proposer, False, max_tokens, "") for case in edit_cases(path, count, chars)]


def run_level(client, bodies: list[dict], clients: int, level: str) -> dict:
    """Send every body, ``clients`` at a time (each client closed-loop over its share); returns the
    level's texts, latencies, tokens and wall time."""
    from codespec.core.stats import percentile

    def send(index: int) -> tuple[int, str, float, int]:
        body = dict(bodies[index])
        extra = {key: body.pop(key) for key in ("proposer", "path", "suffix", "prediction") if key in body}
        extra["path"] = f"bench/{level}/{index}"  # a prompt cache of its own: every level prefills every prompt
        start = time.perf_counter()
        if "prompt" in body:
            response = client.completions.create(**body, extra_body=extra)
            text = response.choices[0].text
        else:
            response = client.chat.completions.create(**body, extra_body=extra)
            text = response.choices[0].message.content or ""
        return index, text, time.perf_counter() - start, response.usage.completion_tokens

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = sorted(pool.map(send, range(len(bodies))))
    wall = time.perf_counter() - start
    latencies = [latency for _, _, latency, _ in results]
    tokens = sum(count for *_, count in results)
    return {
        "clients": clients,
        "texts": [text for _, text, _, _ in results],
        "wall_s": round(wall, 3),
        "tokens": tokens,
        "tokens_per_s": round(tokens / wall, 2),
        "latency_p50_s": round(percentile(latencies, 50), 3),
        "latency_p95_s": round(percentile(latencies, 95), 3),
    }


def run(args) -> dict:
    from openai import OpenAI

    from codespec.http_api import start_http_server
    from codespec.service.doors.auth import Listen
    from codespec.service.engine.runtime import LoopThread
    from codespec.service.engine.service import EngineService
    from codespec.service.requests.options import EngineOptions, ServerOptions

    target, description = load_target(args)
    levels = sorted(set(args.concurrency))
    service = EngineService(target, args.proposer, args.max_draft, max_batch=max(args.max_batch or max(levels), 1))
    service.warm_up()
    options = ServerOptions(engine=EngineOptions(model=description))
    loop = LoopThread("bench-concurrency")
    server = loop.run(start_http_server(service, Listen(TOKEN), options))
    default = "edits-httpx.jsonl" if args.kind == "edit" else "completions-httpx.jsonl"
    workload = Path(args.workload) if args.workload else WORKLOADS / default
    if args.kind == "completion":
        bodies = completion_bodies(
            workload, args.requests, args.chars, args.max_tokens, None, fim=not args.plain_prompt
        )
    elif args.kind == "chat":
        bodies = chat_bodies(workload, args.requests, args.chars, args.max_tokens)
    else:
        bodies = edit_bodies(workload, args.requests, args.chars, args.max_tokens, None)
    report: dict = {
        "model": description,
        "kind": args.kind + (" (plain prompt)" if args.kind == "completion" and args.plain_prompt else ""),
        "workload": workload.name,
        "requests": len(bodies),
        "max_tokens": args.max_tokens,
        "proposer": args.proposer,
        "threads": args.threads,
        "levels": [],
    }
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=TOKEN, timeout=3600, max_retries=0)
        alone: dict = {}  # the one-client level of this round (measured first)
        for round_number in range(args.rounds):
            for clients in [1, *[level for level in levels if level != 1]]:
                # each level a first sight of its requests: the session's earlier outputs (the level
                # before's answers to the same bodies) would otherwise draft them whole
                service.clear_history().result()
                before = service.snapshot()["batching"]
                level = run_level(client, bodies, clients, f"{round_number}-{clients}")
                snapshot = service.snapshot()
                after = snapshot["batching"]
                mine = snapshot["last_requests"][-len(bodies) :]
                forwards = sum(entry["target_forwards"] for entry in mine)
                level["tokens_per_forward"] = round(sum(e["tokens"] for e in mine) / forwards, 2) if forwards else 0.0
                cycles = after["cycles"] - before["cycles"]
                served = after["mean_batch"] * after["cycles"] - before["mean_batch"] * before["cycles"]
                level["mean_batch"] = round(served / cycles, 2) if cycles else 0.0
                level["round"] = round_number
                if clients == 1:
                    alone = level
                level["identical_to_one_at_a_time"] = level["texts"] == alone["texts"]
                level["identical_requests"] = sum(a == b for a, b in zip(level["texts"], alone["texts"], strict=True))
                level["speedup"] = round(level["tokens_per_s"] / alone["tokens_per_s"], 3)
                level["p95_vs_one_at_a_time"] = round(level["latency_p95_s"] / alone["latency_p95_s"], 3)
                print(
                    f"bench: {args.kind} x{clients} (round {round_number + 1}): {level['tokens_per_s']} tokens/s "
                    f"({level['speedup']}x one at a time), p50 {level['latency_p50_s']} s, p95 "
                    f"{level['latency_p95_s']} s, mean batch {level['mean_batch']}, tokens/forward "
                    f"{level['tokens_per_forward']}, identical="
                    f"{level['identical_to_one_at_a_time']}",
                    file=sys.stderr,
                    flush=True,
                )
                level["rss_mb"] = resident_mb()
                level["peak_rss_mb"] = resident_mb("VmHWM")
                report["levels"].append({key: value for key, value in level.items() if key != "texts"})
        if args.beside_rewrite:
            report["beside_rewrite"] = beside_rewrite(
                client, bodies, workload, target.max_context, lambda: service.clear_history().result()
            )
    finally:
        loop.run(server.stop())
        loop.stop()
        service.close()
    return report


def resident_mb(field: str = "VmRSS") -> float:
    """This process's resident memory now (Linux), in MiB; ``VmHWM``: its peak so far."""
    import os

    from bench.soak_values import memory_mb

    return round(memory_mb(os.getpid()).get(field, 0.0), 1)


def beside_rewrite(client, bodies: list[dict], workload: Path, max_context: int, clear_history) -> dict:
    """The requests one at a time, idle and then while another client streams long rewrites
    (edits-httpx's regions with their prediction, up to 6,000 characters and within the model's
    context, back to back): a user's completion beside a teammate's rewrite. A rewrite that fails
    fails the measurement (a completion beside nothing is not one beside a rewrite). Each phase
    starts with the session's history cleared (``clear_history``): the idle phase's answers would
    draft the busy phase's same requests."""
    import threading

    from codespec.core.stats import percentile

    # more edits than a phase gets through: a rewrite sent again would draft from its own answer
    edits = edit_bodies(workload.with_name("edits-httpx.jsonl"), 12, min(6000, max_context), 1024, None)
    stop = threading.Event()
    rewrites = [0]
    failed: list[Exception] = []

    def rewrite_loop() -> None:
        number = 0
        while not stop.is_set():
            body = dict(edits[number % len(edits)])
            body.pop("stream", None)
            extra = {key: body.pop(key) for key in ("prediction", "path") if key in body}
            extra["path"] = f"bench/beside/rewrite/{number}"
            try:
                stream = client.chat.completions.create(**body, extra_body=extra, stream=True)
                for _ in stream:
                    if stop.is_set():
                        stream.close()  # the client goes: the server cancels the rewrite
                        break
            except Exception as error:  # reported by the measuring thread
                failed.append(error)
                return
            rewrites[0] += 1
            number += 1

    def latencies(level: str) -> list[float]:
        clear_history()
        return [run_level(client, [body], 1, f"{level}-{i}")["latency_p50_s"] for i, body in enumerate(bodies)]

    idle = latencies("beside-idle")
    worker = threading.Thread(target=rewrite_loop, daemon=True)
    worker.start()
    time.sleep(2.0)  # the rewrite is decoding
    busy = latencies("beside-busy")
    stop.set()
    worker.join(600)
    if failed:
        raise RuntimeError(f"the rewrite beside the completions failed: {failed[0]}") from failed[0]
    result = {
        "idle_p50_s": round(percentile(idle, 50), 3),
        "idle_p95_s": round(percentile(idle, 95), 3),
        "beside_p50_s": round(percentile(busy, 50), 3),
        "beside_p95_s": round(percentile(busy, 95), 3),
        "rewrites": rewrites[0],
    }
    result["p95_ratio"] = round(result["beside_p95_s"] / result["idle_p95_s"], 3)
    print(f"bench: beside a streaming rewrite: {result}", file=sys.stderr, flush=True)
    return result


def load_target(args):
    import torch

    from bench.models import bench_tokenizer, random_target, shape_description
    from codespec.core.model import TargetModel
    from codespec.service.engine.runtime import _set_cpu_threads

    _set_cpu_threads(args.threads)
    if args.model_shape:
        tokenizer, _ = bench_tokenizer()
        if args.tokenizer_vocab:  # the body of the shape with the tokenizer's vocabulary (vLLM's comparison)
            from bench.shapes import random_published

            dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
            model = random_published(
                args.model_shape, 0, tokenizer.eos_token_id, dtype=dtype, vocab_size=len(tokenizer)
            )
            target = TargetModel(model, tokenizer, name=f"random-{args.model_shape}")
            description = f"random-weight {args.model_shape} body, vocabulary {len(tokenizer):,} (the tokenizer's)"
        else:
            target = random_target(args.model_shape, tokenizer, dtype=args.dtype)
            description = shape_description(args.model_shape)
        silence_markers(target)
        return target, f"{description}, end markers never chosen, {args.dtype}"
    from codespec.core.default_model import target_path

    path = args.model or str(target_path())
    return TargetModel.load(path, device="cpu"), path


def silence_markers(target) -> None:
    """Zero the LM-head rows of the special tokens and of the ids past the tokenizer: a random
    model then never picks an end marker (its other logits are both signs, so a zero never wins),
    and every request decodes its whole budget, as the measurement needs. With a tied head this
    zeroes those tokens' embeddings too; prompts never hold them."""
    import torch

    tokenizer = target.tokenizer
    rows = set(tokenizer.all_special_ids) | {int(i) for i in tokenizer.get_added_vocab().values()}
    rows |= set(range(len(tokenizer), target.vocab_size))
    head = target.model.get_output_embeddings().weight
    with torch.no_grad():
        head[sorted(rows)] = 0.0  # a packed head packs again on its next forward (codespec/linear.py)


def table(report: dict) -> str:
    rows = [
        "| clients | round | tokens/s | x one at a time | latency p50 / p95 (s) | p95 / one-at-a-time p95 "
        "| mean batch | tokens/forward | identical to one at a time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for level in report["levels"]:
        rows.append(
            f"| {level['clients']} | {level['round'] + 1} | {level['tokens_per_s']} | {level['speedup']}x | "
            f"{level['latency_p50_s']} / {level['latency_p95_s']} | {level['p95_vs_one_at_a_time']} | "
            f"{level['mean_batch']} | {level['tokens_per_forward']} | "
            f"{level['identical_requests']}/{report['requests']} |"
        )
    return "\n".join(rows)


def plot_svg(reports: list[dict], path: Path) -> None:
    """Aggregate tokens/s against concurrent clients, one line per report (kind, proposer)."""
    width, height, margin = 560, 320, 50
    series = []
    for report in reports:
        last = {}
        for level in report["levels"]:
            last[level["clients"]] = level["tokens_per_s"]
        series.append((f"{report['kind']} ({report['proposer']})", sorted(last.items())))
    top = max(value for _, points in series for _, value in points) * 1.1
    most = max(clients for _, points in series for clients, _ in points)
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]

    def x(clients: int) -> float:
        return margin + (width - 2 * margin) * (clients - 1) / max(most - 1, 1)

    def y(value: float) -> float:
        return height - margin - (height - 2 * margin) * value / top

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
        f'<line x1="{margin}" y1="{height - margin}" x2="{width - margin}" y2="{height - margin}" stroke="black"/>',
        f'<line x1="{margin}" y1="{margin}" x2="{margin}" y2="{height - margin}" stroke="black"/>',
        f'<text x="{width / 2}" y="{height - 12}" text-anchor="middle">concurrent clients</text>',
        f'<text x="14" y="{height / 2}" transform="rotate(-90 14 {height / 2})" text-anchor="middle">tokens/s (all clients)</text>',
    ]
    for clients in sorted({c for _, points in series for c, _ in points}):
        parts.append(f'<text x="{x(clients)}" y="{height - margin + 16}" text-anchor="middle">{clients}</text>')
    for tick in range(5):
        value = top * tick / 4
        parts.append(f'<text x="{margin - 6}" y="{y(value) + 4}" text-anchor="end">{value:.0f}</text>')
    for number, (name, points) in enumerate(series):
        colour = colours[number % len(colours)]
        line = " ".join(f"{x(c):.1f},{y(v):.1f}" for c, v in points)
        parts.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"/>')
        parts.append(f'<text x="{margin + 10}" y="{margin + 16 * number}" fill="{colour}">{name}</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.concurrency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a model directory (default: the shipped model)")
    parser.add_argument("--model-shape", help="a random-weight model of this shape (bench/shapes.py)")
    parser.add_argument("--kind", choices=("completion", "chat", "edit"), default="completion")
    parser.add_argument("--workload", help="a workload file (default: ../shared/workloads/<kind>s-httpx.jsonl)")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument(
        "--tokenizer-vocab",
        action="store_true",
        help="with --model-shape: the tokenizer's vocabulary, not the published one",
    )
    parser.add_argument(
        "--plain-prompt", action="store_true", help="completions as plain continuations of the code before the cursor"
    )
    parser.add_argument("--chars", type=int, default=1500, help="characters of code per request")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--rounds", type=int, default=1, help="repeat every level this many times")
    parser.add_argument(
        "--beside-rewrite", action="store_true", help="then each request alone, idle and beside a streaming rewrite"
    )
    parser.add_argument("--proposer", default="auto")
    parser.add_argument("--max-draft", type=int, default=16)
    parser.add_argument("--max-batch", type=int, help="the service's max_batch (default: the largest level)")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="with --model-shape")
    parser.add_argument("--json", help="write the report here")
    parser.add_argument(
        "--plot", help="write an SVG plot of tokens/s against clients here (with --json of earlier runs: --merge)"
    )
    parser.add_argument("--merge", nargs="*", default=[], help="earlier reports (JSON) to plot beside this one")
    args = parser.parse_args(argv)
    report = run(args)
    print(table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if args.plot:
        earlier = [json.loads(Path(path).read_text(encoding="utf-8")) for path in args.merge]
        plot_svg([*earlier, report], Path(args.plot))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
