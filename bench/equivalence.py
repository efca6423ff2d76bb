"""Greedy equivalence at a model shape and dtype, with the logit gap at every mismatch.

    python -m bench.equivalence [--shape qwen2.5-coder-1.5b] [--device cuda] [--dtype float32 bfloat16]
                                [--prompts 4] [--prompt-len 256] [--max-new-tokens 48] [--draft-lens 4 16]
                                [--json OUT.json]

For each dtype: a random-weight model of the shape, plain greedy decoding of each prompt (random ids
of the tokenizer's range), then speculative decoding of the same prompts with drafts that are
always right (every forward verifies K + 1 positions and accepts them all), right then wrong at a
random depth (rejections at every depth) and random tokens. Speculative output must equal plain
output token for token; where it does not, the report gives the position and the gap between the
two candidate tokens' logits in plain decoding's own forward (fresh prefill). A gap at the size of
the dtype's rounding (fp32 ~1e-5 relative, bf16 ~1e-2) is a numerics tie between a batched and a
one-token forward (README, "Exactness caveat"); a larger one is a bug.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from codespec.core.config import GenerationLimits, SamplingParams
from codespec.core.decode import generate_all
from codespec.core.draft import Draft, NoDraft

KINDS = ("right", "right-then-wrong", "random")


class Scripted:
    """Drafts from a script: ``script(sequence, max_len) -> ids``."""

    def __init__(self, name: str, script) -> None:
        self.name = name
        self.script = script

    def begin(self, prompt_ids):
        pass

    def propose(self, context):
        return Draft(tuple(self.script(context.token_ids, context.max_len))[: context.max_len], self.name)

    def observe(self, outcome):
        pass

    def end(self):
        pass


def scripted(kind: str, full: Sequence[int], vocab: int, seed: int) -> Scripted:
    generator = torch.Generator().manual_seed(seed)

    def right(sequence, max_len):
        return full[len(sequence) : len(sequence) + max_len]

    def right_then_wrong(sequence, max_len):
        truth = list(right(sequence, max_len))
        if truth:
            cut = int(torch.randint(len(truth), (1,), generator=generator))
            truth[cut] = (truth[cut] + 1) % vocab
        return truth

    def random(sequence, max_len):
        return torch.randint(vocab, (max_len,), generator=generator).tolist()

    return Scripted(kind, {"right": right, "right-then-wrong": right_then_wrong, "random": random}[kind])


def logit_gap(target, prefix: Sequence[int], token_a: int, token_b: int) -> tuple[float, float]:
    """(|logit(a) - logit(b)|, the row's logit spread) for the token after ``prefix`` (fresh prefill)."""
    logits = target.forward(list(prefix), target.new_cache(), keep_last=1)[0]  # [V] float32
    return abs(float(logits[token_a] - logits[token_b])), float(logits.max() - logits.min())


def check(target, prompts: Sequence[Sequence[int]], max_new: int, draft_lens: Sequence[int], seed: int = 0) -> dict:
    vocab = target.vocab_size
    limits_plain = GenerationLimits(max_new_tokens=max_new, max_draft_len=0)
    runs = 0
    mismatches: list[dict[str, Any]] = []
    forwards = {"plain": 0, "speculative": 0}
    for number, prompt in enumerate(prompts):
        plain = generate_all(target, prompt, NoDraft(), SamplingParams(), limits_plain)
        reference = plain.token_ids
        forwards["plain"] += len(plain.stats.steps)
        full = [*prompt, *reference]
        for draft_len in draft_lens:
            for kind in KINDS:
                proposer = scripted(kind, full, vocab, seed + 97 * number + draft_len)
                limits = GenerationLimits(max_new_tokens=max_new, max_draft_len=draft_len)
                got = generate_all(target, prompt, proposer, SamplingParams(), limits)
                forwards["speculative"] += len(got.stats.steps)
                runs += 1
                if tuple(got.token_ids) == tuple(reference):
                    continue
                position = next(
                    (i for i, (a, b) in enumerate(zip(got.token_ids, reference)) if a != b),
                    min(len(got.token_ids), len(reference)),
                )
                row = {"prompt": number, "kind": kind, "draft_len": draft_len, "position": position}
                if position < min(len(got.token_ids), len(reference)):
                    gap, spread = logit_gap(
                        target, [*prompt, *reference[:position]], got.token_ids[position], reference[position]
                    )
                    row.update(gap=gap, relative_gap=gap / spread if spread else None)
                mismatches.append(row)
    gaps = [float(row["gap"]) for row in mismatches if "gap" in row]
    return {
        "runs": runs,
        "identical": runs - len(mismatches),
        "identical_fraction": (runs - len(mismatches)) / runs,
        "mismatches": mismatches,
        "max_gap_at_mismatch": max(gaps) if gaps else None,
        "forwards": forwards,
    }


def main(argv: list[str] | None = None) -> int:
    from bench.models import bench_tokenizer, random_target

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen2.5-coder-1.5b")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--draft-lens", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer, _ = bench_tokenizer()
    generator = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(len(tokenizer), (args.prompt_len,), generator=generator).tolist() for _ in range(args.prompts)
    ]
    report: dict = {
        "shape": args.shape,
        "prompts": args.prompts,
        "prompt_len": args.prompt_len,
        "max_new_tokens": args.max_new_tokens,
        "draft_lens": args.draft_lens,
        "dtypes": {},
    }
    for dtype in args.dtype:
        started = time.perf_counter()
        target = random_target(args.shape, tokenizer, args.device, dtype, max_context=4096)
        with torch.inference_mode():
            result = check(target, prompts, args.max_new_tokens, args.draft_lens)
        result["device"] = str(target.device)
        result["seconds"] = round(time.perf_counter() - started, 1)
        if target.device.type == "cuda":
            result["cuda_max_allocated_mb"] = round(torch.cuda.max_memory_allocated() / 2**20)
            torch.cuda.reset_peak_memory_stats()
        report["dtypes"][dtype] = result
        print(
            f"{args.shape} {dtype} on {target.device}: {result['identical']}/{result['runs']} identical, "
            f"max logit gap at a mismatch {result['max_gap_at_mismatch']}, {result['seconds']} s",
            flush=True,
        )
        del target
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
