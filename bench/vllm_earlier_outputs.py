"""What drafting from earlier outputs is worth: vLLM's ``suffix`` method with and without its tree of
earlier responses, against codespec's context lookup with and without the session's earlier
outputs (``proposers.outputs``), decoded as one client would with no model in the loop.

    PYTHONPATH=ARCTIC_DIR <vLLM's python> -m bench.vllm_earlier_outputs [--workload completions] [--out REPORT]

The shipped model writes each greedy output once; the requests then run in order, one at a time,
and each drafter drafts up to K tokens at every step: a step emits the accepted drafts and one
token more, so the steps are the forwards a drafter needs (a request's prefill not counted). Each
drafter keeps earlier outputs as it would in a server: ``suffix`` adds each response to its global
tree as it is generated, codespec's store takes an output when its request ends. "Fixed" drafters
draft every match at full length: this compares what the lookups find, not how long a policy
drafts (``bench.vllm_replay`` runs auto, priced).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.vllm_draft_quality import workload_outputs, write_report
from bench.vllm_replay import accept
from bench.vllm_spec import WORKLOADS_BY_NAME
from bench.vllm_suffix import Drafter, suffix_caches, suffix_drafter
from codespec.core.draft import EMPTY_DRAFT, Draft, ProposeContext
from codespec.proposers.context import ContextLookup
from codespec.proposers.outputs import OutputsLookup, RecentOutputs, until_stop


def context_drafter(k: int, outputs: RecentOutputs | None) -> Drafter:
    """The context lookup; with ``outputs``, also the outputs lookup: the longer match drafts, the
    request's own text on a tie (as auto would compare them, unpriced)."""
    own, earlier = ContextLookup(), OutputsLookup(outputs) if outputs is not None else None

    def draft(sequence: list[int], prompt_len: int) -> list[int]:
        context = ProposeContext(sequence, prompt_len, k)
        best = chosen(own.propose(context), earlier.propose(context) if earlier is not None else EMPTY_DRAFT)
        return list(best.token_ids) if best is not None else []

    return draft


def chosen(own: Draft, theirs: Draft) -> Draft | None:
    """The longer match's draft, the request's own text on a tie (as auto compares them unpriced)."""
    best = own if len(own) and own.match is not None else None
    best_len = best.match.match_len if best is not None and best.match is not None else 0
    if len(theirs) and theirs.match is not None and theirs.match.match_len > best_len:
        best = theirs
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=WORKLOADS_BY_NAME, default="completions")
    parser.add_argument("--requests", type=int, default=192)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument(
        "--out", type=Path, default=None, help="default: docs/bench/vllm-earlier-outputs-<workload>.json"
    )
    args = parser.parse_args()
    tokenizer, prompts, outputs = workload_outputs(args.workload, args.requests)
    caches = suffix_caches()
    store = RecentOutputs()
    special = set(tokenizer.all_special_ids)  # an output ends at one (the drafter keeps what comes before)
    names = [*caches, "context lookup", "context lookup + earlier outputs"]
    counts = {name: [0, 0, 0] for name in names}  # steps, drafted, accepted
    for request, (prompt, output) in enumerate(zip(prompts, outputs)):
        if len(output) < 2:
            continue
        drafters = {name: suffix_drafter(cache, request, prompt, output[0], args.k) for name, cache in caches.items()}
        drafters["context lookup"] = context_drafter(args.k, None)
        drafters["context lookup + earlier outputs"] = context_drafter(args.k, store)
        seen = {}  # what each drafter was shown of the output: the tokens of a request's last step never are
        for name, drafter in drafters.items():
            done = 1  # the prefill's step sampled the first token
            while done < len(output):
                seen[name] = done
                draft = drafter(prompt + output[:done], len(prompt))[: len(output) - done - 1]  # none past the end
                hits = accept(draft, output[done:]) if draft else 0
                counts[name][0] += 1
                counts[name][1] += len(draft)
                counts[name][2] += hits
                done += hits + 1
        for cache in caches.values():
            cache.stop_request(request)
        kept = output[: seen.get("context lookup + earlier outputs", 0)]
        store.add(until_stop(kept, special))
    rows = [
        {"drafter": name, "steps": steps, "drafted": drafted, "accepted": accepted,
         "accepted_per_drafted": round(accepted / max(1, drafted), 3)}
        for name, (steps, drafted, accepted) in counts.items()
    ]  # fmt: skip
    tokens = sum(len(output) for output in outputs)
    write_report(args, "vllm-earlier-outputs", rows, requests=len(prompts), tokens=tokens)


if __name__ == "__main__":
    main()
