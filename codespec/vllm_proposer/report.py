"""What the vLLM drafter reports: its counts (``DrafterStats``, in vLLM's log line) and the time
Python's collector took per step (``CollectorTime``, in the step trace)."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field


@dataclass
class DrafterStats:
    steps: int = 0
    rows: int = 0  # decoding rows over all steps
    sequences: int = 0  # sequences followed
    with_code: int = 0  # of them, prompts carrying code to rewrite
    with_prediction: int = 0  # of them, requests that sent a prediction (the copy pointer drafts it)
    drafted: int = 0
    accepted: int = 0
    served: int = 0  # drafts served from a runway (the proposer not asked)
    emitted: int = 0  # tokens the drafted-for steps emitted (accepted + one each)
    recorded: int = 0  # outputs put in the index's session history
    proposal_s: float = 0.0
    by_accepted: list[int] = field(default_factory=list)  # by_accepted[n]: drafted steps that accepted n

    def count(self, drafted: int, accepted: int, sampled: int) -> None:
        """One drafted step's outcome."""
        self.drafted += drafted
        self.accepted += accepted
        self.emitted += sampled
        if accepted >= len(self.by_accepted):
            self.by_accepted.extend([0] * (accepted + 1 - len(self.by_accepted)))
        self.by_accepted[accepted] += 1

    @property
    def by_depth(self) -> list[int]:
        """by_depth[i]: drafted steps that accepted more than i drafts."""
        depth, reached = [], 0
        for count in reversed(self.by_accepted[1:]):
            reached += count
            depth.append(reached)
        return depth[::-1]

    def summary(self) -> dict:
        return {
            "steps": self.steps,
            "rows": self.rows,
            "sequences": self.sequences,
            "with_code": self.with_code,
            "with_prediction": self.with_prediction,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "served": self.served,
            "recorded": self.recorded,
            "tokens_per_row_step": round(self.emitted / self.rows, 3) if self.rows else None,
            "proposal_ms_per_step": round(1000 * self.proposal_s / self.steps, 3) if self.steps else None,
            "acceptance_by_depth": self.by_depth[:16],
        }


class CollectorTime:
    """Time Python's cyclic garbage collector took in this process (vLLM's forward and scheduler
    included) since the last ``take``: a step slower than its rows say may be a collection, and the
    drafter's allocations are what triggers them."""

    def __init__(self) -> None:
        self._started = 0.0
        self.seconds = 0.0
        self.count = 0
        gc.callbacks.append(self._phase)

    def _phase(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started:
            self.seconds += time.perf_counter() - self._started
            self.count += 1

    def take(self) -> tuple[float, int]:
        taken = (round(1e3 * self.seconds, 3), self.count)
        self.seconds, self.count = 0.0, 0
        return taken

    def close(self) -> None:
        if self._phase in gc.callbacks:
            gc.callbacks.remove(self._phase)
