"""Session history of one kind ("accepted", "generated", "replaced"): an append-only token buffer.

Entries are appended with a separator after each, so a match never spans two entries and a
continuation stops at its entry's end. Only the newest ``max_tokens`` are kept (oldest entries
drop first): history predicts by recency, and a bound keeps its scan cheap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from codespec.index.ngram import Match, scan_longest


@dataclass(frozen=True)
class HistoryEntry:
    uri: str | None
    time: float
    tick: int


@dataclass(frozen=True)
class HistoryRecord:
    """One history entry as :meth:`index.store.WorkspaceIndex.history_entries` reports it."""

    kind: str  # "accepted", "generated" or "replaced"
    uri: str | None  # the document it belongs to, if any
    time: float  # time.time() when it was added (kept across restarts)
    token_ids: tuple[int, ...]  # what lookups match (the newest part only, if it exceeded the buffer)


class HistoryBuffer:
    def __init__(self, kind: str, dtype: np.dtype, sep: int, max_tokens: int = 131_072) -> None:
        if max_tokens < 2:  # room for one token and its separator (below that, the cut keeps everything)
            raise ValueError(f"history_tokens must be >= 2, got {max_tokens}")
        self.kind, self.sep, self.max_tokens = kind, sep, max_tokens
        self.tokens = np.zeros(0, dtype=dtype)
        self.entry_starts = np.zeros(0, dtype=np.int64)  # [E] index of each entry's first token
        self.entries: list[HistoryEntry] = []

    @property
    def source(self) -> str:
        return f"history:{self.kind}"

    def append(self, token_ids: np.ndarray, entry: HistoryEntry) -> None:
        if not len(token_ids):
            return
        token_ids = token_ids[-(self.max_tokens - 1) :]
        self.entry_starts = np.append(self.entry_starts, len(self.tokens))
        self.tokens = np.concatenate([self.tokens, token_ids, np.array([self.sep], dtype=self.tokens.dtype)])
        self.entries.append(entry)
        if len(self.tokens) > self.max_tokens:
            drop = int(np.searchsorted(self.entry_starts, len(self.tokens) - self.max_tokens, side="left"))
            cut = int(self.entry_starts[drop]) if drop < len(self.entry_starts) else len(self.tokens)
            self.tokens = self.tokens[cut:].copy()
            self.entry_starts = self.entry_starts[drop:] - cut
            self.entries = self.entries[drop:]

    def match(self, reversed_context, max_ngram: int, min_ngram: int) -> Match:
        return scan_longest(self.tokens, reversed_context, max_ngram, min_ngram, sep=self.sep)

    def records(self) -> list[HistoryRecord]:
        """Every kept entry, oldest first."""
        ends = np.append(self.entry_starts[1:], len(self.tokens)) - 1  # each entry's separator
        return [
            HistoryRecord(self.kind, entry.uri, entry.time, tuple(self.tokens[start:end].tolist()))
            for entry, start, end in zip(self.entries, self.entry_starts.tolist(), ends.tolist())
        ]

    def entry_at(self, position: int) -> HistoryEntry:
        return self.entries[int(np.searchsorted(self.entry_starts, position, side="right")) - 1]

    def continuation(self, position: int, max_len: int) -> tuple[int, ...]:
        window = self.tokens[position : position + max_len]
        stop = np.flatnonzero(window == self.sep)
        return tuple(window[: stop[0] if len(stop) else len(window)].tolist())

    def check(self) -> None:
        if len(self.entries) != len(self.entry_starts):
            raise AssertionError(f"{self.source}: {len(self.entries)} entries, {len(self.entry_starts)} starts")
        if len(self.entries):
            ends = np.append(self.entry_starts[1:], len(self.tokens)) - 1
            if self.entry_starts[0] != 0 or not np.all(self.tokens[ends] == self.sep):
                raise AssertionError(f"{self.source}: entries are not separator-terminated")
            if np.count_nonzero(self.tokens == self.sep) != len(self.entries):
                raise AssertionError(f"{self.source}: stray separator inside an entry")
        elif len(self.tokens):
            raise AssertionError(f"{self.source}: tokens without entries")


HISTORY_KINDS = ("accepted", "generated", "replaced")


class SessionHistory:
    """The history buffers of every kind, one per kind (a kind not listed gets one on first use).

    Not thread-safe: :class:`index.store.WorkspaceIndex` calls it under its lock."""

    def __init__(self, dtype: np.dtype, sep: int, max_tokens: int) -> None:
        self.dtype, self.sep, self.max_tokens = dtype, sep, max_tokens
        self.buffers = {kind: HistoryBuffer(kind, dtype, sep, max_tokens) for kind in HISTORY_KINDS}

    def append(self, kind: str, token_ids: np.ndarray, entry: HistoryEntry) -> None:
        if kind not in self.buffers:
            self.buffers[kind] = HistoryBuffer(kind, self.dtype, self.sep, self.max_tokens)
        self.buffers[kind].append(token_ids, entry)

    def records(self, kind: str | None = None) -> list[HistoryRecord]:
        """The kept entries (of one ``kind``, or all), oldest first across kinds."""
        if kind is None:
            buffers = list(self.buffers.values())
        else:
            buffers = [self.buffers[kind]] if kind in self.buffers else []
        dated = [(entry.tick, record) for buffer in buffers for entry, record in zip(buffer.entries, buffer.records())]
        return [record for _, record in sorted(dated, key=lambda pair: pair[0])]

    def clear(self) -> None:
        self.buffers = {kind: HistoryBuffer(kind, self.dtype, self.sep, self.max_tokens) for kind in self.buffers}

    def matches(
        self, reversed_context, max_ngram: int, min_ngram: int, cap: int
    ) -> list[tuple[int, HistoryBuffer, np.ndarray]]:
        """(match length, buffer, the newest ``cap`` positions) of every kind that matches."""
        found = []
        for buffer in self.buffers.values():
            match = buffer.match(reversed_context, max_ngram, min_ngram)
            if match.length:
                found.append((match.length, buffer, match.positions[-cap:]))
        return found

    def check(self) -> None:
        for buffer in self.buffers.values():
            buffer.check()

    def nbytes(self) -> int:
        return sum(buffer.tokens.nbytes for buffer in self.buffers.values())
