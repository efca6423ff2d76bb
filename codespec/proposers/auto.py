"""``auto``: per step, the proposer and draft length with the best expected tokens per second.

Lookup first: lookup proposers (context, and reference / index when configured) are nearly free,
so every step asks them; their drafts and match lengths are what the decision conditions on. A
lookup that costs a real share of a fast forward (the workspace index next to a tiny model's CPU
step) is asked only while it pays for itself (``proposers/looks.py``).
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
from dataclasses import replace

from codespec.core.draft import EMPTY_DRAFT, Draft, Outcome, ProposeContext, Proposer
from codespec.core.target import common_prefix_len
from codespec.proposers.context import ContextLookup
from codespec.proposers.costs import LinearCost, VerifyCost, cost_points, verify_seconds
from codespec.proposers.draft_model import ModelDrafter
from codespec.proposers.index_lookup import IndexLookup
from codespec.proposers.looks import LookGate
from codespec.proposers.material import MaterialLookup
from codespec.proposers.models import model_proposers
from codespec.proposers.next_edit import NextEditLookup
from codespec.proposers.outputs import OutputsLookup
from codespec.proposers.policy import (
    STOP_BELOW,
    Candidate,
    Choice,
    PolicyConfig,
    PolicyState,
    ProbeSchedule,
    best_length,
    choose,
    request_share,
)
from codespec.proposers.reference import ReferenceLookup
from codespec.proposers.setup import ProposerSetup

log = logging.getLogger(__name__)

LOOKUP, MODEL = "lookup", "model"
# Asked on every step: the request's own text (a hashed table, microseconds) is what the other
# lookups must add to (proposers/looks.py).
BASELINE_LOOKUP = "context"
# Asked on an idle step too, to see whether a match could pay: one hashed table each, microseconds
# (the request's own text, and the session's earlier outputs where they are kept).
FREE_LOOKUPS = (BASELINE_LOOKUP, OutputsLookup.name)
BREAK_EVEN_EVERY = 64  # steps between refreshes of the idle check's break-even acceptance
PLAIN = Choice(None, 0, 1.0, 0.0)  # the decision of an idle step that did not look


class _Sub:
    """One sub-proposer and what it did this step."""

    def __init__(self, proposer: Proposer, kind: str, proposal_cost: LinearCost, gate: LookGate | None = None) -> None:
        self.proposer = proposer
        self.kind = kind
        self.name = proposer.name
        self.proposal_cost = proposal_cost
        self.gate = gate  # lookups only
        self.draft: Draft = EMPTY_DRAFT
        self.proposal_s = 0.0
        self.asked = False  # a lookup asked this step


class AutoProposer:
    name = "auto"

    def __init__(
        self,
        lookups: Sequence[Proposer] = (),
        models: Sequence[Proposer] = (),
        config: PolicyConfig = PolicyConfig(),
        state: PolicyState | None = None,
    ) -> None:
        names = [p.name for p in (*lookups, *models)]
        if len(set(names)) != len(names):
            raise ValueError(f"sub-proposer names must be unique, got {names}")
        self.config = config
        self.state = state or PolicyState.fresh(config)
        costs, gates = self.state.proposal_costs, self.state.look_gates
        self.subs = [
            _Sub(
                p,
                LOOKUP,
                costs.setdefault(p.name, LinearCost("proportional")),
                None if p.name == BASELINE_LOOKUP else gates.setdefault(p.name, LookGate()),
            )
            for p in lookups
        ] + [_Sub(p, MODEL, costs.setdefault(p.name, LinearCost("proportional"))) for p in models]
        self.acceptance = self.state.acceptance
        self.verify_cost = self.state.verify_cost
        self.probes = ProbeSchedule(config.probe_interval, config.probe_max_interval)
        self.decisions: deque[Choice] = deque(maxlen=4096)  # the latest per-step choices, for logs and tests
        self.idle = self.state.idle
        self.skipped_looks = 0  # idle steps answered "no draft" without looking (for reports)
        self._looked_at = 0.0  # when this step's look started (idle: charged to the budget)
        self._last_end = 0.0
        self._chosen: _Sub | None = None
        self._probing = False
        self._proposed = False
        self._steps = 0
        self._steps_seen = 0  # observes over this proposer's life (for refreshing _break_even)
        self._free = [sub for sub in self.subs if sub.name in FREE_LOOKUPS]
        self._break_even, self._break_even_at = 0.0, 0
        # Plain steps in a row, this request's own: in a batch (vLLM's rows) every request has its
        # own, and one where drafts keep paying must not keep the others looking.
        self._plain_streak = 0
        self._token_s = 0.0  # what a token right was worth this step (0: unpriced), for the look gates

    @classmethod
    def from_setup(cls, setup: ProposerSetup) -> AutoProposer:
        return build_auto(setup)

    # -- protocol ------------------------------------------------------------------------------
    def begin(self, prompt_ids: Sequence[int]) -> None:
        self._steps = 0
        self._last_end = 0.0
        # A new request brings new text to look in: its first step looks even when the session's
        # lookups stopped paying (one plain step more and it is idle again).
        self._plain_streak = min(self.state.plain_streak, self.config.idle_after - 1)
        self._chosen = None
        self._proposed = False
        for sub in self.subs:
            sub.draft, sub.proposal_s, sub.asked = EMPTY_DRAFT, 0.0, False
            sub.proposer.begin(prompt_ids)

    def propose(self, context: ProposeContext) -> Draft:
        self._proposed = True
        started = time.perf_counter()
        for sub in self.subs:
            sub.draft, sub.proposal_s, sub.asked = EMPTY_DRAFT, 0.0, False
        # (modelled costs, as in tests and model-free replays: a look costs nothing in that time)
        idle = self._plain_streak >= self.config.idle_after and self.config.verify_cost is None
        if idle and not self.idle.allows(self.state.look_s) and not self._free_lookups_could_pay(context):
            # 0. Speculation is off, looking again would overrun its share of the time, and the
            #    request's own text (microseconds to ask) has no match that could pay: plain step.
            self.skipped_looks += 1
            self._looked_at = 0.0
            self.decisions.append(PLAIN)
            self._chosen = None
            return EMPTY_DRAFT
        self._looked_at = started if idle else 0.0
        verify_s, plain_s = self._pricing(context)
        # 1. Every lookup worth its time drafts (its draft and match length inform the decision); a
        #    request's first step asks all (new text), and in modelled time a look costs nothing. A
        #    dear look is weighed against what a token right is worth to this request now: its
        #    plain step, or in a shared forward its part of one.
        gated = self.config.verify_cost is None and self._steps > 0
        self._token_s = plain_s if context.batch.row_cost is not None or self._forward_measured() else 0.0
        for sub in self.subs:
            if sub.kind == LOOKUP and not sub.asked and (not gated or sub.gate is None or sub.gate.ask(plain_s)):
                self._ask(sub, context)

        # 2. Score every option against the measured cost(k) curve (a fixed a + b k in tests and
        #    model-free replays); a model's cost is its fitted proposal time, a lookup's is sunk.
        candidates = [self._candidate(sub, context, verify_s) for sub in self.subs]
        waste = self.config.waste
        decision, _ = choose([c for c in candidates if c is not None], verify_s, self.config.margin, waste, plain_s)

        # 3. Nothing pays: plain decoding, but probe a model proposer now and then.
        self._probing = False
        if decision.name is None and self.probes_due(candidates):
            probe = self._probe(candidates, verify_s, waste)
            # an idle probe must fit its own budget: with its catch-up prefill (_candidate priced it)
            # it can cost many forwards
            extra = probe.cost_s - verify_seconds(verify_s, 0)
            if not idle or self.state.probe_budget.allows(extra):
                decision, self._probing = probe, True
                self.state.probe_budget.charge(extra)
        self.decisions.append(decision)
        self._learn_look_cost(time.perf_counter() - started)
        if decision.name is None:
            self._chosen = None
            return EMPTY_DRAFT

        # 4. The chosen proposer's draft (a model drafts now, exactly k tokens at most).
        sub = self._sub(decision.name)
        if sub.kind == MODEL:
            start = time.perf_counter()
            sub.draft = sub.proposer.propose(replace_max_len(context, decision.draft_len))
            sub.proposal_s = time.perf_counter() - start
            fed = sub.proposer.last_fed if isinstance(sub.proposer, ModelDrafter) else 0
            if fed <= self.config.catch_up_limit and len(sub.draft):
                sub.proposal_cost.add(len(sub.draft), sub.proposal_s)
            elif fed > self.config.catch_up_limit:  # a catch-up: learn its cost per token
                per_token = sub.proposal_s / (fed + len(sub.draft))
                known = self.state.catch_up_s.get(sub.name)
                self.state.catch_up_s[sub.name] = per_token if known is None else 0.7 * known + 0.3 * per_token
        self._chosen = sub if len(sub.draft) else None
        return sub.draft.truncated(decision.draft_len) if len(sub.draft) else EMPTY_DRAFT

    def observe(self, outcome: Outcome) -> None:
        drafted = len(outcome.draft)
        now = time.perf_counter()
        # what each asked lookup's draft had right, computed once for the look gates and the shadow scores
        right = (
            {
                sub.name: common_prefix_len(sub.draft.token_ids, outcome.emitted)
                for sub in self.subs
                if sub.asked and len(sub.draft)
            }
            if self._proposed
            else {}
        )
        if self._proposed and self.config.verify_cost is None:
            self._book_looks(right, first_step=self._steps == 0)
        if self._steps > 0:  # the first step's forward includes the prompt prefill
            if not outcome.shared:  # a shared forward's time is the batch's (the scheduler fits it by rows)
                self.verify_cost.add(drafted, outcome.verify_s)
            seconds = now - self._last_end if self._last_end else outcome.proposal_s + outcome.verify_s
            self.idle.step(seconds)
            self.state.probe_budget.step(seconds)
        self._steps += 1
        self._steps_seen += 1
        self._last_end = now
        if self._looked_at:  # an idle look: its time is overhead (a probe's is booked in its own budget)
            self.idle.charge(outcome.proposal_s if not self._probing else self.state.look_s)
            self._looked_at = 0.0
        if not drafted:
            self._plain_streak += 1
        elif not self._probing:
            self._plain_streak = 0
        self.state.plain_streak = self._plain_streak  # where the session's next request starts
        proposed = self._proposed
        chosen = self._chosen if proposed else None
        for sub in self.subs:
            own = sub.draft
            if sub is chosen:
                self._record(sub, outcome.draft, outcome.accepted, outcome.accepted < drafted)
            elif proposed and sub.kind == LOOKUP and len(own):
                # Shadow score: how many of its tokens the emitted ones confirm; a rejection is
                # known only where an emitted token disagrees.
                confirmed = right[sub.name]
                self._record(sub, own, confirmed, confirmed < min(len(own), len(outcome.emitted)))
            sub.proposer.observe(outcome)
            sub.draft, sub.proposal_s, sub.asked = EMPTY_DRAFT, 0.0, False
        if chosen is not None:
            if self._probing:
                self.probes.probed()
            else:
                self.probes.speculated()
        self._chosen, self._proposed, self._probing = None, False, False

    def continuation(self, context: ProposeContext, max_len: int) -> tuple[int, ...]:
        """This step's chosen lookup asked again for up to ``max_len`` tokens (its draft, then
        further along the same chain), or () when no lookup drafted. Call between ``propose``
        and ``observe``. A caller that sees the draft accepted whole and the chain continued
        drafts the rest without asking again (``vllm_proposer.drafter``, "runway"), and books
        those drafts with ``credit``."""
        sub = self._chosen
        if sub is None or sub.kind != LOOKUP or len(sub.draft) < context.max_len:
            return ()  # a model's draft, or a chain that ends within this draft
        return sub.proposer.propose(replace_max_len(context, max_len)).token_ids

    def credit(self, name: str, match_len: int | None, passed: int, rejected_next: bool, times: int = 1) -> None:
        """Book ``times`` drafts of ``name`` that a caller drafted from ``continuation`` without
        asking: what ``observe`` would have recorded for each."""
        self.acceptance.record(name, match_len, passed, rejected_next, times)

    def end(self) -> None:
        for sub in self.subs:
            try:
                sub.proposer.end()
            except Exception:  # one failing sub-proposer must not keep the others from cleaning up
                log.exception("auto: %s.end() failed", sub.name)

    # -- helpers -------------------------------------------------------------------------------
    def _ask(self, sub: _Sub, context: ProposeContext) -> None:
        start = time.perf_counter()
        sub.draft = sub.proposer.propose(context).truncated(context.max_len)
        sub.proposal_s = time.perf_counter() - start
        sub.asked = True

    def _free_lookups_could_pay(self, context: ProposeContext) -> bool:
        """On an idle step: ask the free lookups only (``FREE_LOOKUPS``), and say whether one's match
        is in a length class whose first-token acceptance beats the break-even of a one-token draft
        ((1 + margin) cost(1) / cost(0) - 1). A repetition that starts after a long idle stretch is
        drafted from its first matching step instead of waiting for the idle budget's next look."""
        for sub in self._free:
            self._ask(sub, context)
        drafted = [sub for sub in self._free if len(sub.draft)]
        if not drafted:
            return False
        shared = request_share(context.batch)
        if shared is not None:  # its part of a shared forward, as the step would be priced
            plain_s, per_row = shared
            break_even = self._first_token_break_even(plain_s + per_row, plain_s)
        else:
            if self._break_even_at <= self._steps_seen and context.batch.row_cost is None:
                curve = self.verify_cost.curve()
                # the policy's margin too: a match that could only break even is not worth a full look
                self._break_even = self._first_token_break_even(curve(1), curve(0))
                self._break_even_at = self._steps_seen + BREAK_EVEN_EVERY
            break_even = self._break_even
        for sub in drafted:
            match_len = sub.draft.match.match_len if sub.draft.match is not None else None
            if self.acceptance.estimates(sub.name, match_len, 1)[0] > break_even:
                return True
        return False

    def _first_token_break_even(self, one_s: float, plain_s: float) -> float:
        """The first-token acceptance at which a one-token draft (``one_s`` seconds against a plain
        step's ``plain_s``) beats plain decoding by the policy's margin."""
        return (1.0 + self.config.margin) * one_s / max(plain_s, 1e-9) - 1.0

    def _pricing(self, context: ProposeContext) -> tuple[VerifyCost, float]:
        """(cost of a step by draft length, a plain step's seconds) for this request now: fixed costs
        (tests, model-free replays); in a shared forward, this request's part of it; else its own
        measured curve (alone, or a batch whose forward the scheduler has not measured yet)."""
        if self.config.verify_cost is not None:
            return self.config.verify_cost, self.config.verify_cost[0]
        shared = request_share(context.batch)
        if shared is not None:
            plain_s, per_row = shared
            return (plain_s, per_row), plain_s
        curve = self.verify_cost.curve()
        return curve, curve(0)

    def _forward_measured(self) -> bool:
        return self.verify_cost.plain_measured is not None or self.verify_cost.fit() is not None

    def _book_looks(self, right: dict[str, int], first_step: bool) -> None:
        """Each gated lookup's cost and what it saved: the emitted tokens its draft had ``right``
        beyond the baseline lookup's draft, each worth what a token was priced at this step (its
        plain step, or its part of a shared one)."""
        if not self._token_s:
            return  # no forward measured yet: a token right has no price
        baseline = right.get(BASELINE_LOOKUP, 0)
        for sub in self.subs:
            if sub.asked and sub.gate is not None:
                saved = max(0, right.get(sub.name, 0) - baseline) * self._token_s
                sub.gate.looked(sub.proposal_s, saved, count_cost=not first_step)

    def _learn_look_cost(self, seconds: float) -> None:
        known = self.state.look_s
        self.state.look_s = seconds if known == 0.0 else 0.9 * known + 0.1 * seconds

    def _catch_up_s(self, sub: _Sub, context: ProposeContext, plain_s: float) -> float:
        """Seconds a model proposer needs before it can draft: feeding it every token it has not seen
        (its KV cache lags by all it missed since it last drafted; a whole prompt after a new request)."""
        if not isinstance(sub.proposer, ModelDrafter):
            return 0.0
        cache = sub.proposer.cache
        pending = len(context.token_ids) - (len(cache) if cache is not None else 0)
        if pending <= self.config.catch_up_limit:
            return 0.0
        per_token = self.state.catch_up_s.get(sub.name, 0.01 * plain_s)  # unmeasured: a batched token's share
        return per_token * pending

    def _sub(self, name: str) -> _Sub:
        return next(sub for sub in self.subs if sub.name == name)

    def probes_due(self, candidates: Sequence[Candidate | None]) -> bool:
        """Count a plain step; True when a model proposer should be probed now."""
        return any(c is not None and self._sub(c.name).kind == MODEL for c in candidates) and self.probes.plain_step()

    def _probe(self, candidates: Sequence[Candidate | None], verify_s: VerifyCost, waste: float) -> Choice:
        """The most promising model proposer, with a short draft (its best length, capped); ``waste``
        as the decision priced it."""
        models = [c for c in candidates if c is not None and self._sub(c.name).kind == MODEL]
        best = max((best_length(c, verify_s, waste) for c in models), key=lambda choice: choice.rate)
        return replace(best, draft_len=min(self.config.probe_max_len, best.draft_len))

    def _record(self, sub: _Sub, draft: Draft, passed: int, rejected_next: bool) -> None:
        match_len = draft.match.match_len if draft.match is not None else None
        self.acceptance.record(sub.name, match_len, passed, rejected_next)

    def _candidate(self, sub: _Sub, context: ProposeContext, verify_s: VerifyCost) -> Candidate | None:
        max_len = context.max_len
        if sub.kind == LOOKUP:
            if not len(sub.draft):
                return None
            match_len = sub.draft.match.match_len if sub.draft.match is not None else None
            rates = self.acceptance.estimates(
                sub.name, match_len, len(sub.draft), self.config.lookup_continuation, STOP_BELOW
            )
            return Candidate(sub.name, rates, len(rates))
        # Untimed model: assume a tenth of a forward per token, so it gets tried once; plus what
        # catching its cache up costs now (fixed costs, as in tests, are taken as given).
        fixed = (self.config.proposal_costs or {}).get(sub.name)
        plain_s = verify_seconds(verify_s, 0)
        proposal = fixed or sub.proposal_cost.fit() or (0.0, 0.1 * plain_s)
        if fixed is None and self.config.verify_cost is None:
            catch_up = self._catch_up_s(sub, context, plain_s)
            if catch_up > self.config.catch_up_free * plain_s:  # a little is exploration; more is a cost
                proposal = (proposal[0] + catch_up, proposal[1])
        rates = self.acceptance.estimates(
            sub.name, None, min(max_len, self.config.model_max_len), stop_below=STOP_BELOW
        )
        return Candidate(sub.name, rates, len(rates), proposal)

    def summary(self) -> dict:
        """Current estimates, for logs and benchmarks."""
        return {
            "verify_s": self.verify_cost.fit(),
            "plain_s": self.verify_cost.plain_measured,
            "cost_curve_s": cost_points(self.verify_cost),
            "proposal_s": {sub.name: sub.proposal_cost.fit() for sub in self.subs if sub.kind == MODEL},
            "acceptance": self.acceptance.summary(),
            "probe_interval": self.probes.interval,
            "skipped_looks": self.skipped_looks,
            "look_gates": {
                sub.name: {
                    "cost_ms": sub.gate.cost_s * 1e3,
                    "saved_ms": sub.gate.saved_s * 1e3,
                    "skipped": sub.gate.skipped,
                }
                for sub in self.subs
                if sub.gate is not None
            },
        }


