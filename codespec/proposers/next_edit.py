"""Next-edit lookup: the copy pointer over the window *as the user's last edits would change it*.

A next-edit rewrite copies most of its editable window and changes it where the user's recent
edit applies again (docs/next-edit.md). The plain copy pointer (``ReferenceLookup``) drafts the
window as it is, so at every changed place its draft is rejected and it re-anchors after the
target has written the change token by token. This proposer runs two pointers over the same
output: one over the *predicted* window (``proposers.edit_rules.predict``: the window with the
last edits' rules applied), one over the window itself. The predicted pointer drafts while it is
at least as well anchored as the plain one, so a rename is drafted through the renamed name, and
where the prediction is wrong the plain pointer's draft takes over at its next step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from codespec.core.draft import EMPTY_DRAFT, Draft, MatchInfo, Outcome, ProposeContext
from codespec.proposers.edit_rules import predict
from codespec.proposers.reference import ReferenceLookup
from codespec.proposers.setup import ProposerSetup


class NextEditLookup:
    name = "next-edit"

    def __init__(self, reference: str, edits: Sequence[tuple[str, str]], encode: Any, start: int = 0) -> None:
        """``reference``: the editable window; ``edits``: (before, after) of the user's recent edits,
        oldest first; ``encode``: as for ``ReferenceLookup``."""
        self.predicted_text = predict(reference, edits)
        self.predicted = ReferenceLookup(
            self.predicted_text, encode, start=_start_in(self.predicted_text, reference, start)
        )
        self.plain = ReferenceLookup(reference, encode, start=start)
        self.accepted_prediction_tokens = 0
        self.rejected_prediction_tokens = 0

    @classmethod
    def from_setup(cls, setup: ProposerSetup) -> NextEditLookup:
        request = setup.request
        if request.reference is None or not request.edits:
            raise ValueError(
                "the next-edit proposer needs a reference (the editable window) and the user's recent edits"
            )
        if setup.target is None:
            raise ValueError("the next-edit proposer needs the target (for its tokenizer)")
        return cls(request.reference, request.edits, setup.target.tokenizer, start=request.reference_start)

    @property
    def changes(self) -> bool:
        """Whether the edits change anything in the window (else this is the plain pointer)."""
        return self.predicted_text != self.plain.reference

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self.predicted.begin(prompt_ids)
        self.plain.begin(prompt_ids)
        self.accepted_prediction_tokens = self.rejected_prediction_tokens = 0

    def propose(self, context: ProposeContext) -> Draft:
        predicted = self.predicted.propose(context)
        plain = self.plain.propose(context)
        if predicted.token_ids and (not plain.token_ids or self.predicted.anchor_score >= self.plain.anchor_score):
            chosen, source = predicted, "next-edit"
        elif plain.token_ids:
            chosen, source = plain, "reference"
        else:
            return EMPTY_DRAFT
        match = chosen.match or MatchInfo(0)
        if match.source == "context":  # the pointer drafts its own output (an insertion)
            source = "context"
        return Draft(chosen.token_ids, self.name, match=MatchInfo(match.match_len, source, match.position))

    def observe(self, outcome: Outcome) -> None:
        match = outcome.draft.match
        if outcome.draft.proposer == self.name and match is not None and match.source in ("next-edit", "reference"):
            self.accepted_prediction_tokens += outcome.accepted
            self.rejected_prediction_tokens += outcome.rejected
        self.predicted.observe(outcome)
        self.plain.observe(outcome)

    def end(self) -> None:
        self.predicted.end()
        self.plain.end()


def _start_in(predicted: str, reference: str, start: int) -> int:
    """Where the output starts in the predicted text: the same place when the text before it is
    unchanged (the usual case, start 0), else its end (the pointer re-anchors from there)."""
    return start if predicted[:start] == reference[:start] else min(start, len(predicted))
