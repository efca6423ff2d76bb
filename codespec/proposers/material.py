"""Material lookup: draft from text a request carries beside its prompt (llama.vim's ``input_extra``).

Editor plugins for llama.cpp send a ring buffer of chunks from the files the user opened, edited
and yanked with every completion. Those chunks are where a completion's copied code usually comes
from, but they are not in codespec's prompt (the prompt stays the window around the cursor, so the
output is what it would be without them): this lookup drafts from them instead. It is the context
rule (``proposers.context``) over other text: the longest suffix of the request's sequence (up to
``max_ngram`` tokens) that occurs in a chunk drafts what followed it there; among equal lengths
the newest chunk wins (the ring buffer's last chunk is the user's latest).

A chunk's n-gram table is built once and kept (:class:`ChunkTables`, bounded): a plugin resends
the same chunks with every keystroke, so a request costs a dictionary lookup per chunk and n, not a
pass over the chunks.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from codespec.core.draft import EMPTY_DRAFT, Draft, MatchInfo, Outcome, ProposeContext
from codespec.proposers.setup import ProposerSetup

SOURCE = "material"


class ChunkTables:
    """n-gram -> latest end position, per chunk, for the most recently used chunks (an LRU)."""

    def __init__(self, max_chunks: int = 256) -> None:
        self.max_chunks = max_chunks
        self._tables: OrderedDict[tuple[tuple[int, ...], int, int], list[dict[int, int]]] = OrderedDict()
        self._lock = threading.Lock()

    def table(self, chunk: tuple[int, ...], min_ngram: int, max_ngram: int) -> list[dict[int, int]]:
        """``table[n][hash(n-gram)]``: the end of the n-gram's latest occurrence in ``chunk`` that
        has a continuation (the last position is left out: nothing follows it)."""
        key = (chunk, min_ngram, max_ngram)
        with self._lock:
            found = self._tables.get(key)
            if found is not None:
                self._tables.move_to_end(key)
                return found
        tables: list[dict[int, int]] = [{} for _ in range(max_ngram + 1)]
        for end in range(1, len(chunk)):
            for n in range(min_ngram, min(max_ngram, end) + 1):
                tables[n][hash(chunk[end - n : end])] = end
        with self._lock:
            self._tables[key] = tables
            while len(self._tables) > self.max_chunks:
                self._tables.popitem(last=False)
        return tables


TABLES = ChunkTables()  # shared by every request of the process (chunks recur request after request)


class MaterialLookup:
    name = "material"

    def __init__(
        self,
        chunks: Sequence[Sequence[int]],
        max_ngram: int = 8,
        min_ngram: int = 2,
        draft_len: int | None = None,
        tables: ChunkTables = TABLES,
    ) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.chunks = [tuple(chunk) for chunk in chunks if len(chunk) > min_ngram]
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.draft_len = draft_len
        self._tables = [tables.table(chunk, min_ngram, max_ngram) for chunk in self.chunks]

    @classmethod
    def from_setup(cls, setup: ProposerSetup) -> MaterialLookup:
        config = setup.config.context
        return cls(setup.request.material, max_ngram=config.max_ngram, min_ngram=config.min_ngram)

    def begin(self, prompt_ids: Sequence[int]) -> None:
        pass

    def propose(self, context: ProposeContext) -> Draft:
        tokens = context.token_ids
        max_len = context.max_len if self.draft_len is None else min(self.draft_len, context.max_len)
        for n in range(min(self.max_ngram, len(tokens)), self.min_ngram - 1, -1):
            key = hash(tuple(tokens[len(tokens) - n :]))
            for number in range(len(self.chunks) - 1, -1, -1):  # newest chunk first
                end = self._tables[number][n].get(key)
                if end is not None:
                    chunk = self.chunks[number]
                    return Draft(chunk[end : end + max_len], self.name, match=MatchInfo(n, SOURCE, end))
        return EMPTY_DRAFT

    def observe(self, outcome: Outcome) -> None:
        pass

    def end(self) -> None:
        pass
