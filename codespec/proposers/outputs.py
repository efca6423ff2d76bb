"""Outputs lookup: draft from what the model wrote for the session's earlier requests.

A model repeats itself from request to request: the same imports, the same idioms, the same
boilerplate in every completion of a repository. vLLM's ``suffix`` method keeps every response in a
global suffix tree for this, and on completions that is its edge over a lookup in the request's own
text: replayed with no model in the loop, its drafts accept 12% more tokens with its earlier
responses than without them (docs/benchmarks.md, "Earlier outputs"). Here it is the context rule
(``proposers.context``) over the earlier outputs: the longest suffix of the request's sequence, up to
``max_ngram`` tokens, that occurs in one drafts what followed it there, the newest output first.

``RecentOutputs`` is the session's store, one per process (codespec's engine) or per vLLM worker
(the drafter): one hashed n-gram table over all kept outputs, extended as each is added, so a look
costs a dictionary get per n whatever the number of outputs. It keeps the newest ``max_tokens``;
past half as many again it drops the oldest and rebuilds the table from the rest (numpy, at once).
Outputs are kept apart by a separator no n-gram of real text contains, and a draft stops at one.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Container, Sequence

from codespec.core.draft import EMPTY_DRAFT, Draft, MatchInfo, Outcome, ProposeContext
from codespec.proposers.context import ContextLookup
from codespec.proposers.setup import ProposerSetup

SOURCE = "outputs"
SEPARATOR = 1 << 62  # between two outputs: larger than any token id, so no real n-gram contains it
DEFAULT_MAX_TOKENS = 16_384  # ~ 7 table entries a token: ~11 MB of Python dicts


def until_stop(tokens: Sequence[int], stops: Container[int]) -> Sequence[int]:
    """An output as it ends: its tokens before the first stop token (a model may write, and an
    engine accept, tokens past it that are not output)."""
    return next((tokens[:n] for n, token in enumerate(tokens) if token in stops), tokens)


class RecentOutputs:
    """The session's latest outputs, as one n-gram table (``add`` one, ``find`` a continuation)."""

    def __init__(self, max_tokens: int = DEFAULT_MAX_TOKENS, max_ngram: int = 8, min_ngram: int = 2) -> None:
        self.max_tokens = max_tokens
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._lengths: deque[int] = deque()  # each kept output's length, separator included, oldest first
        self._table = ContextLookup(max_ngram, min_ngram)  # over the kept outputs, each followed by SEPARATOR
        self._lock = threading.Lock()  # adds may come from any thread; a look reads one table whole
        self.added = 0  # outputs added over the store's life (for reports)

    def __len__(self) -> int:
        return len(self._lengths)

    @property
    def tokens(self) -> int:
        return len(self._table.tokens)

    def add(self, output: Sequence[int]) -> None:
        """One finished output (its tokens up to its end, no stop token: ``until_stop``)."""
        tokens = [int(token) for token in output]
        if len(tokens) <= self.min_ngram:  # nothing would follow any of its n-grams
            return
        tokens.append(SEPARATOR)
        with self._lock:
            self.added += 1
            self._lengths.append(len(tokens))
            kept = self._table.tokens
            if len(kept) + len(tokens) <= self.max_tokens * 3 // 2:
                self._table.extend(tokens)
                return
            dropped, total = 0, len(kept) + len(tokens)
            while total - dropped > self.max_tokens and len(self._lengths) > 1:
                dropped += self._lengths.popleft()
            table = ContextLookup(self.max_ngram, self.min_ngram)
            table.extend([*kept[dropped:], *tokens])
            self._table = table  # one assignment: a look in flight reads the old table whole

    def clear(self) -> None:
        """Forget every output (the session's history is cleared)."""
        with self._lock:
            self._lengths.clear()
            self._table = ContextLookup(self.max_ngram, self.min_ngram)

    def find(self, tail: Sequence[int], max_len: int) -> tuple[tuple[int, ...], int, int] | None:
        """(draft, match length, position): what followed the longest suffix of ``tail`` in the
        newest output holding it, up to ``max_len`` tokens and that output's end; None: no match."""
        table = self._table
        found = table.latest_match(tail, self.max_ngram)
        if found is None:
            return None
        n, end = found
        draft = table.tokens[end : end + max_len]
        if SEPARATOR in draft:
            draft = draft[: draft.index(SEPARATOR)]
        return (tuple(draft), n, end) if draft else None


class OutputsLookup:
    name = "outputs"

    def __init__(self, outputs: RecentOutputs, draft_len: int | None = None) -> None:
        self.outputs = outputs
        self.draft_len = draft_len

    @classmethod
    def from_setup(cls, setup: ProposerSetup) -> OutputsLookup:
        if setup.request.outputs is None:
            raise ValueError("the outputs lookup needs the session's outputs (RequestContext.outputs)")
        return cls(setup.request.outputs, setup.config.context.draft_len)

    def begin(self, prompt_ids: Sequence[int]) -> None:
        pass

    def propose(self, context: ProposeContext) -> Draft:
        max_len = context.max_len if self.draft_len is None else min(self.draft_len, context.max_len)
        found = self.outputs.find(context.token_ids, max_len) if max_len > 0 else None
        if found is None:
            return EMPTY_DRAFT
        draft, n, position = found
        return Draft(draft, self.name, match=MatchInfo(n, SOURCE, position))

    def observe(self, outcome: Outcome) -> None:
        pass

    def end(self) -> None:
        pass
