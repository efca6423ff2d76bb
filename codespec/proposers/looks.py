"""Which lookups are worth asking this step: a lookup is "nearly free" only next to a slow forward.

``auto`` asks every lookup on every step, since their drafts and match lengths are what the
decision conditions on. That is right while a look costs a sliver of a forward (a GPU step, a real
model on a CPU). Next to a tiny model's ~3 ms CPU step, the workspace index's lookup (~0.2 ms
after a forward has flushed the caches) is 7% of every step, and on completions its drafts rarely
add anything the request's own text did not already offer (docs/benchmarks.md, "real-completions").

``LookGate`` keeps, per lookup, what a look costs and what it saves: the tokens its draft got right
beyond the baseline's draft that step (the request's own text, asked on every step: under greedy,
what verifying the lookup's draft would have kept on top), each worth a plain step's seconds (in
a shared forward, the request's part of one: ``auto.request_share``). A look
that costs under ``share`` of a plain step is always asked (a real model's forward; a GPU); a
dearer one only while it saves at least what it costs, and otherwise once every ``interval``
steps, the interval doubling while it keeps not paying (up to ``max_interval``), so its value
stays measured. Every request's first step asks every lookup (new text to match).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LookGate:
    share: float = 0.02  # a look under this fraction of a plain step is always asked
    decay: float = 0.95  # per look: ~ the last 20 looks
    warmup: int = 16  # looks before the gate judges
    max_interval: int = 64
    cost_s: float = 0.0  # seconds per look (forgetting mean)
    saved_s: float = 0.0  # seconds its drafts saved beyond the cheap lookups', per look
    looks: int = 0
    interval: int = 1
    waited: int = 0
    skipped: int = 0  # steps it was not asked (for reports)
    catching_up: bool = False  # the next look follows skipped steps: its time is not a look's cost

    def cheap(self, plain_s: float) -> bool:
        return self.looks == 0 or self.cost_s <= self.share * plain_s

    def ask(self, plain_s: float) -> bool:
        """Whether to ask this lookup this step (counts a skipped step when not)."""
        if self.looks < self.warmup or self.cheap(plain_s) or self.saved_s >= self.cost_s:
            self.interval, self.waited = 1, 0
            return True
        self.waited += 1
        if self.waited >= self.interval:  # explore: keep its value measured
            self.waited = 0
            self.interval = min(self.interval * 2, self.max_interval)
            self.catching_up = True  # this look also catches up on the steps it skipped
            return True
        self.skipped += 1
        return False

    def looked(self, seconds: float, saved_s: float, count_cost: bool = True) -> None:
        """One look took ``seconds`` and saved ``saved_s``; ``count_cost`` False for a look whose time
        includes one-off work (a request's first look builds its tables; a look after skipped steps
        indexes the tokens it missed)."""
        d = self.decay
        count_cost, self.catching_up = count_cost and not self.catching_up, False
        if count_cost and seconds > 0.0:
            self.cost_s = seconds if self.cost_s == 0.0 else d * self.cost_s + (1 - d) * seconds
        self.saved_s = saved_s if self.looks == 0 else d * self.saved_s + (1 - d) * saved_s
        self.looks += 1
