"""What the engine service keeps between requests besides the model: the KV caches by document
(prompt caching) and the stats it reports."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

from codespec.stats import RequestStats, json_safe
from codespec.target import Target


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
