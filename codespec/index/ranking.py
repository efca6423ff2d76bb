"""Candidate ranking: pure functions from matched occurrences to a short, ordered list of drafts.

Order, strictly lexicographic (docs/index.md): the same document near the cursor first (nearer
first), then recency (the newer source first), then frequency, then fixed tie-breaks (longer
continuation, source, position) so equal inputs always rank alike. Lexicographic, not a
weighted sum: a weighted sum lets enough of one criterion outweigh the one above it (after
many clock ticks, an older document with more occurrences outranked the newest one). All
occurrences share the longest match length, so length never needs weighing against locality.
Occurrences with the same continuation are one candidate; their count is its frequency.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from codespec.index.history import HistoryBuffer

FREQUENCY_PREFIX = 8  # continuations agreeing on this many leading tokens count as the same draft


@dataclass(frozen=True)
class Continuation:
    """A draft the index found: what followed a match of the context somewhere it holds."""

    token_ids: tuple[int, ...]  # the continuation after the match
    match_len: int  # tokens of context matched
    source: str  # document uri, or "history:<kind>"
    position: int  # token offset of the continuation start in that source
    score: float  # higher ranks earlier; mirrors the order of index.ranking (within one lookup)


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
    score: float  # summarises the order for logs: never increases down a ranked list


def sort_key(occurrence: Occurrence, frequency: int) -> tuple:
    """Smaller sorts first: the whole ranking order in one tuple."""
    return (
        not occurrence.same_document,
        occurrence.distance if occurrence.same_document else 0,
        -occurrence.recency,
        -frequency,
        -len(occurrence.continuation),
        occurrence.source,
        occurrence.position,
    )


def score(occurrence: Occurrence, frequency: int, newest: int) -> float:
    """Higher ranks earlier (``sort_key`` decides; this only mirrors it in one number). Same
    document: 2 + proximity in (0, 1]. Elsewhere: 1 + (recency + frequency share) / (newest + 1)
    in [0, 1): recency ticks are integers and the share is below 1, so a newer source always
    scores higher and frequency only separates equal recency."""
    if occurrence.same_document:
        return 2.0 + 1.0 / (1.0 + occurrence.distance / 64.0)
    share = 1.0 - 1.0 / (1.0 + frequency)
    return 1.0 + (max(occurrence.recency, 0) + share) / (max(newest, occurrence.recency, 0) + 1.0)


def rank(occurrences: Sequence[Occurrence], max_candidates: int, newest: int) -> list[Ranked]:
    """Group by continuation, keep each group's best occurrence, order by ``sort_key``."""
    groups: dict[tuple[int, ...], list[Occurrence]] = {}
    for occurrence in occurrences:
        if occurrence.continuation:
            groups.setdefault(occurrence.continuation[:FREQUENCY_PREFIX], []).append(occurrence)
    ranked = []
    for members in groups.values():
        best = min(members, key=lambda o: sort_key(o, len(members)))
        ranked.append(Ranked(best, len(members), score(best, len(members), newest)))
    ranked.sort(key=lambda r: sort_key(r.occurrence, r.frequency))
    return ranked[:max_candidates]


def occurrences_at(source, positions: np.ndarray, max_len: int, same, cursor: int | None) -> list[Occurrence]:
    """The occurrences at ``positions`` (continuation starts) of one source: a history buffer or a
    document (``index.levels.Doc``); ``same`` is the document the cursor is in."""
    if isinstance(source, HistoryBuffer):
        return [
            Occurrence(source.source, p, source.continuation(p, max_len), False, 0, source.entry_at(p).tick)
            for p in positions.tolist()
        ]
    is_same = source is same
    return [
        Occurrence(
            source.uri,
            p,
            tuple(source.tokens[p : p + max_len].tolist()),
            is_same,
            abs(p - cursor) if is_same and cursor is not None else 0,
            source.changed,
        )
        for p in positions.tolist()
    ]


def continuations(
    found: Sequence[tuple[int, object, np.ndarray]],
    max_len: int,
    same,
    cursor: int | None,
    max_candidates: int,
    newest: int,
) -> list[Continuation]:
    """The ranked drafts from each source's matches ``(match length, source, positions)``: only
    the sources with the longest match compete (length is never weighed against locality)."""
    if not found:
        return []
    best = max(length for length, _, _ in found)
    occurrences = []
    for length, source, positions in found:
        if length == best:
            occurrences.extend(occurrences_at(source, positions, max_len, same, cursor))
    return [
        Continuation(r.occurrence.continuation, best, r.occurrence.source, r.occurrence.position, r.score)
        for r in rank(occurrences, max_candidates, newest)
    ]
