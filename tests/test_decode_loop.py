"""The decode loop's contract: rollback, EOS, stop strings, budget, cancellation, deadline, prompt cache."""

from __future__ import annotations

import pytest
import torch
from engine_harness import ScriptedProposer, always_wrong, oracle, plain_greedy

from codespec.core.config import GenerationLimits, SamplingParams
from codespec.core.decode import Finished, StepEvent, TextDelta, generate, generate_all
from codespec.core.draft import NoDraft

PROMPT_TEXT = "def parse(value):\n    return value.strip()\n\n"


@pytest.fixture(scope="module")
def prompt(tiny_target):
    return tiny_target.encode(PROMPT_TEXT)


@pytest.fixture(scope="module")
def reference(tiny_target, prompt):
    return plain_greedy(tiny_target, prompt, 40)


def test_rollback_leaves_the_cache_equal_to_a_fresh_prefill(tiny_target, prompt, reference):
    full = [*prompt, *reference]
    cache = tiny_target.new_cache()
    proposer = ScriptedProposer("wrong", always_wrong(full, tiny_target.vocab_size))
    limits = GenerationLimits(max_new_tokens=20, max_draft_len=6)
    finished = generate_all(tiny_target, prompt, proposer, SamplingParams(), limits, cache=cache)
    sequence = [*prompt, *finished.token_ids]
    assert all(outcome.accepted == 0 for outcome in proposer.outcomes)  # every step rejected its draft
    assert cache.token_ids == sequence[:-1]  # the last emitted token is not fed yet
    probe = sequence[-1:]
    after_rollbacks = tiny_target.forward(probe, cache, keep_last=1)
    fresh = tiny_target.forward(sequence, tiny_target.new_cache(), keep_last=1)
    torch.testing.assert_close(after_rollbacks, fresh, atol=1e-4, rtol=0)


def test_partial_acceptance_rollback_matches_fresh_prefill(tiny_target, prompt, reference):
    full = [*prompt, *reference]
    cache = tiny_target.new_cache()
    tiny_target.forward(prompt, cache, keep_last=1)
    draft = [reference[0], reference[1], (reference[2] + 1) % tiny_target.vocab_size, reference[3]]
    cache.rollback(len(prompt) - 1)
    tiny_target.forward([prompt[-1], *draft], cache, keep_last=5)
    cache.rollback(len(prompt) + 2)  # two drafts accepted
    next_logits = tiny_target.forward([reference[2]], cache, keep_last=1)
    fresh = tiny_target.forward(full[: len(prompt) + 3], tiny_target.new_cache(), keep_last=1)
    torch.testing.assert_close(next_logits, fresh, atol=1e-4, rtol=0)


def test_eos_inside_a_draft_ends_the_request_there(tiny_target, prompt, reference):
    eos = reference[5]
    first_eos = reference.index(eos)
    original = tiny_target.eos_token_ids
    tiny_target.eos_token_ids = frozenset({eos})
    try:
        proposer = ScriptedProposer("oracle", oracle([*prompt, *reference]))
        finished = generate_all(
            tiny_target, prompt, proposer, SamplingParams(), GenerationLimits(max_new_tokens=40, max_draft_len=16)
        )
    finally:
        tiny_target.eos_token_ids = original
    assert finished.reason == "eos"
    assert finished.token_ids == tuple(reference[: first_eos + 1])  # EOS kept in ids, nothing after it
    assert finished.text == tiny_target.decode(reference[:first_eos])


def test_stop_string_spanning_tokens_is_never_streamed(tiny_target, prompt, reference):
    text = tiny_target.decode(reference)
    boundary = len(tiny_target.decode(reference[:6]))
    stop = text[boundary - 2 : boundary + 2]  # straddles the boundary between tokens 6 and 7
    if len(stop) < 4 or not stop.strip():
        pytest.skip("degenerate reference text")
    cut = text.index(stop)
    proposer = ScriptedProposer("oracle", oracle([*prompt, *reference]))
    events = list(
        generate(
            tiny_target,
            prompt,
            proposer,
            SamplingParams(),
            GenerationLimits(max_new_tokens=40, max_draft_len=8, stop=(stop,)),
        )
    )
    streamed = "".join(event.text for event in events if isinstance(event, TextDelta))
    finished = events[-1]
    assert finished.reason == "stop"
    assert streamed == finished.text == text[:cut]


