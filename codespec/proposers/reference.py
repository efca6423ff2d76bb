"""Reference lookup: a copy pointer into the text being rewritten (or a client's prediction).

Most of an edit's output is the reference copied verbatim, so the best draft is simply "the
reference from where the output is now", as long as the draft stays aligned. The pointer:

- drafts the reference tokens after it, up to the engine's limit (the aligned span is usually
  far longer than any draft, so drafts of 64+ tokens are normal);
- advances over every output token that continues the reference. Positions are byte offsets in
  the reference's UTF-8 text, not token indices, so an output whose token boundaries differ from
  the reference's tokenization (it emitted ``ret`` + ``urn`` where the reference has ``return``)
  stays aligned: the reference is re-tokenized from the new offset until its tokenization meets
  the original one again;
- after a mismatch (an insertion, deletion or replacement) re-anchors: each suffix of the
  output's recent bytes (cut at its token boundaries) is looked up in the reference within a
  window around the place where the output departed, nearest occurrence first, and scores its
  length minus ``distance_weight`` x log2(1 + distance). Longer wins, nearer wins between equals,
  and a far occurrence must be much longer to win, so with repeated lines the pointer keeps the
  occurrence it was on. Without a convincing match it guesses the edit's shape: right after the
  departure, one reference token replaced by one output token (the commonest bug fix); later,
  an insertion that has just ended (the reference resumes where the output left it). A position
  becomes the new centre only after tokens copied from it were accepted.
- while the output is text the reference does not hold (an insertion), drafts from the output
  itself by the context rule (``own_text``; its drafts carry source "context"), since new code
  often repeats what was just written.

Counts of accepted and rejected reference tokens are kept as OpenAI reports them
(``accepted_prediction_tokens``, ``rejected_prediction_tokens``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

from codespec.core.draft import EMPTY_DRAFT, Draft, MatchInfo, Outcome, ProposeContext
from codespec.proposers.context import ContextLookup
from codespec.proposers.setup import ProposerSetup
from codespec.proposers.token_bytes import TokenBytes

TAIL_TOKENS = 32  # output tokens whose bytes are matched against the reference when re-anchoring
RETOKENIZE_BYTES = 64  # reference bytes re-tokenized from an offset that is not a token boundary
CONFIRM_TOKENS = 2  # tokens matched in a row before a position becomes the re-anchoring centre


class ReferenceLookup:
    name = "reference"

    def __init__(
        self,
        reference: str,
        encode: Any,
        start: int = 0,
        window_behind: int = 65536,
        window_ahead: int = 65536,
        min_score: float = -2.0,
        distance_weight: float = 0.5,
        replace_score: float = -2.0,
        own_text: bool | ContextLookup = True,
        own_text_below: float = 4.0,
        tokenizer: Any = None,
        source: Sequence[int] | None = None,
    ) -> None:
        """``encode``: a transformers tokenizer, an object wrapping one (TokenizerAdapter), or a
        function text -> ids (a bound ``tokenizer.encode``; else pass ``tokenizer`` too, whose
        vocabulary maps ids to bytes). ``start``: character offset in ``reference`` where the
        output begins. ``own_text``: draft inserted text from the output itself (True: with a
        table of its own over the output), or the ``ContextLookup`` of the whole sequence that
        its owner (auto) keeps current anyway, read for matches within the output. ``source``: token
        ids the reference lies in (a prompt carrying its code): its ids are read there
        (``TokenBytes.spelled_in``: encoding it again was most of a vLLM request's first step);
        else, or where they do not spell it plainly, it is encoded."""
        if not isinstance(reference, str):
            raise TypeError(f"reference must be text, got {type(reference).__name__}")
        if isinstance(encode, TokenBytes):
            self.codec = encode
        elif callable(encode) and not hasattr(encode, "convert_ids_to_tokens"):
            self.codec = TokenBytes(tokenizer if tokenizer is not None else encode, encode=encode)
        else:
            self.codec = TokenBytes(encode)
        self.reference = reference
        # Drafts for inserted text, from the output so far (the context rule): a table of its own
        # over the output, or the whole sequence's table its owner keeps (``shared_text``).
        self.shared_text = own_text if isinstance(own_text, ContextLookup) else None
        self.own_text = ContextLookup() if own_text is True else None
        self.own_text_below = own_text_below  # re-anchorings scoring less yield to a request-text match
        self.window_behind = window_behind
        self.window_ahead = window_ahead
        self.min_score = min_score  # a match scoring less is no evidence: guess the edit's shape instead
        self.replace_score = replace_score  # the same, right after the departure (one token replaced)
        self.distance_weight = distance_weight
        spelled = self.codec.spelled_in(source, reference) if source is not None else None
        self._ids = spelled if spelled is not None else self.codec.encode(reference)
        pieces = self.codec.pieces(self._ids)
        # byte offset of each reference token (accumulated in C: a request's first step builds this)
        self._starts: list[int] = list(itertools.accumulate(map(len, pieces), initial=0))[:-1]
        # The reference as its tokens' bytes: the UTF-8 text itself for a byte-level tokenizer, and
        # what output tokens will be compared with for any other.
        self._ref = b"".join(pieces)
        self._index_at = dict(zip(self._starts, range(len(self._starts))))
        self._start_byte = len(reference[:start].encode("utf-8"))
        self.accepted_prediction_tokens = 0
        self.rejected_prediction_tokens = 0
        self.begin(())

    @classmethod
    def from_setup(cls, setup: ProposerSetup, text_lookup: ContextLookup | None = None) -> ReferenceLookup:
        """``text_lookup``: the request's context lookup, kept current by its owner, to draft
        inserted text from (with its n-gram lengths); None: a table of its own over the output."""
        request = setup.request
        if request.reference is None:
            raise ValueError(
                "the reference proposer needs a reference (RequestContext.reference): the text being rewritten"
            )
        if setup.target is None:
            raise ValueError("the reference proposer needs the target (for its tokenizer)")
        own_text: bool | ContextLookup = True if text_lookup is None else text_lookup
        return cls(
            request.reference,
            setup.target.tokenizer,
            start=request.reference_start,
            own_text=own_text,
            source=request.reference_source,
        )

    # -- protocol ---------------------------------------------------------------------------

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self._seen = len(prompt_ids)  # sequence tokens already walked through the pointer
        self._aligned = True
        self._streak = CONFIRM_TOKENS  # tokens matched in a row since the last (re-)anchoring
        self._centre = self._start_byte  # where the output last departed: the centre of re-anchoring
        self._departed_at = 0  # sequence index of the first token that departed from the reference
        self._skip = 0  # bytes of the reference token the departing token replaced (if it did)
        self._match_len = 0
        self.anchor_score = math.inf  # aligned since the start
        self._set_pointer(self._start_byte)
        if self.own_text is not None:
            self.own_text.begin(prompt_ids)
        self.accepted_prediction_tokens = 0
        self.rejected_prediction_tokens = 0

    def propose(self, context: ProposeContext) -> Draft:
        tokens = context.token_ids
        if len(tokens) < self._seen:  # a different sequence without begin(): start over
            self.begin(tokens[: context.prompt_len])
        self._seen = max(self._seen, context.prompt_len)
        self._advance(tokens[self._seen :], self._seen)
        self._seen = len(tokens)
        if not self._aligned:
            tail_start = max(context.prompt_len, len(tokens) - TAIL_TOKENS)
            anchored = self._reanchor(tokens[tail_start:], len(tokens) - self._departed_at)
            drafts_own = self.own_text is not None or self.shared_text is not None
            if drafts_own and (not anchored or self.anchor_score < self.own_text_below):
                # Nothing in the reference explains the recent output well: it is new text, which
                # often repeats lines just written. (Only the output is searched: the prompt mostly
                # holds the reference again, and indexing it would cost milliseconds in one step.)
                own = self._own_text_draft(context)
                if own.token_ids:
                    return Draft(own.token_ids, self.name, match=own.match)
            if not anchored:
                return EMPTY_DRAFT
        elif self.own_text is not None:
            self._own_text_draft(context)  # keep its table current: no catching up on a long output later
        draft_ids = self._stream(context.max_len)
        if not draft_ids:
            return EMPTY_DRAFT
        position = self._next if self._next is not None else -1  # token index after any re-tokenized patch
        # Match length: the re-anchoring's match plus every token confirmed since, so a pointer that
        # has been copying for a while lands in a longer-match bucket of auto's acceptance table
        # than one that has just re-anchored (or guessed).
        return Draft(
            tuple(draft_ids), self.name, match=MatchInfo(self._match_len + self._streak, "reference", position)
        )

    def _own_text_draft(self, context: ProposeContext) -> Draft:
        if self.shared_text is not None:
            return self.shared_text.propose_within(context.token_ids, context.prompt_len, context.max_len)
        output = OutputView(context.token_ids, context.prompt_len)
        assert self.own_text is not None  # called only when the pointer drafts its own output
        return self.own_text.propose(ProposeContext(output, 0, context.max_len))

    def observe(self, outcome: Outcome) -> None:
        match = outcome.draft.match
        if outcome.draft.proposer == self.name and match is not None and match.source == "reference":
            self.accepted_prediction_tokens += outcome.accepted
            self.rejected_prediction_tokens += outcome.rejected
        if outcome.sequence_len - len(outcome.emitted) == self._seen:
            self._advance(outcome.emitted, self._seen)
            self._seen = outcome.sequence_len

    def end(self) -> None:
        if self.own_text is not None:
            self.own_text.end()

    @property
    def position(self) -> int:
        """The pointer: byte offset in the reference's UTF-8 text where the output continues."""
        return self._pos

    @property
    def aligned(self) -> bool:
        return self._aligned

    # -- the pointer ------------------------------------------------------------------------

    def _set_pointer(self, position: int) -> None:
        """Point at byte ``position``; re-tokenize from there unless it is a reference token boundary.
        An output token may end inside a character (byte-level tokens split UTF-8): the rest of that
        character is drafted as byte tokens, and re-tokenizing starts at the next character."""
        self._pos = position
        index = self._index_at.get(position)
        if index is not None or position >= len(self._ref):
            self._patch: list[int] = []
            self._next: int | None = index if index is not None else len(self._ids)
            return
        patch: list[int] = []
        offset = position
        while offset < len(self._ref) and self._ref[offset] & 0xC0 == 0x80:  # a UTF-8 continuation byte
            byte_id = self.codec.byte_id(self._ref[offset])
            if byte_id is None:  # no token spells a lone byte: draft nothing until a character starts
                self._patch, self._next = [], None
                return
            patch.append(byte_id)
            offset += 1
        window = self._ref[offset : offset + RETOKENIZE_BYTES]
        text = window.decode("utf-8", errors="ignore")  # a cut character at the window's end drops out
        for token_id in [] if offset in self._index_at else self.codec.encode(text):
            if offset in self._index_at and patch:  # the two tokenizations meet again: resume the original
                break
            patch.append(token_id)
            offset += len(self.codec.token(token_id))
        if offset in self._index_at or offset >= len(self._ref):
            self._patch, self._next = patch, self._index_at.get(offset, len(self._ids))
        else:  # no meeting point in the window: the last token may be cut; re-tokenize after the rest
            self._patch, self._next = patch[:-1], None

    def _stream(self, count: int) -> list[int]:
        """The next ``count`` reference tokens from the pointer."""
        patch = self._patch[:count]
        if len(patch) < count and self._next is not None:
            patch += self._ids[self._next : self._next + count - len(patch)]
        return patch

    def _consume(self) -> None:
        if self._patch:
            self._pos += len(self.codec.token(self._patch.pop(0)))
            if not self._patch and self._next is None:
                self._set_pointer(self._pos)
        else:
            assert self._next is not None  # no patch: the pointer is on a reference token
            self._next += 1
            self._pos = self._starts[self._next] if self._next < len(self._ids) else len(self._ref)

    def _advance(self, tokens: Sequence[int], first_index: int) -> None:
        """Walk output tokens (the first at sequence index ``first_index``) through the pointer;
        stop aligning at the first that departs from the reference."""
        count = len(tokens)
        if count > 1 and self._aligned and not self._patch and self._next is not None:
            # tokens that are the reference's own next tokens (the common case: a copied stretch,
            # or drafts served from a runway) move the pointer at once, as the loop would
            if self._ids[self._next : self._next + count] == list(tokens):
                self._next += count
                self._pos = self._starts[self._next] if self._next < len(self._ids) else len(self._ref)
                self._streak += count
                return
        for offset, token_id in enumerate(tokens):
            if not self._aligned:
                return
            expected = self._stream(1)
            if expected and expected[0] == token_id:
                self._consume()
            else:
                token_bytes = self.codec.token(token_id)
                if not token_bytes or not self._ref.startswith(token_bytes, self._pos):
                    self._depart(first_index + offset, expected)
                    return
                self._set_pointer(self._pos + len(token_bytes))  # same text, other token boundaries
            self._streak += 1

    def _depart(self, index: int, expected: list[int]) -> None:
        """An insertion, deletion or replacement: re-anchor on the next propose. A departure soon
        after an unconfirmed re-anchoring is the same edit still going on, so it keeps its centre."""
        self._aligned = False
        if self._streak >= CONFIRM_TOKENS:
            self._centre = self._pos
            self._departed_at = index
            self._skip = len(self.codec.token(expected[0])) if expected else 0

    def _reanchor(self, tail_ids: Sequence[int], since_departure: int) -> bool:
        """Point after the recent output's best match in the reference near where it departed;
        without a convincing match, guess the edit's shape (one token replaced, or an insertion
        that ends now). False (no draft) when even that has nothing to offer."""
        tail = self.codec.join(tail_ids)
        lengths: list[int] = []
        covered = 0
        for token_id in reversed(tail_ids):
            covered += len(self.codec.token(token_id))
            if not lengths or covered > lengths[-1]:
                lengths.append(covered)
        score, end, length = best_anchor(
            self._ref, tail, lengths, self._centre, self.window_behind, self.window_ahead, self.distance_weight
        )
        self.anchor_score = score  # how convincing this re-anchoring was (-inf: a guess)
        if score < (self.replace_score if since_departure <= 1 else self.min_score):
            self.anchor_score = -math.inf
            # No convincing match: one token replaced by one (the common bug fix), else the inserted
            # text ends here and the reference resumes where the output left it.
            end = self._centre + (self._skip if since_departure <= 1 else 0)
            length = 0
            if end >= len(self._ref):
                return False
        self._aligned = True
        self._match_len = matched_tokens(self.codec, tail_ids, length)
        self._streak = 0  # the match itself is no confirmation: tokens copied from here will be
        self._set_pointer(end)
        return True


def best_anchor(
    text: bytes, tail: bytes, lengths: Sequence[int], centre: int, behind: int, ahead: int, distance_weight: float
) -> tuple[float, int, int]:
    """(score, end, length): the suffix of ``tail`` (of one of ``lengths`` bytes, ascending) whose
    occurrence in ``text`` best trades length against distance from ``centre``; an occurrence
    ending at ``end`` scores length - distance_weight * log2(1 + |end - centre|)."""
    lo = max(0, centre - behind)
    hi = min(len(text), centre + ahead)
    best = (-math.inf, centre, 0)
    for length in lengths:
        needle = tail[-length:]
        found_any = False
        after = text.find(needle, max(lo, centre - length + 1), hi)  # ends after the centre
        before = text.rfind(needle, lo, min(hi, centre))  # ends at or before the centre
        for start in (after, before):
            if start < 0:
                continue
            found_any = True
            end = start + length
            score = length - distance_weight * math.log2(1 + abs(end - centre))
            if score > best[0]:
                best = (score, end, length)
        if not found_any:
            break  # a longer suffix contains this one: it cannot occur either
    return best


class OutputView(Sequence[int]):
    """``tokens[start:]`` without copying a long sequence every step."""

    __slots__ = ("tokens", "start")

    def __init__(self, tokens: Sequence[int], start: int) -> None:
        self.tokens, self.start = tokens, start

    def __len__(self) -> int:
        return len(self.tokens) - self.start

    def __getitem__(self, item):
        if isinstance(item, slice):
            first, stop, step = item.indices(len(self))
            return self.tokens[self.start + first : self.start + stop : step]
        if item < 0:
            item += len(self)
        if not 0 <= item < len(self):
            raise IndexError(item)
        return self.tokens[self.start + item]


def matched_tokens(codec: TokenBytes, tail_ids: Sequence[int], length: int) -> int:
    """How many of the last tokens lie wholly inside the last ``length`` bytes."""
    count = covered = 0
    for token_id in reversed(tail_ids):
        covered += len(codec.token(token_id))
        if covered > length:
            break
        count += 1
    return count
