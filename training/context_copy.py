"""Context-copy phase: a short fine-tune of the target after the FIM finishing phase, so it copies
from plain context as real code models do (induction over plain text, not only inside the rewrite
template): what makes the index's and the context lookup's drafts acceptable in real completions.

It reuses the finishing loop (``training.finish.finish``) with its own seed and mixture: 30% of the
rows repeat a region without any template (``ExampleMaker.plain_copy_row``: the same function or run
of lines again, or a near-copy with an identifier renamed throughout), the rest the finishing
mixture, so FIM and the rewrite copy are kept. It starts from the exported (bf16-rounded) finish
weights, exactly what ``codespec/models/default`` held before this phase shipped (commit 0fb9784),
so it can also run alone from them (``codespec train-default --from-shipped --start DIR``, checked
against their digests) and give the weights a full run would.

FIM validity is what this phase loses: the copying it teaches also fires inside FIM middles, as
repetition loops (``'delete', 'delete', 'delete', ...``) that never end the line. Two things keep
it: a low constant LR (the finishing phase's final one, 1e-4: at 3e-4 and 6e-4 FIM validity fell
to 35-43%), and a probe (copy rate + FIM validity + plain-context copy rate on held-out functions
outside the evaluation set, every 50 steps, the starting weights included) that never keeps a
step whose FIM validity is more than ``fim_tolerance`` under the starting weights' (the sum
alone kept steps that had traded FIM for copying). Runs and figures: docs/training-sweep.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from training.finish import FinishConfig


@dataclass
class ContextCopyConfig(FinishConfig):
    seed: int = 1  # FinishConfig's seed offsets: rows and batches differ from the finishing phase's
    steps: int = 300
    mixture: tuple = (
        ("plain_copy", 0.30),
        ("fim_middle", 0.385),
        ("identity", 0.175),
        ("copy", 0.07),
        ("natural", 0.07),
    )
    lr: float = 1e-4
    min_lr_ratio: float = 1.0  # constant after the warmup
    probe_every: int = 50
    # A probed step whose FIM validity falls more than this below the starting weights' cannot be
    # kept (training.probe.context_copy_scorer); None: the plain sum of the three rates.
    fim_tolerance: float | None = 0.03
