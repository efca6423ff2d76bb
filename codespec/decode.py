"""The decode loop: draft, verify in one target forward, accept, roll back, stream.

``generate`` is a generator of events so that every caller (CLI, language server, websocket,
bench) sees the same stream: ``TextDelta`` as text becomes safe to show, ``StepEvent`` after each
target forward, and one final ``Finished`` with the output and its stats. Cancellation and the
deadline are checked once per cycle, so a cancelled request returns within one target forward
with what it has produced.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from codespec.config import GenerationLimits, SamplingParams
from codespec.draft import EMPTY_DRAFT, NoDraft, Outcome, ProposeContext, Proposer
from codespec.errors import InvalidRequestError
from codespec.kv import KVCache, common_prefix_len
from codespec.model import TargetModel
from codespec.sampling import make_generator
from codespec.stats import RequestStats, StepRecord
from codespec.text import TextStream
from codespec.verify import verify


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
    reason: str  # "eos" | "stop" | "repetition" | "length" | "context" | "deadline" | "cancelled"
    stats: RequestStats


Event = TextDelta | StepEvent | Finished


def generate(
    target: TargetModel,
    prompt_ids: Sequence[int],
    proposer: Proposer | None = None,
    sampling: SamplingParams = SamplingParams(),
    limits: GenerationLimits = GenerationLimits(),
    cancel: Cancellation | None = None,
    cache: KVCache | None = None,
) -> Iterator[Event]:
    """Decode from ``prompt_ids``; yields events and ends with ``Finished``.

    ``cache`` may carry state from an earlier request: its longest common prefix with the prompt
    is kept and only the rest is prefilled (prompt caching). It is left holding the final sequence.
    """
    start = time.perf_counter()
    prompt_ids = list(prompt_ids)
    _check_prompt(target, prompt_ids)
    proposer = proposer or NoDraft()
    generator = None if sampling.greedy else make_generator(sampling.seed, target.device)
    cache = cache if cache is not None else target.new_cache()
    # Keep the reusable prefix, but at least one prompt token must be fed to get the next logits.
    cache.rollback(min(common_prefix_len(cache.token_ids, prompt_ids), len(prompt_ids) - 1))

    sequence = list(prompt_ids)
    output: list[int] = []
    stats = RequestStats()
    text = TextStream(target.decode, limits.stop, context_ids=prompt_ids)
    end_ids = target.eos_token_ids | limits.stop_token_ids
    first_token_s: float | None = None
    last_emit_s = 0.0
    reason = None
    proposer.begin(prompt_ids)
    try:
        while reason is None:
            if cancel is not None and cancel.is_set():
                reason = "cancelled"
                break
            if limits.deadline_s is not None and time.perf_counter() - start >= limits.deadline_s:
                reason = "deadline"
                break
            remaining = limits.max_new_tokens - len(output)
            # A step emits up to K + 1 tokens: keep that within the budget and the context window
            # (plain decoding stops at max_context tokens; one more would be a token it never emits).
            max_draft = min(limits.max_draft_len, remaining - 1, target.max_context - len(sequence) - 1)

            # 1. Draft (the policy inside an "auto" proposer picks source and length).
            step_start = time.perf_counter()
            draft = EMPTY_DRAFT
            if max_draft > 0:
                context = ProposeContext(sequence, len(prompt_ids), max_draft, sampling, generator)
                draft = proposer.propose(context).truncated(max_draft)
            proposed = time.perf_counter()

            # 2. One target forward over the uncached tokens plus the draft: K+1 scored positions.
            uncached = sequence[len(cache) :]
            target_logits = target.forward([*uncached, *draft.token_ids], cache, keep_last=len(draft) + 1)

            # 3. Accept a prefix; emit the recovered or bonus token.
            verdict = verify(draft, target_logits, sampling, generator)

            # 4. Roll back the rejected drafts' KV (accepted drafts' entries stay valid).
            cache.rollback(len(sequence) + verdict.accepted)
            verified = time.perf_counter()

            # 5. Cut at EOS and the budget, stream text up to any stop string.
            emitted = verdict.emitted(draft.token_ids)[:remaining]
            kept: list[int] = []
            for token in emitted:
                kept.append(token)
                if token in end_ids:  # EOS or a format's end marker: kept in ids, not in text
                    reason = "eos"
                    break
                delta = text.push(token)
                if delta:
                    yield TextDelta(delta)
                if text.stopped:
                    reason = "stop"
                    break
                # Checked token by token, like EOS and stop strings, so the cut is the same with or
                # without drafts.
                if limits.stop_repeats and repeating_tail(
                    [*output[-REPEAT_MAX_PERIOD * limits.stop_repeats :], *kept], limits.stop_repeats
                ):
                    reason = "repetition"
                    break
            sequence.extend(kept)
            output.extend(kept)
            if len(cache) > len(sequence) - 1:  # tokens dropped after EOS/stop: keep the cache honest
                cache.rollback(len(sequence) - 1)

            # 6. Record, feed back.
            now = time.perf_counter()
            step = StepRecord(
                draft.proposer if len(draft) else "",
                len(draft),
                verdict.accepted,
                len(kept),
                proposed - step_start,
                verified - proposed,
                now - start,
            )
            stats.steps.append(step)
            if first_token_s is None:
                first_token_s = now
            else:
                stats.token_gaps_s.append(now - last_emit_s)
            last_emit_s = now
            proposer.observe(
                Outcome(draft, verdict.accepted, tuple(kept), len(sequence), step.proposal_s, step.verify_s)
            )
            yield StepEvent(step, tuple(kept))
            if reason is None and len(output) >= limits.max_new_tokens:
                reason = "length"
            elif reason is None and len(sequence) >= target.max_context:
                reason = "context"
    finally:
        proposer.end()

    tail = text.flush()
    if tail:
        yield TextDelta(tail)
    if first_token_s is not None:
        stats.ttft_s.append(first_token_s - start)
        stats.decode_s.append(last_emit_s - first_token_s)
        stats.decode_tokens.append(len(output) - 1)
    yield Finished(text.text, tuple(output), reason, stats)


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


def _check_prompt(target: TargetModel, prompt_ids: list[int]) -> None:
    if not prompt_ids:
        raise InvalidRequestError("the prompt is empty: give at least one token of context")
    if len(prompt_ids) >= target.max_context:
        raise InvalidRequestError(
            f"the prompt is {len(prompt_ids)} tokens but the model's context is {target.max_context}; "
            f"shorten it (editors send a window around the cursor)"
        )
