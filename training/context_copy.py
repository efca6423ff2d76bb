"""Context-copy phase: a short fine-tune of the target after the FIM finishing phase, so it copies
from plain context as real code models do (induction over plain text, not only inside the rewrite
template): what makes the index's and the context lookup's drafts acceptable in real completions.

It reuses the finishing loop (``training.finish.finish``) with its own seed and mixture: 30% of the
rows repeat a region without any template (``ExampleMaker.plain_copy_row``: the same function or run
of lines again, or a near-copy with an identifier renamed throughout), the rest the finishing
mixture, so FIM and the rewrite copy are kept. It starts from the exported (bf16-rounded) finish
weights, exactly what ``codespec/models/default`` holds, so it can also run alone from them
(``codespec train-default --from-shipped``) and give the weights a full run would. A probe of copy
rate + FIM validity + plain-context copy rate on held-out functions outside the evaluation set
picks the kept weights, the starting ones included.
"""

from __future__ import annotations

from dataclasses import dataclass

from training.finish import FinishConfig


@dataclass
class ContextCopyConfig(FinishConfig):
    seed: int = 1  # FinishConfig's seed offsets: rows and batches differ from the finishing phase's
    steps: int = 300
    # Runs from the shipped finish weights and what they measured: docs/training-sweep.md.
    mixture: tuple = (
        ("plain_copy", 0.30),
        ("fim_middle", 0.385),
        ("identity", 0.175),
        ("copy", 0.07),
        ("natural", 0.07),
    )
    lr: float = 6e-4
    probe_every: int = 100
