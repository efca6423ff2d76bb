"""Per-sequence state that follows vLLM's batch rows (docs/vllm.md, "Rows").

vLLM calls a proposer with its batch as rows of a token table and no request ids: a row's
request may move to another row between steps (the batch is condensed when requests leave),
new requests take free rows, and a preempted request comes back later. So a row's state is found
by what the row holds. A tracked sequence is the row's sequence at the last step; this step the
same request's row holds that sequence plus the tokens just sampled for it (the accepted drafts
and one more). Tracked sequences are keyed by a hash of their first tokens and checked against
the row's tokens, so a request whose prompt starts like another's (a shared system prompt) is
still told apart by its own tokens. A sequence that no row continues is kept for a while (a
preempted request resumes) and then dropped, so memory is bounded by the batch, whatever the load.

Most steps, a request keeps its row: the sequence the same row held last step, grown by exactly the
tokens sampled and ending as it ended then (its last ``TAIL_TOKENS``), is taken without hashing.
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

S = TypeVar("S")
KEY_TOKENS = 64  # tokens hashed into a sequence's key (the start of its prompt)
KEEP_STEPS = 256  # steps a sequence no row continues is kept (a preempted request resumes within them)
TAIL_TOKENS = 8  # a sequence's last tokens, checked when its row continues it


@dataclass(frozen=True)
class Row:
    """One decoding row of a step: its whole sequence and how many of its last tokens are new."""

    tokens: np.ndarray  # [n] int: prompt + output so far, the tokens sampled this step last
    sampled: int  # tokens sampled for it this step (accepted drafts + one), >= 1
    index: int = -1  # its row in vLLM's batch this step (where its request's arguments are read)


@dataclass
class Tracked(Generic[S]):
    key: tuple[int, bytes]  # (tokens hashed: KEY_TOKENS, or the whole prompt when shorter; their hash)
    prompt_len: int
    prompt_hash: bytes
    length: int  # the sequence's length when last seen
    last_token: int
    last_step: int
    state: S
    tail: list[int] = field(default_factory=list)  # its last TAIL_TOKENS tokens when last seen


def prefix_key(tokens: np.ndarray, count: int = KEY_TOKENS) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(tokens[:count], dtype=np.int64).tobytes(), digest_size=16).digest()


class RowStates(Generic[S]):
    """``step(rows)`` gives each row its state: the tracked one it continues, else a new one made
    by ``create(row, prompt_len)``; ``close(state)`` is called for every state dropped."""

    def __init__(
        self,
        create: Callable[[Row, int], S],
        close: Callable[[S], None] = lambda state: None,
        keep_steps: int = KEEP_STEPS,
        max_tracked: int = 4096,
    ) -> None:
        self.create = create
        self.close = close
        self.keep_steps = keep_steps
        self.max_tracked = max_tracked
        self._by_key: dict[tuple[int, bytes], list[Tracked[S]]] = {}
        self._key_lengths: collections.Counter[int] = collections.Counter()  # of the tracked keys
        self._step = 0
        self._at_row: dict[int, Tracked[S]] = {}  # last step's sequences by their batch row
        # every tracked sequence by id, least recently seen first (a dict keeps insertion order):
        # expiry pops stale ones off its front, so a step costs its rows, not everything tracked
        self._by_recency: dict[int, Tracked[S]] = {}
        self.created = 0  # states made (a reused row is not counted again)

    def __len__(self) -> int:
        return len(self._by_recency)

    def step(self, rows: Sequence[Row | None]) -> list[S | None]:
        """The state of each row (None for a row that is not decoding this step)."""
        self._step += 1
        taken: set[int] = set()
        found: list[Tracked[S] | None] = []
        for row in rows:
            tracked = None if row is None else (self._same_row(row, taken) or self._match(row, taken))
            if tracked is not None:
                taken.add(id(tracked))
            found.append(tracked)
        states: list[S | None] = []
        at_row: dict[int, Tracked[S]] = {}
        for row, tracked in zip(rows, found):
            if row is None:
                states.append(None)
                continue
            if tracked is None:
                tracked = self._track(row)
            tokens = row.tokens
            tracked.length = len(tokens)
            tracked.tail = tokens[-TAIL_TOKENS:].tolist()
            tracked.last_token = tracked.tail[-1]
            tracked.last_step = self._step
            recency = self._by_recency
            recency[id(tracked)] = recency.pop(id(tracked), tracked)  # now the most recent
            if row.index >= 0:
                at_row[row.index] = tracked
            states.append(tracked.state)
        self._at_row = at_row
        if len(self._by_recency) > len(states) - states.count(None):  # some sequence no row continued
            self._expire()
        return states

    def _same_row(self, row: Row, taken: set[int]) -> Tracked[S] | None:
        """The sequence this row held last step, if the row continues it exactly: grown by the
        tokens sampled, its old end unchanged."""
        tracked = self._at_row.get(row.index)
        if tracked is None or id(tracked) in taken:
            return None
        known = tracked.length
        if known + row.sampled != len(row.tokens):
            return None
        if row.tokens[max(0, known - TAIL_TOKENS) : known].tolist() != tracked.tail:
            return None
        return tracked

    def _match(self, row: Row, taken: set[int]) -> Tracked[S] | None:
        """The tracked sequence this row continues: exactly (its length grew by the tokens sampled),
        else the longest one it extends (a request back from preemption)."""
        tokens, length = row.tokens, len(row.tokens)
        loose: Tracked[S] | None = None
        candidates = [
            tracked
            for count in self._key_lengths
            if count <= length
            for tracked in self._by_key.get((count, prefix_key(tokens, count)), ())
        ]
        for tracked in candidates:
            if id(tracked) in taken or tracked.length > length or tracked.prompt_len > length:
                continue
            if int(tokens[tracked.length - 1]) != tracked.last_token:
                continue
            exact = tracked.length + row.sampled == length
            # The whole prompt is hashed again only when another tracked sequence shares its head (a
            # shared system prompt) or the row is no exact continuation (back from preemption): alone
            # with its key, the last token and the length grown by the tokens sampled tell it apart.
            if (len(candidates) > 1 or not exact) and prefix_key(tokens, tracked.prompt_len) != tracked.prompt_hash:
                continue
            if exact:
                return tracked
            if loose is None or tracked.length > loose.length:
                loose = tracked
        return loose

    def _track(self, row: Row) -> Tracked[S]:
        prompt_len = max(1, len(row.tokens) - row.sampled)  # first seen right after its prefill
        tokens = row.tokens
        count = min(KEY_TOKENS, prompt_len)
        tracked = Tracked(
            (count, prefix_key(tokens, count)),
            prompt_len,
            prefix_key(tokens, prompt_len),
            len(tokens),
            int(tokens[-1]),
            self._step,
            self.create(row, prompt_len),
        )
        self._by_key.setdefault(tracked.key, []).append(tracked)
        self._key_lengths[count] += 1
        self.created += 1
        return tracked

    def _expire(self) -> None:
        """Drop the sequences no row has continued for ``keep_steps`` steps, and the least recently
        seen past ``max_tracked``: both from the front of the recency order. A sequence a row holds
        this step is never dropped (more rows than ``max_tracked`` keep them all until they leave)."""
        recency = self._by_recency
        while recency:
            oldest = next(iter(recency.values()))
            stale = self._step - oldest.last_step > self.keep_steps
            if oldest.last_step == self._step or (not stale and len(recency) <= self.max_tracked):
                return
            del recency[id(oldest)]
            group = [tracked for tracked in self._by_key[oldest.key] if tracked is not oldest]
            if group:
                self._by_key[oldest.key] = group
            else:
                del self._by_key[oldest.key]
            self._key_lengths[oldest.key[0]] -= 1
            if not self._key_lengths[oldest.key[0]]:
                del self._key_lengths[oldest.key[0]]
            self.close(oldest.state)