def replace_max_len(context: ProposeContext, max_len: int) -> ProposeContext:
    return replace(context, max_len=max_len)


def build_auto(
    setup: ProposerSetup,
    models: Sequence[Proposer] | None = None,
    states: dict[tuple, PolicyState] | None = None,
) -> AutoProposer:
    """``auto`` for one request (``proposers.assembly`` calls this for the server, bench and simulate).

    Lookups: context always, reference / material / outputs / index / next-edit when the request has them. ``models``: long-lived
    model proposers the caller shares between requests (one request at a time uses them); None
    builds them here (``model_proposers``). ``states``: the caller's table of policy statistics by
    candidate set and policy, continued from when ``AutoConfig.shared_state``; else a fresh start. ``AutoConfig.candidates`` restricts every set.
    """
    wanted = setup.config.auto.candidates

    def allowed(name: str) -> bool:
        return wanted is None or name in wanted

    context = ContextLookup.from_setup(setup) if allowed("context") else None
    lookups: list[Proposer] = [context] if context is not None else []
    if allowed("reference") and setup.request.reference is not None:
        # the copy pointer drafts inserted text from the context lookup's table (one table, not two)
        lookups.append(ReferenceLookup.from_setup(setup, text_lookup=context))
    if allowed("next-edit") and setup.request.reference is not None and setup.request.edits:
        next_edit = NextEditLookup.from_setup(setup)  # the window as the last edits change it
        if next_edit.changes:
            lookups.append(next_edit)
    if setup.request.material and (wanted is None or "material" in wanted or "context" in wanted):
        lookups.append(MaterialLookup.from_setup(setup))  # the request's own material: the context rule over it
    if allowed("outputs") and setup.request.outputs is not None:
        lookups.append(OutputsLookup.from_setup(setup))  # the session's earlier outputs: the context rule over them
    if allowed("index") and setup.request.index is not None:
        # auto prices every draft by its match length, so it sees the short matches in other
        # documents too (docs/index.md "Which matches draft": human completions follow some)
        lookups.append(IndexLookup.from_setup(setup, under_auto=True, context_beside=allowed("context")))
    chosen = model_proposers(setup) if models is None else list(models)
    chosen = [model for model in chosen if allowed(model.name)]
    config = setup.config.auto.policy
    state = None
    if states is not None and setup.config.auto.shared_state:
        key = (tuple(p.name for p in [*lookups, *chosen]), repr(config))
        state = states.setdefault(key, PolicyState.fresh(config))
    return AutoProposer(lookups, chosen, config, state)
