"""`codespec bench`: measure codespec's configurations against plain decoding and transformers'
speculative modes, side by side in one run (design.md §3; issue 6).

Heavy imports (torch, transformers) happen in ``run`` so `codespec --help` stays fast.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.shapes import SHAPE_NAMES
from codespec.core.config import SERVE_MAX_DRAFT
from codespec.core.errors import CodespecError

DEFAULT_CONFIGS = "greedy,context,reference,index,auto,hf-greedy,hf-pld"

# Profiles fill in what the command line left unset.
PROFILES: dict[str, dict[str, Any]] = {
    # <= 10 minutes on a 2-core CPU: a spread-out subsample, edits windowed around their change
    # (a spread-out subsample of about 2,400 output tokens per workload: a few long edits or many
    # short completions), long records windowed around their change, one torch thread (stable on a
    # shared CPU)
    "quick": {
        "max_requests": 24,
        "stride": 7,
        "max_chars": 3200,
        "token_budget": 2400,
        "max_new_tokens": [400],
        "draft_len": [32, 16],
        "sweep_requests": 2,
        "concurrency": [],
        "load_requests": 4,
        "threads": 1,
    },
    # a real code model's shape on a CPU (qwen2.5-coder-0.5b: 494M parameters, 151,936-row LM head;
    # ~75 ms a plain forward on one core of this machine class): a few requests, one torch thread
    # (the quick profile's windows and lengths, half its sample: ~20 minutes per workload on a shared
    # 2-core machine, most of it greedy and hf-greedy)
    "cpu-real": {
        "model_shape": "qwen2.5-coder-0.5b",
        "max_requests": 8,
        "stride": 7,
        "max_chars": 3200,
        "token_budget": 1200,
        "max_new_tokens": [400],
        "draft_len": [32],
        "sweep_requests": 2,
        "concurrency": [],
        "load_requests": 4,
        "threads": 1,
    },
    # larger shapes and full lengths on CUDA
    "gpu": {
        "max_requests": 60,
        "stride": 1,
        "max_chars": None,
        "token_budget": None,
        "max_new_tokens": [1024],
        "draft_len": [32, 8, 64],
        "sweep_requests": 16,
        "concurrency": [1, 2, 4, 8],
        "load_requests": 32,
        "model_shape": "1b",
    },
}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark configurations side by side (codespec proposers vs transformers)",
        description="Run every configuration on the same requests, interleaved request by request, and report "
        "the metrics of design.md §3 (speedup = tokens/s over codespec greedy in the same run).",
    )
    parser.add_argument(
        "--workload",
        type=Path,
        nargs="+",
        action="extend",
        required=True,
        help="JSONL of edit or completion records (repeatable)",
    )
    parser.add_argument("--workspace", type=Path, help="JSONL of {path, text} files to index (completions)")
    parser.add_argument(
        "--mode",
        choices=("real", "replay"),
        default="replay",
        help="real: the model chooses; replay: the recorded output is forced by a logit bias",
    )
    parser.add_argument(
        "--configs",
        default=DEFAULT_CONFIGS,
        help=f"comma-separated configurations (default {DEFAULT_CONFIGS}); also draft, early-exit, "
        f"hf-assisted, hf-early-exit",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", help="model directory or cached hub id (default: the shipped model)")
    source.add_argument(
        "--model-shape",
        choices=SHAPE_NAMES,
        help="a random-weight model of this shape (valid for replay timing): a Llama of the "
        "project's sizes, or a published configuration (qwen2.5-coder-0.5b, ...)",
    )
    parser.add_argument(
        "--draft",
        help="draft model directory, or a shape name for a random draft "
        "(default with the shipped model: the shipped draft)",
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-requests", type=int, help="requests per workload")
    parser.add_argument("--stride", type=int, help="take every N-th record (a spread-out subsample)")
    parser.add_argument("--max-chars", type=int, help="window long records to about this many characters")
    parser.add_argument(
        "--token-budget",
        type=int,
        help="per workload, stop adding requests once their estimated output tokens reach this",
    )
    parser.add_argument("--max-new-tokens", type=int, nargs="+", help="output budget; more values: a sweep")
    parser.add_argument(
        "--draft-len", type=int, nargs="+", help="K, most draft tokens per forward; more values: a sweep"
    )
    parser.add_argument("--temperature", type=float, nargs="+", help="0 = greedy; more values: a sweep")
    parser.add_argument("--top-p", type=float, nargs="+", help="more values: a sweep")
    parser.add_argument("--context-chars", type=int, nargs="+", help="sweep over the prompt window (characters)")
    parser.add_argument("--sweep-requests", type=int, help="requests per workload at each sweep point")
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        help="offered load: N concurrent websocket clients against an in-process server",
    )
    parser.add_argument(
        "--load-requests",
        type=int,
        help="requests per concurrency level (at least the level's clients; at most the distinct messages unless the clients outnumber them)",
    )
    parser.add_argument(
        "--slo-ttft-ms",
        type=float,
        default=500.0,
        help="p95 time-to-first-token objective for the concurrency report (default 500 ms)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="torch CPU threads (default: torch's; the quick profile uses 1, "
        "which keeps timings stable on a shared CPU)",
    )
    parser.add_argument(
        "--peer-kernels",
        choices=("stock", "codespec"),
        default="stock",
        help="kernels of the transformers configurations: stock (transformers' sdpa and PyTorch's "
        "linear, as users run it; default) or codespec (its attention and packed linears)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the results as JSON")
    parser.add_argument("--report", type=Path, help="write a markdown report")
    parser.add_argument(
        "--plots", type=Path, help="write PNG plots here (needs matplotlib: pip install codespec[bench])"
    )
    parser.add_argument("--profile", choices=tuple(PROFILES), help="preset lengths and sample sizes")
    parser.set_defaults(run=run)


def plan_from_args(args):
    """Command line + profile -> BenchPlan (explicit flags win over the profile)."""
    from bench.suite import BenchPlan

    preset = dict(PROFILES.get(args.profile, {})) if args.profile else {}
    if preset.get("model_shape") and (args.model or args.model_shape):
        preset.pop("model_shape")

    def pick(name, default):
        value = getattr(args, name, None)
        return value if value is not None else preset.get(name, default)

    plan = BenchPlan(
        workloads=list(args.workload),
        workspace=args.workspace,
        mode=args.mode,
        configs=[name.strip() for name in args.configs.split(",") if name.strip()],
        model=args.model,
        model_shape=args.model_shape or preset.get("model_shape"),
        draft=args.draft,
        device=args.device,
        dtype=args.dtype,
        max_requests=pick("max_requests", None),
        stride=pick("stride", 1),
        max_chars=pick("max_chars", None),
        token_budget=pick("token_budget", None),
        max_new_tokens=pick("max_new_tokens", [128]),
        draft_len=pick("draft_len", [SERVE_MAX_DRAFT]),
        temperature=pick("temperature", [0.0]),
        top_p=pick("top_p", [1.0]),
        context_chars=pick("context_chars", []),
        sweep_requests=pick("sweep_requests", None),
        concurrency=pick("concurrency", []),
        load_requests=pick("load_requests", 8),
        slo_ttft_ms=args.slo_ttft_ms,
        seed=args.seed,
        profile=args.profile,
        threads=pick("threads", None),
        peer_kernels=getattr(args, "peer_kernels", "stock"),
    )
    _validate(plan)
    return plan


def _validate(plan) -> None:
    for name, values, low in (
        ("--max-new-tokens", plan.max_new_tokens, 1),
        ("--draft-len", plan.draft_len, 0),
        ("--concurrency", plan.concurrency, 1),
        ("--context-chars", plan.context_chars, 1),
    ):
        bad = [v for v in values if v < low]
        if bad:
            raise CodespecError(f"{name} values must be >= {low}, got {bad}")
    if any(t < 0 for t in plan.temperature):
        raise CodespecError(f"--temperature must be >= 0, got {plan.temperature}")
    if any(not 0 < p <= 1 for p in plan.top_p):
        raise CodespecError(f"--top-p must be in (0, 1], got {plan.top_p}")
    if plan.max_requests is not None and plan.max_requests < 1:
        raise CodespecError(f"--max-requests must be >= 1, got {plan.max_requests}")
    for path in [*plan.workloads, *([plan.workspace] if plan.workspace else [])]:
        if not path.is_file():
            raise CodespecError(f"{path} does not exist")


def run(args) -> int:
    import logging

    from bench.report import markdown, table_text, write_plots
    from bench.suite import run_plan

    logging.getLogger("transformers").setLevel(logging.ERROR)
    plan = plan_from_args(args)
    report = run_plan(plan, say=lambda line: print(line, file=sys.stderr, flush=True))
    report["setup"]["command"] = " ".join(["codespec", *sys.argv[1:]])
    print(table_text(report))
    plots_note = None
    if args.plots:
        plots_note = write_plots(report, args.plots)
        print(plots_note, file=sys.stderr)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(
            markdown(report, command=report["setup"]["command"], plots_note=plots_note), encoding="utf-8"
        )
    return 0
