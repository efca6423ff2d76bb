"""What the engine service keeps between requests besides the model: the KV caches by document
(prompt caching), the stats it reports, and the session's history and earlier outputs for
drafting later requests.

The session history is two stores: the index's (text, with the index's own tokens; drafted from
by the workspace lookup) when an index is attached, and the earlier outputs as token ids
(``proposers.outputs``; drafted from by auto's outputs lookup), with or without an index.
Clearing forgets both, so a benchmark or a user can ask a request as if for the first time."""

from __future__ import annotations

import collections
import logging
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from typing import Any

from codespec.core.draft import CountsPrediction
from codespec.core.stats import RequestStats, json_safe
from codespec.core.target import Target
from codespec.proposers.outputs import RecentOutputs, until_stop
from codespec.service.engine.jobs import Usage
from codespec.service.requests.schema import RequestKind

log = logging.getLogger(__name__)
RECENT_HISTORY = 20  # history entries the stats show


class CachePool:
    """KV caches by document key, least recently used evicted beyond ``capacity``. An evicted
    cache keeps its storage and serves the next new key (emptied, not reallocated), up to
    ``spare`` of them: under many requests the KV memory is reused rather than churned."""

    def __init__(self, target: Target, capacity: int, spare: int = 4) -> None:
        self.target = target
        self.capacity = capacity
        self.caches: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self.spare_limit = spare
        self.spare: list[Any] = []

    def take(self, key: str | None):
        cache = self.caches.pop(key or "", None)
        if cache is not None:
            return cache
        if self.spare:
            cache = self.spare.pop()
            cache.reset()  # the positions go, the buffers stay (codespec.cache_layer)
            return cache
        return self.target.new_cache()

    def give_back(self, key: str | None, cache) -> None:
        self.caches[key or ""] = cache
        self.caches.move_to_end(key or "")
        while len(self.caches) > self.capacity:
            _, evicted = self.caches.popitem(last=False)
            if len(self.spare) < self.spare_limit:
                self.spare.append(evicted)

    def clear(self) -> None:
        self.caches.clear()
        self.spare.clear()


@dataclass
class ServiceStats:
    """Totals since start, and the engine metrics of the last ``window`` requests."""

    requests: collections.Counter = field(default_factory=collections.Counter)  # by kind
    reasons: collections.Counter = field(default_factory=collections.Counter)  # by finish reason
    errors: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    history_entries: int = 0
    cycles: int = 0  # target forwards the scheduler ran (each serves every request in the batch)
    cycle_requests: int = 0  # requests served, summed over cycles (/ cycles: the mean batch)
    largest_batch: int = 0
    recent: collections.deque = field(default_factory=lambda: collections.deque(maxlen=256))
    last_requests: collections.deque = field(default_factory=lambda: collections.deque(maxlen=32))

    def record(
        self,
        kind: RequestKind,
        reason: str,
        usage: Usage,
        stats: RequestStats,
        summary: dict,
        proposer: str,
        elapsed_s: float,
    ) -> None:
        """A finished request (``summary``: its ``stats.summary()``) into the totals, the engine
        metrics (if it decoded) and the last requests."""
        self.requests[kind.value] += 1
        self.reasons[reason] += 1
        self.prompt_tokens += usage.prompt_tokens
        self.cached_prompt_tokens += usage.cached_prompt_tokens
        self.completion_tokens += usage.completion_tokens
        self.accepted_prediction_tokens += usage.accepted_prediction_tokens
        self.rejected_prediction_tokens += usage.rejected_prediction_tokens
        if kind.decodes:  # no decoding: nothing for the engine metrics
            self.recent.append(stats)
        self.last_requests.append(
            {
                "kind": kind.value,
                "reason": reason,
                "proposer": proposer,
                "elapsed_ms": round(elapsed_s * 1e3, 3),
                "ttft_ms": summary["ttft_ms"],
                "tokens": stats.tokens,
                "target_forwards": len(stats.steps),
                "prompt_tokens": usage.prompt_tokens,
                "cached_prompt_tokens": usage.cached_prompt_tokens,
                "accepted_prediction_tokens": usage.accepted_prediction_tokens,
                "rejected_prediction_tokens": usage.rejected_prediction_tokens,
            }
        )

    def as_dict(self) -> dict:
        merged = RequestStats()
        for stats in self.recent:
            merged = merged.merge(stats)
        return {
            "requests": dict(self.requests),
            "finish_reasons": dict(self.reasons),
            "errors": self.errors,
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "accepted_prediction_tokens": self.accepted_prediction_tokens,
            "rejected_prediction_tokens": self.rejected_prediction_tokens,
            "history_entries": self.history_entries,
            "batching": {
                "cycles": self.cycles,
                "mean_batch": round(self.cycle_requests / self.cycles, 3) if self.cycles else 0.0,
                "largest_batch": self.largest_batch,
            },
            "engine": json_safe(merged.summary()),
            "last_requests": list(self.last_requests),
        }


def prediction_tokens(proposer, stats: RequestStats) -> tuple[int, int]:
    """Accepted/rejected reference tokens: from the proposer when it counts them, else from the
    steps whose draft came from the reference."""
    if isinstance(proposer, CountsPrediction):
        return proposer.accepted_prediction_tokens, proposer.rejected_prediction_tokens
    steps = [step for step in stats.steps if step.proposer.startswith("reference")]
    accepted = sum(step.accepted for step in steps)
    return accepted, sum(step.draft_len for step in steps) - accepted


class ServiceHistory:
    """On the engine thread: the service adds and clears through ``EngineService.call``."""

    def __init__(self, stats: ServiceStats, stop_token_ids: Container[int]) -> None:
        self.stats = stats
        self.stop_token_ids = stop_token_ids
        # only the stats' view of the last entries, (kind, uri, text), newest last: the history the
        # proposers draft from is the index's (``index.add_history``)
        self.recent: collections.deque = collections.deque(maxlen=RECENT_HISTORY)
        self.outputs = RecentOutputs()  # what the model wrote for earlier requests, as token ids

    def add(self, kind: str, text: str, uri: str | None, index) -> None:
        self.recent.append((kind, uri, text))
        self.stats.history_entries += 1
        if index is not None:
            try:
                index.add_history(kind, text, uri)
            except Exception:  # history is a hint for drafting; never fail a request over it
                log.exception("index.add_history failed")

    def add_output(self, token_ids: Sequence[int]) -> None:
        """A finished output's tokens (a prompt's stop token and what follows it left out)."""
        self.outputs.add(until_stop(token_ids, self.stop_token_ids))

    def clear(self, index) -> None:
        self.recent.clear()
        self.outputs.clear()
        clear_index = getattr(index, "clear_history", None)
        if clear_index is not None:
            clear_index()