def test_max_new_tokens_caps_drafts_and_output(tiny_target, prompt, reference):
    proposer = ScriptedProposer("oracle", oracle([*prompt, *reference]))
    finished = generate_all(
        tiny_target, prompt, proposer, SamplingParams(), GenerationLimits(max_new_tokens=7, max_draft_len=16)
    )
    assert finished.token_ids == tuple(reference[:7]) and finished.reason == "length"
    assert all(len(outcome.draft) <= 6 for outcome in proposer.outcomes)  # budget 7 = 6 drafts + 1


class CancelAfter:
    def __init__(self, steps):
        self.steps, self.seen = steps, 0

    def is_set(self):
        return self.seen >= self.steps


def test_cancellation_returns_within_one_cycle_with_what_was_produced(tiny_target, prompt, reference):
    cancel = CancelAfter(3)
    events = []
    for event in generate(
        tiny_target, prompt, NoDraft(), SamplingParams(), GenerationLimits(max_new_tokens=40), cancel=cancel
    ):
        events.append(event)
        if isinstance(event, StepEvent):
            cancel.seen += 1
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.reason == "cancelled"
    assert finished.token_ids == tuple(reference[:3])
    assert sum(isinstance(event, StepEvent) for event in events) == 3


def test_deadline_stops_the_request(tiny_target, prompt):
    finished = generate_all(
        tiny_target, prompt, NoDraft(), SamplingParams(), GenerationLimits(max_new_tokens=40, deadline_s=1e-9)
    )
    assert finished.reason == "deadline" and finished.token_ids == ()


def test_context_window_ends_the_request(tiny_target):
    prompt = tiny_target.encode("x = 1\n" * 200)[: tiny_target.max_context - 5]
    finished = generate_all(
        tiny_target, prompt, NoDraft(), SamplingParams(), GenerationLimits(max_new_tokens=40, max_draft_len=8)
    )
    assert finished.reason == "context" and len(prompt) + len(finished.token_ids) == tiny_target.max_context


def test_drafting_up_to_the_context_window_stops_where_plain_decoding_does(tiny_target):
    prompt = tiny_target.encode("x = 1\n" * 200)[: tiny_target.max_context - 5]
    plain = plain_greedy(tiny_target, prompt, 40)
    assert len(prompt) + len(plain) == tiny_target.max_context
    proposer = ScriptedProposer("oracle", oracle([*prompt, *plain]))
    finished = generate_all(
        tiny_target, prompt, proposer, SamplingParams(), GenerationLimits(max_new_tokens=40, max_draft_len=8)
    )
    assert finished.reason == "context"
    assert finished.token_ids == plain  # no bonus token past the last position the model has
    assert sum(outcome.accepted for outcome in proposer.outcomes) > 0


def test_prompt_cache_reuse_gives_the_same_output(tiny_target, prompt, reference):
    cache = tiny_target.new_cache()
    limits = GenerationLimits(max_new_tokens=12, max_draft_len=4)
    generate_all(tiny_target, prompt, NoDraft(), SamplingParams(), limits, cache=cache)
    extended = [*prompt, *reference[:3]]
    reused = generate_all(tiny_target, extended, NoDraft(), SamplingParams(), limits, cache=cache)
    fresh = generate_all(tiny_target, extended, NoDraft(), SamplingParams(), limits)
    assert reused.token_ids == fresh.token_ids == tuple(reference[3:15])


def test_plain_decoding_is_one_token_per_forward(tiny_target, prompt):
    stats = generate_all(
        tiny_target, prompt, NoDraft(), SamplingParams(), GenerationLimits(max_new_tokens=10)
    ).stats.summary()
    assert stats["tokens"] == stats["target_forwards"] == 10
    assert stats["tokens_per_forward"] == 1.0 and stats["coverage"] == 0.0


def test_stop_token_ids_end_the_output_like_eos(tiny_target, prompt, reference):
    marker = reference[4]
    first = reference.index(marker)
    finished = generate_all(
        tiny_target,
        prompt,
        NoDraft(),
        SamplingParams(),
        GenerationLimits(max_new_tokens=40, stop_token_ids=frozenset({marker})),
    )
    assert finished.reason == "eos" and finished.token_ids == tuple(reference[: first + 1])


