"""Candidate ranking: pure functions from matched occurrences to a short, ordered list of drafts.

Order (issue 4): the same document near the cursor first, then recency, then frequency. All
occurrences share the longest match length, so length never needs weighing against locality.
Occurrences with the same continuation are one candidate; their count is its frequency.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

FREQUENCY_PREFIX = 8  # continuations agreeing on this many leading tokens count as the same draft


@dataclass(frozen=True)
class Occurrence:
    source: str  # document uri or "history:<kind>"
    position: int  # token offset of the continuation start in that source
    continuation: tuple[int, ...]
    same_document: bool
    distance: int  # |position - cursor| in tokens when same_document, else 0
    recency: int  # tick of the source's (or history entry's) last change; larger = newer


@dataclass(frozen=True)
class Ranked:
    occurrence: Occurrence
    frequency: int
    score: float


def score(occurrence: Occurrence, frequency: int, newest: int) -> float:
    """Higher is better. Same document: 2 + proximity in (0, 1]. Elsewhere: 1 + 0.9 * recency
    + 0.1 * frequency share, so recency decides and frequency breaks ties."""
    if occurrence.same_document:
        return 2.0 + 1.0 / (1.0 + occurrence.distance / 64.0)
    recency = occurrence.recency / newest if newest > 0 else 0.0
    return 1.0 + 0.9 * recency + 0.1 * (1.0 - 1.0 / (1.0 + frequency))


def rank(occurrences: Sequence[Occurrence], max_candidates: int, newest: int) -> list[Ranked]:
    """Group by continuation, keep each group's best occurrence, order by score."""
    groups: dict[tuple[int, ...], list[Occurrence]] = {}
    for occurrence in occurrences:
        if occurrence.continuation:
            groups.setdefault(occurrence.continuation[:FREQUENCY_PREFIX], []).append(occurrence)
    ranked = []
    for members in groups.values():
        best = max(members, key=lambda o: score(o, len(members), newest))
        ranked.append(Ranked(best, len(members), score(best, len(members), newest)))
    ranked.sort(key=lambda r: (-r.score, -r.frequency, -len(r.occurrence.continuation), r.occurrence.source,
                               r.occurrence.position))
    return ranked[:max_candidates]
