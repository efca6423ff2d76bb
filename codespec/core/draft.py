"""The proposer protocol: what a drafter returns and what it is told afterwards.

Vocabulary (used everywhere in codespec, as in docs/design.md §2):
- *draft tokens*: the K tokens a proposer suggests after the current sequence;
- *accepted* tokens: the leading draft tokens that survive verification;
- the *recovered* token: what the target emits at the first rejected position;
- the *bonus* token: what the target emits after K accepted drafts (position K+1).

A proposer is two calls, in the spirit of transformers' ``CandidateGenerator`` but typed:
``propose(context) -> Draft`` and ``observe(outcome)``. An empty draft means "do not speculate
this step"; the engine then runs a plain one-token step. ``begin``/``end`` bracket a request so a
stateful proposer (copy pointer, draft-model KV cache) can reset.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # torch stays out of import time for the CLI's help and for index/
    import torch

    from codespec.core.config import SamplingParams

# The request argument that carries a reference to draft from (a client's prediction) to codespec's
# proposer inside a served engine: the door sends it in vLLM's ``vllm_xargs``, the drafter reads it
# from the request's ``SamplingParams.extra_args`` (docs/vllm.md, "Predicted Outputs").
REFERENCE_ARG = "codespec_prediction"


@dataclass(frozen=True)
class MatchInfo:
    """Where a lookup draft came from, for stats, debugging and the policy."""

    match_len: int  # tokens of context that matched (the n of the n-gram)
    source: str = ""  # e.g. "context", "workspace:path.py", "history", "reference"
    position: int = -1  # token offset of the continuation inside its source


@dataclass(frozen=True)
class Draft:
    """K proposed tokens; empty means "do not speculate".

    ``draft_probs`` is set only by proposers that *sampled* their tokens from a distribution q
    (a draft model under sampling): row i is the processed q at draft position i. Lookup drafts
    are deterministic, so q is one-hot and ``draft_probs`` stays None. Claiming a q the tokens
    were not sampled from breaks exactness.
    """

    token_ids: tuple[int, ...] = ()
    proposer: str = ""
    draft_probs: torch.Tensor | None = None  # [K, V] float32, rows sum to 1
    match: MatchInfo | None = None

    def __post_init__(self) -> None:
        if self.draft_probs is not None and self.draft_probs.shape[0] != len(self.token_ids):
            raise ValueError(f"draft_probs has {self.draft_probs.shape[0]} rows for {len(self.token_ids)} draft tokens")

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def is_empty(self) -> bool:
        return not self.token_ids

    def truncated(self, max_len: int) -> Draft:
        """The first ``max_len`` draft tokens (the engine caps drafts by budget and context)."""
        if max_len >= len(self.token_ids):
            return self
        probs = None if self.draft_probs is None else self.draft_probs[:max_len]
        return Draft(self.token_ids[:max_len], self.proposer, probs, self.match)


EMPTY_DRAFT = Draft()


@dataclass(frozen=True, kw_only=True)
class BatchShare:
    """A shared forward, as a draft length should be priced in it (docs/architecture.md,
    "Batching"): it serves ``requests`` requests, and ``row_cost`` is the scheduler's measured cost
    of a forward by its rows. A request's part of it is its share of the fixed cost and its own
    rows: a token it is not drafted now costs it another row-step later, in a forward that runs for
    the others anyway, so the others' tokens do not enter its price."""

    requests: int = 1
    row_cost: tuple[float, float] | None = None  # the scheduler's fit: forward seconds ~ a + b * rows


ALONE = BatchShare()


@dataclass
class ProposeContext:
    """What a proposer may look at when drafting one step.

    ``token_ids`` is the whole sequence so far (prompt + accepted output); ``prompt_len`` splits it.
    ``max_len`` is the most draft tokens the engine will verify this step (policy, budget and
    context window already applied). ``sampling`` and ``generator`` let a model proposer sample
    its q with the same transforms as the target and a request-seeded generator.
    """

    token_ids: Sequence[int]
    prompt_len: int
    max_len: int
    sampling: SamplingParams | None = None
    generator: torch.Generator | None = None
    batch: BatchShare = ALONE  # who else the step's forward serves

    @property
    def output_len(self) -> int:
        return len(self.token_ids) - self.prompt_len


@dataclass(frozen=True)
class Outcome:
    """What verification did with a draft, reported back to the proposer and the policy."""

    draft: Draft
    accepted: int  # number of leading draft tokens accepted (0..len(draft))
    emitted: tuple[int, ...]  # accepted drafts + the recovered or bonus token (may be cut by stop/budget)
    sequence_len: int  # len(prompt + output) after this step
    proposal_s: float = 0.0  # measured cost of drafting this step
    verify_s: float = 0.0  # measured cost of the target forward + verification
    shared: bool = False  # the forward also ran other requests' rows: its time is the batch's, not this step's

    @property
    def rejected(self) -> int:
        return len(self.draft) - self.accepted


@runtime_checkable
class Proposer(Protocol):
    """A drafter. Implementations live in ``proposers/``, listed by name in ``proposers/registry.py``."""

    name: str

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """A request starts with this prompt; drop per-request state."""

    def propose(self, context: ProposeContext) -> Draft:
        """Up to ``context.max_len`` draft tokens continuing ``context.token_ids``."""

    def observe(self, outcome: Outcome) -> None:
        """Feedback after verification: advance pointers, roll back caches, update statistics."""

    def end(self) -> None:
        """The request is over (finished, cancelled or failed); release per-request resources."""


@runtime_checkable
class Continues(Protocol):
    """A proposer whose lookup drafts follow a chain (a copy pointer, a match's continuation) that
    it can draft further than asked, so a caller may serve the next drafts from it while they are
    accepted whole, and book them afterwards (``AutoProposer``; vLLM's drafter uses it)."""

    def continuation(self, context: ProposeContext, max_len: int) -> tuple[int, ...]:
        """This step's draft continued to up to ``max_len`` tokens; () when it cannot be."""

    def credit(self, name: str, match_len: int | None, passed: int, rejected_next: bool, times: int = 1) -> None:
        """Book ``times`` drafts alike of ``name``'s chain that the caller served without asking."""


@runtime_checkable
class CountsPrediction(Protocol):
    """A proposer drafting a client's predicted output (the copy pointer) counts its tokens the way
    OpenAI's ``usage.completion_tokens_details`` does."""

    accepted_prediction_tokens: int
    rejected_prediction_tokens: int


class NoDraft:
    """The baseline: never speculates, so every step is one target forward and one token."""

    name = "none"

    def begin(self, prompt_ids: Sequence[int]) -> None:
        pass

    def propose(self, context: ProposeContext) -> Draft:
        return EMPTY_DRAFT

    def observe(self, outcome: Outcome) -> None:
        pass

    def end(self) -> None:
        pass
