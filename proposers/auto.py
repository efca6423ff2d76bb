"""``auto``: per step, the proposer and draft length with the best expected tokens per second.

Lookup first: lookup proposers (context, and reference / index when configured) are nearly free,
so every step asks all of them; their drafts and match lengths are what the decision conditions on.
Model proposers (draft model, early exit) cost real time per token, so they draft only when the
policy picks them (or probes them). The arithmetic lives in ``proposers/policy.py``.

Statistics, kept across requests (a server's later requests start informed):
- acceptance by depth per proposer and per (proposer, match-length bucket), from every verified
  draft; lookup drafts that were *not* chosen are scored against what the target emitted anyway
  ("shadow" evaluation: under greedy that is exactly what verification would have said, under
  sampling it has the same distribution), so lookups keep being measured while speculation is off;
- proposal seconds per model proposer (a + b k, timed here) and verification seconds by draft
  length (a + b k, measured by the engine: ``Outcome.verify_s``).
Model proposers get no shadow score, so when speculation is off the policy probes the most
promising one every so often (``ProbeSchedule``: the interval doubles while probes fail).

Sub-proposer lifecycle: every sub-proposer sees ``begin``, every engine ``Outcome`` (one per step,
whoever drafted; ``outcome.draft.proposer`` says whose draft was verified, as with a lone proposer
that did not draft) and ``end``. So a copy pointer advances over all emitted tokens and a draft
model's KV cache is rolled back to the accepted sequence even on steps it did not draft.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from codespec.draft import EMPTY_DRAFT, Draft, Outcome, ProposeContext, Proposer
from codespec.errors import CodespecError
from codespec.kv import common_prefix_len
from proposers.draft_model import ModelDrafter
from proposers.policy import (
    AcceptanceTable,
    Candidate,
    Choice,
    ForwardCosts,
    LinearCost,
    PolicyConfig,
    ProbeSchedule,
    best_length,
    choose,
)
from proposers.setup import ProposerSetup

log = logging.getLogger(__name__)

LOOKUP, MODEL = "lookup", "model"


@dataclass
class PolicyState:
    """What the policy has learned: acceptance by depth and the cost fits. It outlives a proposer
    instance: ``from_setup`` hands every auto built for the same target and candidates the same
    state (a process-wide table), so a request starts with what earlier ones measured, whether
    the caller keeps one proposer for a server's lifetime or builds one per request."""

    acceptance: AcceptanceTable
    verify_cost: ForwardCosts
    proposal_costs: dict[str, LinearCost] = field(default_factory=dict)

    @classmethod
    def fresh(cls, config: PolicyConfig) -> PolicyState:
        return cls(AcceptanceTable(config.acceptance_decay, config.prior_acceptance, config.prior_strength),
                   ForwardCosts(config.cost_decay))


_SHARED_STATES: dict[tuple, PolicyState] = {}


def shared_state(target, candidates: Sequence, config: PolicyConfig) -> PolicyState:
    """The process-wide policy state for this target and these candidate proposers."""
    key = (getattr(target, "name", ""), tuple(p.name for p in candidates), repr(config))
    return _SHARED_STATES.setdefault(key, PolicyState.fresh(config))


class _Sub:
    """One sub-proposer and what it did this step."""

    def __init__(self, proposer: Proposer, kind: str, proposal_cost: LinearCost) -> None:
        self.proposer = proposer
        self.kind = kind
        self.name = proposer.name
        self.proposal_cost = proposal_cost
        self.draft: Draft = EMPTY_DRAFT
        self.proposal_s = 0.0


