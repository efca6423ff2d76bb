"""Context lookup: draft by copying what followed the longest earlier match of the current suffix.

Classic prompt lookup, improved the ways that matter for code: the *longest* suffix match (up to
``max_ngram`` tokens) wins, and among equal lengths the *most recent* occurrence, since nearby text
predicts best. An n-gram -> latest-end map per n is extended incrementally as the sequence grows,
so a step costs O(new tokens x max_ngram) dictionary work, not a scan of the sequence. N-grams are
keyed by a polynomial hash (mod 2^64), an int, not by a tuple: a dict of ints is invisible to
Python's cyclic garbage collector, while one holding a tuple per n-gram (seven per token) makes
every full collection walk them all (3 ms at the p99 of a step on long outputs, for work that
takes 50 µs); and the same hash is computed for a whole stretch at once with numpy. A hash
collision can only produce a draft that verification rejects. When the
match is recent enough that its continuation reaches the end of the sequence (a loop), the draft
continues the loop rather than stopping short.

A request's prompt is not indexed on its first step: it is kept as bytes (8 a token) and searched
with ``bytes.rfind`` (C) for the longest match, until its searches have cost what indexing it would
(the rent-or-buy rule: never more than twice the cheaper of the two, whatever the request's length);
only then is it indexed. Indexing a prompt costs a dictionary entry per token and length, about as
much as a hundred searches of a 500-token prompt, which a completion of a few dozen steps never
earns back, and inside vLLM every new request's first step lands in the same call, right after its
prefill (docs/benchmarks.md, "A request's prompt searched"). The tables then hold only ends after
the prompt, all later than any in it, so a table's match wins at equal length and the search looks
only for longer ones: the same draft either way.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np

from codespec.core.draft import EMPTY_DRAFT, Draft, MatchInfo, Outcome, ProposeContext
from codespec.proposers.setup import ProposerSetup

HASH_BASE = 0x9E3779B97F4A7C15  # odd, 64-bit: an n-gram's key is sum(t_i * BASE^(n-1-i)) mod 2^64
MASK = (1 << 64) - 1
VECTOR_FROM = 48  # positions indexed at once from which numpy is faster than the Python loop
# A request's first stretch (its prompt) of VECTOR_FROM positions or more is searched, not indexed,
# until its searches have cost what indexing it costs; one longer than UNINDEXED_MAX is indexed at
# once (a search that finds nothing scans all of it). Costs in tokens scanned by ``bytes.rfind``:
# a search's own Python work is worth SEARCH_SCANS of them, indexing a token INDEX_SCANS. Timed
# (CPython 3.11, prompts of 100-32,000 tokens), indexing costs what 50-860 searches that find nothing
# do; these constants say 30-560: a prompt is indexed somewhat early rather than late.
UNINDEXED_MAX = 32768
SEARCH_SCANS, INDEX_SCANS = 2000, 600
WORD = 8  # bytes a token takes in the unindexed stretch (array "q": any int a key can hash)


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
        self._unindexed = b""  # the tokens of the ends 1.._unindexed_upto (not in the tables), as bytes
        self._unindexed_upto = 0
        self._search_scans = 0  # what searching the unindexed stretch has cost so far (tokens scanned)

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
        if self._indexed_upto == 0 and VECTOR_FROM <= length - 1 <= UNINDEXED_MAX:
            self._leave_unindexed(length - 1)
        elif self._unindexed_upto and self._search_scans >= INDEX_SCANS * self._unindexed_upto:
            self._index_unindexed()  # searching it has cost what indexing it does: index it
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
                break
        else:
            n, end = self.min_ngram - 1, None
        if self._unindexed_upto and n < longest:  # only a longer match there is worth having
            longer = self._search_unindexed(tail, longest, max(n + 1, self.min_ngram), first)
            if longer is not None:
                return longer
        return None if end is None else (n, end)

    def _search_unindexed(self, tail: Sequence[int], longest: int, shortest: int, first: int) -> tuple[int, int] | None:
        """(n, end) for the longest n in ``shortest``..``longest`` whose last n tokens of ``tail``
        occur in the unindexed stretch, wholly at or after ``first``: the latest occurrence. Where
        the last n occur, so do the last n - 1 (ending at the same place), so n is found by
        bisection: one search when even the shortest is not there (the common case), ~3 when it is."""
        if shortest > longest or first + shortest > self._unindexed_upto:
            return None
        self._search_scans += SEARCH_SCANS
        suffix = array("q", [int(token) for token in tail[len(tail) - longest :]]).tobytes()
        end = self._latest_in_unindexed(suffix[(longest - shortest) * WORD :], first)
        if end is None:
            return None
        low, high = shortest, longest  # the last `low` tokens occur (ending at `end`); more than `high` do not
        while low < high:
            middle = (low + high + 1) // 2
            found = self._latest_in_unindexed(suffix[(longest - middle) * WORD :], first)
            if found is None:
                high = middle - 1
            else:
                low, end = middle, found
        return low, end

    def _latest_in_unindexed(self, pattern: bytes, first: int) -> int | None:
        """Where the latest occurrence of ``pattern`` (whole tokens) in the unindexed stretch ends,
        starting at or after token ``first``. A hit not on a token's boundary is no occurrence: the
        search goes on before it."""
        data, start, high = self._unindexed, first * WORD, self._unindexed_upto * WORD
        top = high
        while (at := data.rfind(pattern, start, high)) >= 0:
            if at % WORD == 0:
                self._search_scans += (top - at) // WORD
                return (at + len(pattern)) // WORD
            high = at + len(pattern) - 1
        self._search_scans += (top - start) // WORD
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

    def _leave_unindexed(self, last_end: int) -> None:
        """Ends 1..``last_end`` are searched as bytes (``_search_unindexed``), not put in the tables."""
        self._unindexed = array("q", self._tokens[:last_end]).tobytes()
        self._unindexed_upto = self._indexed_upto = last_end
        self._search_scans = 0

    def _index_unindexed(self) -> None:
        """Put the unindexed stretch in the tables after all, below the later ends they hold."""
        later = self._latest_end
        self._latest_end = [{} for _ in range(self.max_ngram + 1)]
        self._index_at_once(1, self._unindexed_upto)
        for table, kept in zip(self._latest_end, later):
            table.update(kept)
        self._unindexed, self._unindexed_upto = b"", 0

    def _index_at_once(self, first: int, last_end: int) -> None:
        """The n-grams ending at ``first``..``last_end`` (exclusive ends), keyed as the loop keys them;
        later ends overwrite earlier ones, so each key keeps its latest end. Only the tokens those
        n-grams read are converted (a store of earlier outputs grows by one output at a time)."""
        base = max(0, first - self.max_ngram)  # values[i] is token base + i
        values = np.asarray(self._tokens[base:last_end], dtype=np.uint64)
        ends = np.arange(first - base, last_end - base + 1, dtype=np.int64)
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
