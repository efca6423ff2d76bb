"""Context lookup: draft by copying what followed the longest earlier match of the current suffix.

Classic prompt lookup, improved the ways that matter for code: the *longest* suffix match (up to
``max_ngram`` tokens) wins, and among equal lengths the *most recent* occurrence, since nearby text
predicts best. An n-gram -> latest-end map per n is extended incrementally as the sequence grows,
so a step costs O(new tokens x max_ngram) dictionary work, not a scan of the sequence. N-grams are
keyed by a polynomial hash (mod 2^64), an int, not by a tuple: a dict of ints is invisible to
Python's cyclic garbage collector, while one holding a tuple per n-gram (seven per token) makes
every full collection walk them all (3 ms at the p99 of a step on long outputs, for work that
takes 50 µs); and the same hash is computed for a whole prompt at once with numpy (a request's
first step indexes its prompt: inside vLLM that step is a row-step like any other). A hash
collision can only produce a draft that verification rejects. When the
match is recent enough that its continuation reaches the end of the sequence (a loop), the draft
continues the loop rather than stopping short.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from codespec.core.draft import EMPTY_DRAFT, Draft, MatchInfo, Outcome, ProposeContext
from codespec.proposers.setup import ProposerSetup

HASH_BASE = 0x9E3779B97F4A7C15  # odd, 64-bit: an n-gram's key is sum(t_i * BASE^(n-1-i)) mod 2^64
MASK = (1 << 64) - 1
VECTOR_FROM = 48  # positions indexed at once from which numpy is faster than the Python loop


def periodic_continuation(tokens: Sequence[int], end: int, max_len: int) -> tuple[int, ...]:
    """Up to ``max_len`` tokens copied from ``end``; past the sequence's end the copy reads its own
    output, so a repeating pattern of period p drafts the full length instead of stopping after p."""
    if end + max_len <= len(tokens):  # within the sequence: a slice (the common case, in C)
        return tuple(tokens[end : end + max_len])
    period = len(tokens) - end
    draft: list[int] = []
    for i in range(max_len):
        draft.append(tokens[end + i] if end + i < len(tokens) else draft[i - period])
    return tuple(draft)


def extends(mirror: Sequence[int], token_ids: Sequence[int]) -> bool:
    """Whether ``token_ids`` continues a proposer's ``mirror`` of the engine's sequence. Within a
    request the sequence only grows, so checking the length and the last mirrored token is enough;
    anything else (a new request through the same proposer) means: restart the mirror."""
    known = len(mirror)
    return len(token_ids) >= known and (known == 0 or token_ids[known - 1] == mirror[-1])


class ContextLookup:
    name = "context"

    def __init__(self, max_ngram: int = 8, min_ngram: int = 2, draft_len: int | None = None) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.draft_len = draft_len
        self._powers = [pow(HASH_BASE, i, 1 << 64) for i in range(max_ngram + 1)]
        self.begin(())

    @classmethod
    def from_setup(cls, setup: ProposerSetup) -> ContextLookup:
        config = setup.config.context
        return cls(max_ngram=config.max_ngram, min_ngram=config.min_ngram, draft_len=config.draft_len)

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self._latest_end: list[dict[int, int]] = [{} for _ in range(self.max_ngram + 1)]
        self._indexed_upto = 0
        self._tokens: list[int] = []

    def propose(self, context: ProposeContext) -> Draft:
        max_len = context.max_len if self.draft_len is None else min(self.draft_len, context.max_len)
        return self.propose_within(context.token_ids, 0, max_len)

    def propose_within(self, token_ids: Sequence[int], first: int, max_len: int) -> Draft:
        """A draft from the latest match lying wholly at or after position ``first`` (0: anywhere).
        ``first`` > 0 is a request's output (``ReferenceLookup``'s drafts for inserted text), read
        from this lookup's own table over the whole sequence: the same draft a lookup over
        ``token_ids[first:]`` alone would make (its latest occurrence of each n-gram is this
        table's when that one starts at or after ``first``, and there is none when this table's
        latest starts before), without a second table extended by every token. Positions in the
        draft's match are relative to ``first``."""
        tokens = self._sync(token_ids)
        length = len(tokens)
        self._index_until(length - 1)  # n-grams ending before the last position have a continuation
        found = self.latest_match(tokens, min(self.max_ngram, length - first - 1), first)
        if found is None:
            return EMPTY_DRAFT
        n, end = found
        draft = periodic_continuation(tokens, end, max_len)
        return Draft(draft, self.name, match=MatchInfo(n, "context", end - first))

    def latest_match(self, tail: Sequence[int], longest: int, first: int = 0) -> tuple[int, int] | None:
        """(n, end): the longest suffix of ``tail`` (``longest`` tokens at most, ``min_ngram`` at
        least) that occurs in the indexed tokens, wholly at or after ``first``, and where its latest
        occurrence ends; None: none does. ``tail`` is this lookup's own sequence or any other (a
        request's, looked up in ``RecentOutputs``' table of earlier outputs)."""
        length = len(tail)
        longest = min(longest, length)
        keys = [0] * (max(longest, 0) + 1)  # keys[n]: the last n tokens' key
        key, powers = 0, self._powers
        for n in range(1, longest + 1):
            key = (key + int(tail[length - n]) * powers[n - 1]) & MASK
            keys[n] = key
        for n in range(longest, self.min_ngram - 1, -1):
            end = self._latest_end[n].get(keys[n])
            if end is not None and end - n >= first:
                return n, end
        return None

    @property
    def tokens(self) -> list[int]:
        """The tokens this lookup has seen, as ints (its own copy: read it, do not change it)."""
        return self._tokens

    def extend(self, token_ids: Sequence[int]) -> None:
        """Append ``token_ids`` to the tokens and index them, drafting nothing: a table over other
        text than a request's (``RecentOutputs``' earlier outputs)."""
        self._tokens.extend(map(int, token_ids))
        self._index_until(len(self._tokens) - 1)

    def observe(self, outcome: Outcome) -> None:
        pass

    def end(self) -> None:
        self.begin(())

    def _sync(self, token_ids: Sequence[int]) -> list[int]:
        if not extends(self._tokens, token_ids):
            self.begin(())
        self._tokens.extend(map(int, token_ids[len(self._tokens) :]))  # numpy ints would overflow the keys
        return self._tokens

    def _index_until(self, last_end: int) -> None:
        first = self._indexed_upto + 1
        if last_end - first + 1 >= VECTOR_FROM:
            self._index_at_once(first, last_end)
        else:
            tokens, tables, powers = self._tokens, self._latest_end, self._powers
            low, high = self.min_ngram, self.max_ngram
            for end in range(first, last_end + 1):
                key = 0
                for n in range(1, min(high, end) + 1):
                    key = (key + tokens[end - n] * powers[n - 1]) & MASK
                    if n >= low:
                        tables[n][key] = end
        self._indexed_upto = max(self._indexed_upto, last_end)

    def _index_at_once(self, first: int, last_end: int) -> None:
        """The n-grams ending at ``first``..``last_end`` (exclusive ends), keyed as the loop keys them;
        later ends overwrite earlier ones, so each key keeps its latest end."""
        values = np.asarray(self._tokens[:last_end], dtype=np.uint64)
        ends = np.arange(first, last_end + 1, dtype=np.int64)
        end_list = list(range(first, last_end + 1))  # the ends as Python ints once, for every length
        keys = np.zeros(len(ends), dtype=np.uint64)
        with np.errstate(over="ignore"):
            for n in range(1, self.max_ngram + 1):
                start = max(0, n - first)  # an n-gram needs n tokens before its end: ends[start:]
                if start >= len(ends):
                    break
                keys[start:] += values[ends[start:] - n] * np.uint64(self._powers[n - 1])
                if n >= self.min_ngram:
                    self._latest_end[n].update(zip(keys[start:].tolist(), end_list[start:]))
