"""Whether a lookup's match predicts its draft by whether the match's earlier occurrence continued
the same way: the confidence ``suffix`` reads from its trees' counts and codespec's lookups, which
keep each n-gram's latest occurrence only, do not have.

    python -m bench.vllm_match_agreement [--workload completions] [--requests 192] [--out REPORT]

The context lookup and the outputs lookup (the longer match drafts, the request's own text on a
tie; as ``bench.vllm_earlier_outputs``), teacher-forced over each greedy output with no model and
no policy: every match drafts up to K tokens. Each draft's match is classed by the occurrence of
its n-gram before the one it copies: none (``once``), one followed by the same token (``agree``)
or by another (``differ``); per class and match length, how often the first token was right and
how many tokens were accepted.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from bench.vllm_draft_quality import workload_outputs
from bench.vllm_earlier_outputs import chosen
from bench.vllm_replay import accept
from bench.vllm_spec import ROOT, WORKLOADS_BY_NAME
from codespec.core.draft import ProposeContext
from codespec.proposers.context import ContextLookup
from codespec.proposers.outputs import OutputsLookup, RecentOutputs, until_stop
from codespec.proposers.policy import bucket


def match_class(tokens: Sequence[int], end: int, n: int, first: int) -> str:
    """``once``, ``agree`` or ``differ``: whether the n tokens before ``end`` occurred before
    (ending earlier), and whether the latest such occurrence was followed by ``first``."""
    pattern = list(tokens[end - n : end])
    for earlier in range(end - 1, n - 1, -1):
        if list(tokens[earlier - n : earlier]) == pattern:
            return "agree" if tokens[earlier] == first else "differ"
    return "once"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=WORKLOADS_BY_NAME, default="completions")
    parser.add_argument("--requests", type=int, default=192)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument(
        "--out", type=Path, default=None, help="default: docs/bench/vllm-match-agreement-<workload>.json"
    )
    args = parser.parse_args()
    tokenizer, prompts, outputs = workload_outputs(args.workload, args.requests)
    special = set(tokenizer.all_special_ids)
    store = RecentOutputs()
    counts: dict[tuple[str, str], list[int]] = defaultdict(
        lambda: [0, 0, 0, 0]
    )  # drafts, first right, accepted, drafted
    for prompt, output in zip(prompts, outputs):
        own, earlier = ContextLookup(), OutputsLookup(store)
        done = 1  # the prefill's step sampled the first token
        while done < len(output):
            sequence = prompt + output[:done]
            context = ProposeContext(sequence, len(prompt), args.k)
            best = chosen(own.propose(context), earlier.propose(context))
            draft = list(best.token_ids)[: len(output) - done - 1] if best is not None else []
            if best is None or best.match is None or not draft:
                done += 1
                continue
            source = sequence if best.proposer == own.name else store._table.tokens
            n = best.match.match_len
            key = (bucket(n), match_class(source, best.match.position, n, draft[0]))
            hits = accept(draft, output[done:])
            row = counts[key]
            row[0] += 1
            row[1] += draft[0] == output[done]
            row[2] += hits
            row[3] += len(draft)
            done += hits + 1
        store.add(until_stop(output, special))
    rows = [
        {
            "match_length": length,
            "earlier_occurrence": kind,
            "drafts": drafts,
            "first_token_right": round(right / drafts, 3),
            "accepted_per_draft": round(accepted / drafts, 2),
            "accepted_per_drafted": round(accepted / max(1, drafted), 3),
            "drafted": drafted,
            "accepted": accepted,
        }
        for (length, kind), (drafts, right, accepted, drafted) in sorted(counts.items())
    ]
    for entry in rows:
        print(json.dumps(entry))
    report = {"workload": args.workload, "requests": args.requests, "k": args.k, "rows": rows}
    out = args.out or ROOT / "docs" / "bench" / f"vllm-match-agreement-{args.workload}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(out)


if __name__ == "__main__":
    main()
