"""Index lookup: draft from the workspace and session history, or from the request itself.

Two sources are asked every step: ``WorkspaceIndex.lookup`` (workspace documents and history,
ranked same-document-near-the-cursor first, then recency, then frequency) and the request's own
prompt + output (the context-lookup rule). The longest suffix match wins, because a longer match
predicts the continuation better than any ranking does; on a tie the index's ranking decides and
the request's own text comes last. A match in another document or the session history drafts only
from ``min_other_match`` tokens: two tokens that also occur in some other file say little about
what follows here (docs/index.md "Which matches draft").

While the output keeps copying one place of the current document, the ranking's "cursor" follows
that place (also when another proposer's draft was the one verified, as long as the emitted
tokens follow this proposer's own draft of that step), so with repeated lines the occurrence
being copied stays first. Each outcome is
reported to the index per source (``record_outcome``) for its acceptance statistics.
"""

from __future__ import annotations

from collections.abc import Sequence

from codespec.core.draft import EMPTY_DRAFT, Draft, MatchInfo, Outcome, ProposeContext
from codespec.proposers.context import ContextLookup
from codespec.proposers.setup import IndexConfig, ProposerSetup

CONTEXT_SOURCE = "context"


class IndexLookup:
    name = "index"

    def __init__(
        self,
        index,
        uri: str | None = None,
        cursor: int | None = None,
        max_candidates: int = 4,
        use_context: bool = True,
        min_other_match: int = IndexConfig().other_match(under_auto=False),
    ) -> None:
        """``cursor``: character offset in document ``uri`` (as editors send it)."""
        self.index = index
        self.uri = uri if uri is not None and index.has_document(uri) else None
        self.max_candidates = max_candidates
        self.min_other_match = min_other_match
        self.context = ContextLookup(index.max_ngram, index.min_ngram) if use_context else None
        # The index's own char -> token conversion (its token starts are cached per document).
        self._start_cursor = (
            index.token_offset(self.uri, cursor) if self.uri is not None and cursor is not None else None
        )
        self.begin(())

    @classmethod
    def from_setup(cls, setup: ProposerSetup, under_auto: bool = False, context_beside: bool = False) -> IndexLookup:
        """``under_auto``: auto sees every match and prices it by length (``IndexConfig.other_match``).
        ``context_beside``: a context lookup drafts beside this one (auto's), so the request's own
        text is asked there, not twice."""
        request = setup.request
        if request.index is None:
            raise ValueError("the index proposer needs an index (RequestContext.index: a WorkspaceIndex)")
        config = setup.config.index
        return cls(
            request.index,
            uri=request.uri,
            cursor=request.cursor,
            max_candidates=config.max_candidates,
            use_context=not context_beside,
            min_other_match=config.other_match(under_auto),
        )

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self._cursor = self._start_cursor
        self._last = EMPTY_DRAFT  # this step's own draft, whoever's draft was verified
        if self.context is not None:
            self.context.begin(prompt_ids)

    def propose(self, context: ProposeContext) -> Draft:
        candidates = self.index.lookup(
            context.token_ids, context.max_len, self.uri, self._cursor, self.max_candidates, skip=self._start_cursor
        )
        own = self.context.propose(context) if self.context is not None else EMPTY_DRAFT
        best = next((c for c in candidates if c.token_ids and self._drafts_from(c)), None)
        own_match = own.match if own.token_ids else None  # a context draft always says where it matched
        if own_match is not None and (best is None or own_match.match_len > best.match_len):
            self._last = Draft(
                own.token_ids, self.name, match=MatchInfo(own_match.match_len, CONTEXT_SOURCE, own_match.position)
            )
        elif best is None:
            self._last = EMPTY_DRAFT
        else:
            self._last = Draft(
                tuple(best.token_ids[: context.max_len]),
                self.name,
                match=MatchInfo(best.match_len, best.source, best.position),
            )
        return self._last

    def _drafts_from(self, candidate) -> bool:
        same_document = self.uri is not None and candidate.source == self.uri
        return same_document or candidate.match_len >= self.min_other_match

    def observe(self, outcome: Outcome) -> None:
        own, self._last = self._last, EMPTY_DRAFT
        draft = outcome.draft
        if draft.proposer == self.name and draft.match is not None and len(draft):
            self.index.record_outcome(draft.match.source, len(draft), outcome.accepted)
        if own.match is not None and own.match.source == self.uri and own.token_ids[:1] == outcome.emitted[:1]:
            # The output follows the place this step's own draft copied from (whoever's draft was
            # verified: under auto another proposer often wins while copying the same text): rank
            # that place first next time. An output that leaves it (an insertion) keeps the cursor.
            # The index skips only the completion's own position (``skip`` in the lookup).
            self._cursor = own.match.position + len(outcome.emitted)

    def end(self) -> None:
        if self.context is not None:
            self.context.end()

    @property
    def cursor(self) -> int | None:
        """The token offset in ``uri`` that the index's locality ranking is centred on now."""
        return self._cursor