def test_repeating_tail_finds_a_unit_repeated_at_the_end():
    from codespec.core.decode import repeating_tail

    assert repeating_tail([1, 2, 3, 7, 7, 7], 3)
    assert repeating_tail([9, 4, 5, 4, 5, 4, 5], 3)
    assert not repeating_tail([9, 4, 5, 4, 5, 4, 5], 4)
    assert not repeating_tail([4, 5, 4, 5, 4, 6], 3)  # the loop must reach the end
    assert repeating_tail([1, 2, 3, 4, 5, 6, 7, 8] * 2, 2) and not repeating_tail(list(range(9)) * 2, 2)


def test_stop_repeats_ends_a_loop_with_a_prefix_of_plain_decoding(tiny_target):
    """A looping output stops once its unit has repeated stop_repeats times; what was emitted is
    exactly what plain decoding emits up to there, drafts or not."""
    from codespec.core.decode import repeating_tail

    prompt = tiny_target.encode("x = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0")
    plain = plain_greedy(tiny_target, prompt, 80)
    assert any(repeating_tail(list(plain[:n]), 4) for n in range(1, 81)), "the tiny model must loop here"
    cut = next(n for n in range(1, 81) if repeating_tail(list(plain[:n]), 4))  # the first token that repeats
    for proposer in (NoDraft(), ScriptedProposer("oracle", oracle([*prompt, *plain]))):
        limits = GenerationLimits(max_new_tokens=80, max_draft_len=6, stop_repeats=4)
        finished = generate_all(tiny_target, prompt, proposer, SamplingParams(), limits)
        assert finished.reason == "repetition"
        assert finished.token_ids == plain[:cut]  # the same cut with 7-token steps as with 1-token ones
    with pytest.raises(Exception, match="stop_repeats"):
        GenerationLimits(stop_repeats=1)


def test_requests_stepped_together_decode_as_they_do_alone(tiny_target, prompt, reference):
    """The scheduler's cycle: every request proposes, their forwards run as one ``forward_many``,
    each advances; outputs and per-step acceptance equal each request decoded alone."""
    from codespec.core.decode import Decoding
    from codespec.proposers.context import ContextLookup

    other = tiny_target.encode("class Stack:\n    def push(self, item):\n        self.items.append(item)\n")
    jobs = [
        (prompt, lambda: ScriptedProposer("oracle", oracle([*prompt, *reference])), SamplingParams()),
        (other, lambda: ContextLookup(), SamplingParams()),
        (
            prompt,
            lambda: ScriptedProposer("wrong", always_wrong([*prompt, *reference], tiny_target.vocab_size)),
            SamplingParams(temperature=0.8, seed=5),
        ),
    ]
    limits = GenerationLimits(max_new_tokens=30, max_draft_len=5)
    alone = [generate_all(tiny_target, ids, make(), sampling, limits) for ids, make, sampling in jobs]

    decodings = [Decoding(tiny_target, ids, make(), sampling, limits) for ids, make, sampling in jobs]
    events: list[list] = [[] for _ in decodings]
    cycles = 0
    while True:
        plans = [(number, d, d.propose()) for number, d in enumerate(decodings)]
        plans = [(number, d, plan) for number, d, plan in plans if plan is not None]
        if not plans:
            break
        cycles += 1
        logits = tiny_target.forward_many(
            [plan.input_ids for _, _, plan in plans],
            [d.cache for _, d, _ in plans],
            [plan.keep_last for _, _, plan in plans],
        )
        for (number, decoding, plan), rows in zip(plans, logits, strict=True):
            events[number] += decoding.advance(plan, rows)
    for number, decoding in enumerate(decodings):
        events[number] += decoding.finish()
    assert cycles == max(len(finished.stats.steps) for finished in alone)
    for single, seen in zip(alone, events, strict=True):
        batched = seen[-1]
        assert isinstance(batched, Finished)
        assert batched.token_ids == single.token_ids and batched.reason == single.reason
        assert [s.accepted for s in batched.stats.steps] == [s.accepted for s in single.stats.steps]
        assert "".join(e.text for e in seen if isinstance(e, TextDelta)) == batched.text == single.text
    assert any(s.accepted for s in together_steps(events[0]))  # the oracle's drafts were taken


def together_steps(events):
    return [event.step for event in events if isinstance(event, StepEvent)]
