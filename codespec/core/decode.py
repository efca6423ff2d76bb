"""The decode loop: draft, verify in one target forward, accept, roll back, stream.

``Decoding`` is one request's loop cut into steps (propose -> the forward its ``StepPlan`` names
-> advance), so a scheduler can run the forwards of several requests in one cycle
(``Target.forward_many``); ``generate`` is that loop for one request, a generator of events so
that every caller (CLI, language server, websocket, bench) sees the same stream: ``TextDelta`` as
text becomes safe to show, ``StepEvent`` after each target forward, and one final ``Finished``
with the output and its stats. Cancellation and the deadline are checked once per cycle, so a
cancelled request returns within one target forward with what it has produced.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from codespec.core.config import GenerationLimits, SamplingParams
from codespec.core.draft import ALONE, EMPTY_DRAFT, BatchShare, Draft, NoDraft, Outcome, ProposeContext, Proposer
from codespec.core.errors import ContextLengthError, InvalidRequestError
from codespec.core.finish import FinishReason
from codespec.core.sampling import make_generator
from codespec.core.stats import RequestStats, StepRecord
from codespec.core.target import Cache, Target, common_prefix_len
from codespec.core.text import TextStream
from codespec.core.verify import verify

if TYPE_CHECKING:
    import torch


class Cancellation(Protocol):
    def is_set(self) -> bool: ...


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class StepEvent:
    step: StepRecord
    token_ids: tuple[int, ...]  # what this step added to the output


@dataclass(frozen=True)
class Finished:
    text: str
    token_ids: tuple[int, ...]
    reason: FinishReason
    stats: RequestStats


Event = TextDelta | StepEvent | Finished


@dataclass(frozen=True)
class StepPlan:
    """What one request asks of the target in one cycle: run ``input_ids`` after what its cache
    holds (the uncached tail of the sequence, then the draft) and score the last ``keep_last``
    positions (K + 1)."""

    input_ids: list[int]
    keep_last: int
    draft: Draft
    prefill: bool = False  # a chunk of a long prompt: its logits are not used, nothing is emitted

    @property
    def prompt_rows(self) -> int:
        """Rows of prompt (or of text not yet in the cache) this plan runs, besides its draft and
        the one token a decoding step always feeds."""
        return len(self.input_ids) - (0 if self.prefill else len(self.draft) + 1)


HOLD = StepPlan([], 0, EMPTY_DRAFT, prefill=True)  # nothing this cycle: the scheduler's prompt budget is spent
SMALL_TAIL = 16  # uncached tokens a step runs whatever the prompt budget (a keystroke's few)


class Decoding:
    """One request's decoding, as steps a scheduler drives: :meth:`propose` a draft, run the target
    forward its :class:`StepPlan` names (alone, or beside other requests' in one cycle), then
    :meth:`advance` with the logits (verify, roll back, cut, stream). ``generate`` is this loop for
    one request; state is per request, so requests never see each other's (docs/architecture.md).

    ``cache`` may carry state from an earlier request: its longest common prefix with the prompt
    is kept and only the rest is prefilled (prompt caching). It is left holding the final sequence.
    """

    def __init__(
        self,
        target: Target,
        prompt_ids: Sequence[int],
        proposer: Proposer | None = None,
        sampling: SamplingParams = SamplingParams(),
        limits: GenerationLimits = GenerationLimits(),
        cancel: Cancellation | None = None,
        cache: Cache | None = None,
        prefill_chunk: int | None = None,
    ) -> None:
        """``prefill_chunk``: prefill a long prompt at most this many tokens per forward (a scheduler
        keeps its cycles short beside other requests); None: the whole prompt in the first forward.
        The chunking depends only on the request and its cache, never on what shares a batch."""
        self.start = time.perf_counter()
        self.prefill_chunk = prefill_chunk
        self.prompt_ids = list(prompt_ids)
        _check_prompt(target, self.prompt_ids)
        self.target = target
        self.proposer = proposer or NoDraft()
        self.sampling = sampling
        self.limits = limits
        self.cancel = cancel
        self.generator = None if sampling.greedy else make_generator(sampling.seed, target.device)
        self.cache = cache if cache is not None else target.new_cache()
        # Keep the reusable prefix, but at least one prompt token must be fed to get the next logits.
        self.cache.rollback(min(common_prefix_len(self.cache.token_ids, self.prompt_ids), len(self.prompt_ids) - 1))
        self.sequence = list(self.prompt_ids)
        self.output: list[int] = []
        self.stats = RequestStats()
        self.text = TextStream(target.decode, limits.stop, context_ids=self.prompt_ids)
        self.end_ids = target.eos_token_ids | limits.stop_token_ids
        self.reason: FinishReason | None = None  # set when decoding is over: Finished.reason
        self._first_token_s: float | None = None
        self._last_emit_s = 0.0
        self._step_start = self._proposed = 0.0
        self._shared = False  # the step in flight shares its forward with other requests
        self._proposer_state = "new"  # -> "open" at the first propose (begin), "closed" (end)

    def propose(self, batch: BatchShare = ALONE, prompt_room: int | None = None) -> StepPlan | None:
        """The next forward this request needs, or None when it is over (see ``reason``).
        ``batch``: the rest of the scheduler's cycle, for the proposer's pricing of its draft.
        ``prompt_room``: prompt rows the cycle has left (None: no limit); with none left, a request
        with more than ``SMALL_TAIL`` uncached tokens gets :data:`HOLD` (no forward this cycle, and
        nothing asked of its proposer; its chunks are the same whenever they run)."""
        if self.reason is not None:
            return None
        if self._proposer_state == "new":  # begun with the first step, as the request starts decoding
            self._proposer_state = "open"
            self.proposer.begin(self.prompt_ids)
        if self.cancel is not None and self.cancel.is_set():
            self.reason = FinishReason.CANCELLED
            return None
        if self.limits.deadline_s is not None and time.perf_counter() - self.start >= self.limits.deadline_s:
            self.reason = FinishReason.DEADLINE
            return None
        uncached = self.sequence[len(self.cache) :]
        if self.holds(prompt_room):
            return HOLD
        if self.prefill_chunk is not None and len(uncached) > self.prefill_chunk:  # 0. a prompt chunk first
            return StepPlan(uncached[: self.prefill_chunk], 1, EMPTY_DRAFT, prefill=True)
        remaining = self.limits.max_new_tokens - len(self.output)
        # A step emits up to K + 1 tokens: keep that within the budget and the context window
        # (plain decoding stops at max_context tokens; one more would be a token it never emits).
        max_draft = min(self.limits.max_draft_len, remaining - 1, self.target.max_context - len(self.sequence) - 1)

        # 1. Draft (the policy inside an "auto" proposer picks source and length).
        self._shared = batch.requests > 1
        self._step_start = time.perf_counter()
        draft = EMPTY_DRAFT
        if max_draft > 0:
            context = ProposeContext(
                self.sequence, len(self.prompt_ids), max_draft, self.sampling, self.generator, batch
            )
            draft = self.proposer.propose(context).truncated(max_draft)
        self._proposed = time.perf_counter()
        # 2. One target forward over the uncached tokens plus the draft: K+1 scored positions.
        return StepPlan([*uncached, *draft.token_ids], len(draft) + 1, draft)

    def holds(self, prompt_room: int | None) -> bool:
        """Whether :meth:`propose` with ``prompt_room`` gives :data:`HOLD` (the scheduler leaves a
        request that waits for prompt room out of the batch it prices drafts against)."""
        return prompt_room is not None and prompt_room <= 0 and len(self.sequence) - len(self.cache) > SMALL_TAIL

    def prompt_rows_next(self) -> int:
        """Prompt rows the next step runs (:attr:`StepPlan.prompt_rows` of the plan it will get)."""
        uncached = len(self.sequence) - len(self.cache)
        if self.prefill_chunk is not None and uncached > self.prefill_chunk:
            return self.prefill_chunk
        return max(0, uncached - 1)

    def advance(self, plan: StepPlan, target_logits: torch.Tensor) -> list[Event]:
        """Verify ``plan``'s draft against ``target_logits`` [K+1, V] (the forward already wrote the
        plan's positions into the cache); returns the text deltas and the step's event."""
        if plan.prefill:
            return []
        draft, limits, cache = plan.draft, self.limits, self.cache
        events: list[Event] = []
        remaining = limits.max_new_tokens - len(self.output)
        # 3. Accept a prefix; emit the recovered or bonus token.
        verdict = verify(draft, target_logits, self.sampling, self.generator)

        # 4. Roll back the rejected drafts' KV (accepted drafts' entries stay valid).
        cache.rollback(len(self.sequence) + verdict.accepted)
        verified = time.perf_counter()

        # 5. Cut at EOS and the budget, stream text up to any stop string.
        emitted = verdict.emitted(draft.token_ids)[:remaining]
        kept: list[int] = []
        for token in emitted:
            kept.append(token)
            if token in self.end_ids:  # EOS or a format's end marker: kept in ids, not in text
                self.reason = FinishReason.EOS
                break
            delta = self.text.push(token)
            if delta:
                events.append(TextDelta(delta))
            if self.text.stopped:
                self.reason = FinishReason.STOP
                break
            # Checked token by token, like EOS and stop strings, so the cut is the same with or
            # without drafts.
            if limits.stop_repeats and repeating_tail(
                [*self.output[-REPEAT_MAX_PERIOD * limits.stop_repeats :], *kept], limits.stop_repeats
            ):
                self.reason = FinishReason.REPETITION
                break
        self.sequence.extend(kept)
        self.output.extend(kept)
        if len(cache) > len(self.sequence) - 1:  # tokens dropped after EOS/stop: keep the cache honest
            cache.rollback(len(self.sequence) - 1)

        # 6. Record, feed back.
        now = time.perf_counter()
        step = StepRecord(
            draft.proposer if len(draft) else "",
            len(draft),
            verdict.accepted,
            len(kept),
            self._proposed - self._step_start,
            verified - self._proposed,
            now - self.start,
        )
        self.stats.steps.append(step)
        if self._first_token_s is None:
            self._first_token_s = now
        else:
            self.stats.token_gaps_s.append(now - self._last_emit_s)
        self._last_emit_s = now
        self.proposer.observe(
            Outcome(
                draft, verdict.accepted, tuple(kept), len(self.sequence), step.proposal_s, step.verify_s, self._shared
            )
        )
        events.append(StepEvent(step, tuple(kept)))
        if self.reason is None and len(self.output) >= limits.max_new_tokens:
            self.reason = FinishReason.LENGTH
        elif self.reason is None and len(self.sequence) >= self.target.max_context:
            self.reason = FinishReason.CONTEXT
        return events

    def close(self) -> None:
        """End the proposer's request (once, if it began), whether decoding finished or failed."""
        if self._proposer_state == "open":
            self.proposer.end()
        self._proposer_state = "closed"

    def finish(self) -> list[Event]:
        """The last text and the ``Finished`` event, once ``propose`` has returned None."""
        self.close()
        assert self.reason is not None, "finish() comes after propose() returned None"
        events: list[Event] = []
        tail = self.text.flush()
        if tail:
            events.append(TextDelta(tail))
        stats = self.stats
        if self._first_token_s is not None:
            stats.ttft_s.append(self._first_token_s - self.start)
            stats.decode_s.append(self._last_emit_s - self._first_token_s)
            stats.decode_tokens.append(len(self.output) - 1)
        events.append(Finished(self.text.text, tuple(self.output), self.reason, stats))
        return events


def generate(
    target: Target,
    prompt_ids: Sequence[int],
    proposer: Proposer | None = None,
    sampling: SamplingParams = SamplingParams(),
    limits: GenerationLimits = GenerationLimits(),
    cancel: Cancellation | None = None,
    cache: Cache | None = None,
) -> Iterator[Event]:
    """Decode from ``prompt_ids`` alone (:class:`Decoding`'s loop); yields events and ends with ``Finished``."""
    decoding = Decoding(target, prompt_ids, proposer, sampling, limits, cancel, cache)
    try:
        while (plan := decoding.propose()) is not None:
            target_logits = target.forward(plan.input_ids, decoding.cache, keep_last=plan.keep_last)
            yield from decoding.advance(plan, target_logits)
    finally:
        decoding.close()
    yield from decoding.finish()


REPEAT_MAX_PERIOD = 8  # the longest unit (tokens) that stop_repeats looks for


def repeating_tail(tokens: list[int], repeats: int, max_period: int = REPEAT_MAX_PERIOD) -> bool:
    """True when ``tokens`` ends in one unit of 1..``max_period`` tokens repeated ``repeats`` times."""
    for period in range(1, max_period + 1):
        span = period * repeats
        if len(tokens) < span:
            break
        tail = tokens[-span:]
        if tail == tail[:period] * repeats:
            return True
    return False


def generate_all(*args, **kwargs) -> Finished:
    """Run ``generate`` to the end and return its ``Finished`` event."""
    finished: Finished | None = None
    for event in generate(*args, **kwargs):
        if isinstance(event, Finished):
            finished = event
    assert finished is not None, "generate always ends with Finished"
    return finished


def _check_prompt(target: Target, prompt_ids: list[int]) -> None:
    if not prompt_ids:
        raise InvalidRequestError("the prompt is empty: give at least one token of context")
    if len(prompt_ids) >= target.max_context:
        raise ContextLengthError(
            f"the prompt is {len(prompt_ids)} tokens but the model's context is {target.max_context}; "
            f"shorten it (editors send a window around the cursor)"
        )
