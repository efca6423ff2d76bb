"""Engine measurements for docs/benchmarks.md (issue: engine overhead and context-lookup speedup).

1. Engine overhead per cycle outside model forwards: wall time of each decode step minus the time
   spent inside the target's forward (what the loop itself costs: drafting bookkeeping,
   verification, rollback, detokenisation, stats).
2. `context` vs `none` on a prompt with heavy repetition, on a ~30M-parameter random Llama:
   tokens/s ratio and tokens per target forward, runs interleaved so machine drift cancels out.

Usage: python bench/micro.py [--repeats 5] [--max-new-tokens 128] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sysconfig
import tempfile
import time
from pathlib import Path

import torch

from bench.shapes import save_random_model
from codespec.core.config import GenerationLimits, SamplingParams
from codespec.core.decode import generate_all
from codespec.core.draft import NoDraft
from codespec.core.model import TargetModel
from codespec.core.target import forward_each
from codespec.proposers.context import ContextLookup

STDLIB = Path(sysconfig.get_paths()["stdlib"])


class TimedTarget:
    """Delegates to a TargetModel and adds up the time spent inside its forward."""

    def __init__(self, target: TargetModel) -> None:
        self._target = target
        self.forward_s: list[float] = []

    def __getattr__(self, name):
        return getattr(self._target, name)

    def forward(self, input_ids, cache, keep_last=1):
        start = time.perf_counter()
        logits = self._target.forward(input_ids, cache, keep_last)
        self.forward_s.append(time.perf_counter() - start)
        return logits

    def forward_many(self, inputs, caches, keep_last):
        return forward_each(self, inputs, caches, keep_last)  # each through ``forward``: timed


def repetitive_prompt() -> str:
    source = (STDLIB / "textwrap.py").read_text(encoding="utf-8")
    block = source[source.index("def dedent") :][:1200]
    return block + "\n\n# the same function again\n" + block[:300]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--draft-len", type=int, default=16)
    parser.add_argument("--shape", default="30m")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    corpus = [(STDLIB / name).read_text(encoding="utf-8") for name in ("textwrap.py", "shlex.py", "json/decoder.py")]
    with tempfile.TemporaryDirectory() as directory:
        save_random_model(directory, corpus, shape=args.shape, vocab_size=4096, seed=0, init_std=0.02)
        target = TargetModel.load(directory, device="cpu")
    params = sum(p.numel() for p in target.model.parameters())
    timed = TimedTarget(target)
    prompt = target.encode(repetitive_prompt())
    limits = GenerationLimits(max_new_tokens=args.max_new_tokens, max_draft_len=args.draft_len)
    results: dict[str, dict[str, list[float]]] = {"none": {}, "context": {}}
    generate_all(target, prompt, NoDraft(), SamplingParams(), limits)  # warm-up
    outputs = {}
    for _ in range(args.repeats):
        for name in ("none", "context"):  # interleaved, request by request
            proposer = NoDraft() if name == "none" else ContextLookup(max_ngram=8, min_ngram=2)
            timed.forward_s.clear()
            finished = generate_all(timed, prompt, proposer, SamplingParams(), limits)
            summary = finished.stats.summary()
            ends = [step.end_s for step in finished.stats.steps]
            # Whole cycle (end of the previous step to end of this one) minus the model's forward.
            overhead_ms = [(ends[i] - ends[i - 1] - timed.forward_s[i]) * 1e3 for i in range(1, len(ends))]
            for key, value in (
                ("tokens_per_s", summary["tokens_per_s"]),
                ("tokens_per_forward", summary["tokens_per_forward"]),
                ("overhead_ms_p50", statistics.median(overhead_ms)),
            ):
                results[name].setdefault(key, []).append(value)
            outputs[name] = finished.token_ids
    report = {
        "model": f"random Llama '{args.shape}' ({params / 1e6:.1f}M parameters, vocab {target.vocab_size}), CPU fp32, "
        f"{torch.get_num_threads()} threads",
        "prompt_tokens": len(prompt),
        "max_new_tokens": args.max_new_tokens,
        "draft_len": args.draft_len,
        "repeats": args.repeats,
        "identical_output": outputs["none"] == outputs["context"],
        "median": {
            name: {key: statistics.median(values) for key, values in metrics.items()}
            for name, metrics in results.items()
        },
    }
    report["speedup_context_over_none"] = (
        report["median"]["context"]["tokens_per_s"] / report["median"]["none"]["tokens_per_s"]
    )
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