class AutoProposer:
    name = "auto"

    def __init__(self, lookups: Sequence[Proposer] = (), models: Sequence[Proposer] = (),
                 config: PolicyConfig = PolicyConfig(), state: PolicyState | None = None) -> None:
        names = [p.name for p in (*lookups, *models)]
        if len(set(names)) != len(names):
            raise ValueError(f"sub-proposer names must be unique, got {names}")
        self.config = config
        self.state = state or PolicyState.fresh(config)
        costs = self.state.proposal_costs
        self.subs = [_Sub(p, LOOKUP, costs.setdefault(p.name, LinearCost("proportional"))) for p in lookups] + \
                    [_Sub(p, MODEL, costs.setdefault(p.name, LinearCost("proportional"))) for p in models]
        self.acceptance = self.state.acceptance
        self.verify_cost = self.state.verify_cost
        self.probes = ProbeSchedule(config.probe_interval, config.probe_max_interval)
        self.decisions: deque[Choice] = deque(maxlen=4096)  # the latest per-step choices, for logs and tests
        self._chosen: _Sub | None = None
        self._probing = False
        self._proposed = False
        self._steps = 0

    @classmethod
    def from_setup(cls, setup: ProposerSetup) -> AutoProposer:
        return build_auto(setup)

    # -- protocol ------------------------------------------------------------------------------
    def begin(self, prompt_ids: Sequence[int]) -> None:
        self._steps = 0
        self._chosen = None
        self._proposed = False
        for sub in self.subs:
            sub.draft, sub.proposal_s = EMPTY_DRAFT, 0.0
            sub.proposer.begin(prompt_ids)

    def propose(self, context: ProposeContext) -> Draft:
        self._proposed = True
        # 1. Every lookup drafts (nearly free; its draft and match length inform the decision).
        for sub in self.subs:
            sub.draft, sub.proposal_s = EMPTY_DRAFT, 0.0
            if sub.kind == LOOKUP:
                start = time.perf_counter()
                sub.draft = sub.proposer.propose(context).truncated(context.max_len)
                sub.proposal_s = time.perf_counter() - start

        # 2. Score every option; a model's cost is its fitted proposal time, a lookup's is sunk.
        if self.config.verify_cost is not None:
            verify_fit, plain_s = self.config.verify_cost, self.config.verify_cost[0]
        else:
            verify_fit, plain_s = self.verify_cost.verify_fit(), self.verify_cost.plain()
        candidates = [self._candidate(sub, context.max_len, verify_fit) for sub in self.subs]
        decision, _ = choose([c for c in candidates if c is not None], verify_fit, self.config.margin,
                             self.config.waste, plain_s)

        # 3. Nothing pays: plain decoding, but probe a model proposer now and then.
        self._probing = False
        if decision.name is None and self.probes_due(candidates):
            decision = self._probe(candidates, verify_fit)
            self._probing = True
        self.decisions.append(decision)
        if decision.name is None:
            self._chosen = None
            return EMPTY_DRAFT

        # 4. The chosen proposer's draft (a model drafts now, exactly k tokens at most).
        sub = self._sub(decision.name)
        if sub.kind == MODEL:
            start = time.perf_counter()
            sub.draft = sub.proposer.propose(replace_max_len(context, decision.draft_len))
            sub.proposal_s = time.perf_counter() - start
            caught_up = not isinstance(sub.proposer, ModelDrafter) or sub.proposer.last_fed <= self.config.catch_up_limit
            if caught_up and len(sub.draft):
                sub.proposal_cost.add(len(sub.draft), sub.proposal_s)
        self._chosen = sub if len(sub.draft) else None
        return sub.draft.truncated(decision.draft_len) if len(sub.draft) else EMPTY_DRAFT

    def observe(self, outcome: Outcome) -> None:
        if self._steps > 0:  # the first step's forward includes the prompt prefill
            self.verify_cost.add(len(outcome.draft), outcome.verify_s)
        self._steps += 1
        chosen = self._chosen if self._proposed else None
        for sub in self.subs:
            own = sub.draft if self._proposed else EMPTY_DRAFT
            if sub is chosen:
                self._record(sub, outcome.draft, outcome.accepted, outcome.accepted < len(outcome.draft))
            elif sub.kind == LOOKUP and len(own):
                # Shadow score: how many of its tokens the emitted ones confirm; a rejection is
                # known only where an emitted token disagrees.
                confirmed = common_prefix_len(own.token_ids, outcome.emitted)
                self._record(sub, own, confirmed, confirmed < min(len(own), len(outcome.emitted)))
            sub.proposer.observe(outcome)
        if chosen is not None:
            if self._probing:
                self.probes.probed()
            else:
                self.probes.speculated()
        for sub in self.subs:
            sub.draft, sub.proposal_s = EMPTY_DRAFT, 0.0
        self._chosen, self._proposed, self._probing = None, False, False

    def end(self) -> None:
        for sub in self.subs:
            try:
                sub.proposer.end()
            except Exception:  # one failing sub-proposer must not keep the others from cleaning up
                log.exception("auto: %s.end() failed", sub.name)

    # -- helpers -------------------------------------------------------------------------------
    def _sub(self, name: str) -> _Sub:
        return next(sub for sub in self.subs if sub.name == name)

    def probes_due(self, candidates: Sequence[Candidate | None]) -> bool:
        """Count a plain step; True when a model proposer should be probed now."""
        return any(c is not None and self._sub(c.name).kind == MODEL for c in candidates) and self.probes.plain_step()

    def _probe(self, candidates: Sequence[Candidate | None], verify_fit: tuple[float, float]) -> Choice:
        """The most promising model proposer, with a short draft (its best length, capped)."""
        models = [c for c in candidates if c is not None and self._sub(c.name).kind == MODEL]
        best = max((best_length(c, verify_fit, self.config.waste) for c in models), key=lambda choice: choice.rate)
        return replace(best, draft_len=min(self.config.probe_max_len, best.draft_len))

    def _record(self, sub: _Sub, draft: Draft, passed: int, rejected_next: bool) -> None:
        match_len = draft.match.match_len if draft.match is not None else None
        self.acceptance.record(sub.name, match_len, passed, rejected_next)

    def _candidate(self, sub: _Sub, max_len: int, verify_fit: tuple[float, float]) -> Candidate | None:
        if sub.kind == LOOKUP:
            if not len(sub.draft):
                return None
            match_len = sub.draft.match.match_len if sub.draft.match is not None else None
            rates = self.acceptance.estimates(sub.name, match_len, len(sub.draft), self.config.lookup_continuation)
            return Candidate(sub.name, rates, len(sub.draft))
        # Untimed model: assume a tenth of a forward per token, so it gets tried once.
        fixed = (self.config.proposal_costs or {}).get(sub.name)
        proposal = fixed or sub.proposal_cost.fit() or (0.0, 0.1 * verify_fit[0])
        max_len = min(max_len, self.config.model_max_len)
        return Candidate(sub.name, self.acceptance.estimates(sub.name, None, max_len), max_len, proposal)

    def summary(self) -> dict:
        """Current estimates, for logs and benchmarks."""
        return {
            "verify_s": self.verify_cost.fit(),
            "plain_s": self.verify_cost.plain_measured,
            "proposal_s": {sub.name: sub.proposal_cost.fit() for sub in self.subs if sub.kind == MODEL},
            "acceptance": {name: [round(a, 3) for a in table.estimates(8, self.acceptance.prior)]
                           for name, table in self.acceptance.by_proposer.items()},
            "probe_interval": self.probes.interval,
        }


