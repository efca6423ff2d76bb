"""Draft quality per position, teacher-forced: vLLM's ``suffix`` method (ArcticInference's suffix
tree, configured as ``bench.vllm_propose`` configures it) against the context lookup's rule, on
``bench.vllm_spec``'s workloads with no model in the loop and no cost model.

    PYTHONPATH=ARCTIC_DIR <vLLM's python> -m bench.vllm_draft_quality [--workload completions] [--out REPORT]

At every position of each greedy output (the requests in order: ``suffix`` keeps earlier
responses in its global tree), each drafter drafts up to K tokens from the prompt and the output
so far, and the draft is scored against what follows: drafted and accepted tokens. This separates
what a lookup finds from how long a policy drafts and what a drafter's time costs inside vLLM.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
from transformers import AutoTokenizer

from bench.vllm_replay import accept, greedy_outputs
from bench.vllm_spec import ROOT, SHIPPED, WORKLOADS_BY_NAME
from bench.vllm_suffix import MIN_PROB, SPEC_FACTOR, TREE_DEPTH, suffix_caches
from codespec.core.draft import ProposeContext
from codespec.proposers.context import ContextLookup


def workload_outputs(workload: str, requests: int) -> tuple[Any, list[list[int]], list[list[int]]]:
    """The shipped tokenizer, and each case's prompt ids and greedy output ids."""
    max_tokens = 48 if workload == "completions" else 128
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED)
    prompts = [tokenizer.encode(case.prompt) for case in WORKLOADS_BY_NAME[workload](requests, max_tokens)]
    return tokenizer, prompts, greedy_outputs(SHIPPED, prompts, max_tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=WORKLOADS_BY_NAME, default="completions")
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--out", type=Path, default=None, help="default: docs/bench/vllm-draft-quality-<workload>.json")
    args = parser.parse_args()
    _, prompts, outputs = workload_outputs(args.workload, args.requests)
    caches = suffix_caches()
    counts = {name: [0, 0] for name in [*caches, "context lookup", "context lookup, capped at its match length"]}
    positions = 0
    for request, (prompt, output) in enumerate(zip(prompts, outputs)):
        if len(output) < 2:
            continue
        for cache in caches.values():
            cache.start_request(request, np.array(prompt, dtype=np.int32))
            cache.add_active_response(request, [output[0]])
        lookup = ContextLookup()
        for done in range(1, len(output)):
            sequence, truth = prompt + output[:done], output[done:]
            drafts = {
                name: cache.speculate(
                    request, np.array(sequence[-TREE_DEPTH:], dtype=np.int32), args.k, SPEC_FACTOR, 0.0, MIN_PROB
                ).token_ids
                for name, cache in caches.items()
            }
            own = lookup.propose(ProposeContext(sequence, len(prompt), args.k))
            drafts["context lookup"] = list(own.token_ids)
            drafts["context lookup, capped at its match length"] = list(
                own.token_ids[: own.match.match_len if own.match else 0]
            )
            for name, draft in drafts.items():
                draft = draft[: len(truth) - 1]  # the output's end: as the replay, nothing drafted past it
                counts[name][0] += len(draft)
                counts[name][1] += accept(draft, truth) if draft else 0
            positions += 1
            for cache in caches.values():
                cache.add_active_response(request, [output[done]])
        for cache in caches.values():
            cache.stop_request(request)
    rows = [
        {
            "drafter": name,
            "positions": positions,
            "drafted": drafted,
            "accepted": accepted,
            "accepted_per_drafted": round(accepted / max(1, drafted), 3),
            "accepted_per_position": round(accepted / max(1, positions), 3),
        }
        for name, (drafted, accepted) in counts.items()
    ]
    write_report(args, "vllm-draft-quality", rows, requests=args.requests)


def write_report(args, name: str, rows: list[dict], **fields: Any) -> None:
    """Print the rows, and write them with the run's settings to ``--out`` (default:
    docs/bench/<name>-<workload>.json)."""
    for row in rows:
        print(json.dumps(row))
    out = args.out or ROOT / "docs" / "bench" / f"{name}-{args.workload}.json"
    suffix = {"tree_depth": TREE_DEPTH, "min_token_prob": MIN_PROB, "spec_factor": SPEC_FACTOR}
    report = {"workload": args.workload, **fields, "k": args.k, "suffix": suffix, "rows": rows}
    out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