def replace_max_len(context: ProposeContext, max_len: int) -> ProposeContext:
    return ProposeContext(context.token_ids, context.prompt_len, max_len, context.sampling, context.generator)


def build_auto(setup: ProposerSetup, models: Sequence[Proposer] | None = None,
               state: PolicyState | None = None) -> AutoProposer:
    """``auto`` for one request, as the server, the CLI and the bench all build it.

    Lookups: context always, reference / index when the request has them. ``models``: long-lived
    model proposers the caller shares between requests (one request at a time uses them); None
    builds them here (``model_proposers``). ``state``: the policy statistics to continue from; None
    takes the process-wide table for this target and candidate set (``AutoConfig.shared_state``) or
    starts fresh. ``AutoConfig.candidates`` restricts every set.
    """
    from proposers.registry import create_proposer

    wanted = setup.config.auto.candidates

    def allowed(name: str) -> bool:
        return wanted is None or name in wanted

    lookups: list[Proposer] = [create_proposer("context", setup)] if allowed("context") else []
    for name, given in (("reference", setup.request.reference), ("index", setup.request.index)):
        if allowed(name) and given is not None:
            lookups.append(create_proposer(name, setup))
    chosen = model_proposers(setup) if models is None else list(models)
    chosen = [model for model in chosen if allowed(model.name)]
    config = setup.config.auto.policy
    if state is None and setup.config.auto.shared_state:
        state = shared_state(setup.target, [*lookups, *chosen], config)
    return AutoProposer(lookups, chosen, config, state)


def model_proposers(setup: ProposerSetup, shipped_draft: bool = True) -> list[Proposer]:
    """The draft model (the configured one; else, with ``shipped_draft``, the shipped one when it fits
    the target) and early exit (a Llama-style layer stack); none for a tokenizer-only target."""
    from proposers.registry import create_proposer

    if not _is_model_target(setup.target):  # model-free simulate
        return []
    wanted = setup.config.auto.candidates
    models: list[Proposer] = []
    if wanted is None or "draft" in wanted:
        draft = draft_for_auto(setup) if shipped_draft or setup.config.draft.path else None
        if draft is not None:
            models.append(draft)
    if (wanted is None or "early-exit" in wanted) and supports_early_exit(setup.target):
        models.append(create_proposer("early-exit", setup))
    return models


def _is_model_target(target) -> bool:
    return target is not None and hasattr(target, "new_cache") and hasattr(target, "forward")


def draft_for_auto(setup) -> Proposer | None:
    """A draft model named in the options (errors are the user's to see), else the shipped one if it
    shares the target's tokenizer (a different target simply runs without it)."""
    from proposers.draft_model import default_draft_path
    from proposers.registry import create_proposer

    if setup.config.draft.path:
        return create_proposer("draft", setup)
    if default_draft_path() is None:
        return None
    try:
        return create_proposer("draft", setup)
    except CodespecError as error:
        log.info("auto: the shipped draft model does not fit this target (%s)", error)
        return None


def supports_early_exit(target) -> bool:
    layers = getattr(getattr(getattr(target, "model", None), "model", None), "layers", None)
    return layers is not None and len(layers) >= 2
