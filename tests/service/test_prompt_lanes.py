"""A request that cannot fit the context is refused at once, never queued for the engine; a big
prompt's tokenizing never holds a small one back. The engine thread is held by a gate (a call
that waits on an event) and a big prompt's tokenizing by another, so every ordering here is decided
by events, never by timing; the waits' timeouts only guard against a hang."""

from __future__ import annotations

import threading

import pytest

from codespec.core.errors import InvalidRequestError
from codespec.service.engine.preparing import SMALL_PROMPT_CHARS, TokenBound
from codespec.service.engine.service import EngineService
from codespec.service.requests.schema import GenerationRequest

WAIT_S = 60
CODE = "def handler(request):\n    return respond(request, status=200)\n\n"


class GatedEncoder:
    """The server's target; encoding a big prompt (over ``SMALL_PROMPT_CHARS``, or a slice of one on
    the large lane) waits for ``release``, and every encoded length is noted."""

    def __init__(self, target) -> None:
        self._target = target
        self.release = threading.Event()
        self.big_started = threading.Event()
        self.encoded: list[int] = []

    def __getattr__(self, name):
        return getattr(self._target, name)

    def encode(self, text: str) -> list[int]:
        self.encoded.append(len(text))
        if len(text) > SMALL_PROMPT_CHARS or threading.current_thread().name.startswith("codespec-prepare-large"):
            self.big_started.set()
            assert self.release.wait(WAIT_S)
        return self._target.encode(text)


@pytest.fixture
def gated(server_target):
    target = GatedEncoder(server_target)
    service = EngineService(target, proposer="context", max_draft=8)
    yield target, service
    target.release.set()
    service.close()


def hold_engine(service: EngineService) -> threading.Event:
    """Hold the engine thread in a call until the returned event is set (no cycle runs meanwhile)."""
    gate, held = threading.Event(), threading.Event()

    def wait() -> None:
        held.set()
        gate.wait(WAIT_S)

    service.call(wait)
    assert held.wait(WAIT_S)
    return gate


def test_a_prompt_surely_over_the_context_is_refused_in_submit_without_tokenizing(gated):
    target, service = gated
    bound = TokenBound.of(target.tokenizer)
    assert bound is not None
    prompt = CODE * (bound.chars_per_token * target.max_context // len(CODE) + 1)  # past the bound
    gate = hold_engine(service)  # the batch never gets to it: a refusal must not need the engine
    try:
        target.encoded.clear()
        job = service.submit(GenerationRequest(prompt=prompt, max_tokens=8))
        assert job.future.done()  # in submit itself
        with pytest.raises(InvalidRequestError, match="context"):
            job.wait(0)
        assert target.encoded == []  # never tokenized
        reference = service.submit(GenerationRequest(prompt="x = 1\n", max_tokens=8, reference=prompt))
        with pytest.raises(InvalidRequestError, match="prediction"):
            reference.wait(0)
        assert service.refusal(GenerationRequest(prompt="x = 1\n", max_tokens=8)) is None
    finally:
        gate.set()


def test_an_over_long_prompt_under_the_bound_fails_on_its_lane_after_a_partial_count(gated):
    target, service = gated
    prompt = CODE * (30_000 // len(CODE))  # ~9,000 tokens, under the 41,984-character bound
    bound = TokenBound.of(target.tokenizer)
    assert bound is not None and bound.at_least(prompt) < target.max_context  # not refused by the bound
    target.release.set()  # no gate on the tokenizer here: only the engine is held
    gate = hold_engine(service)
    try:
        target.encoded.clear()
        job = service.submit(GenerationRequest(prompt=prompt, max_tokens=8))
        with pytest.raises(InvalidRequestError, match="at least .* tokens but the model's context is"):
            job.wait(WAIT_S)  # while the engine is still held: it never waited for a place
        assert sum(target.encoded) < len(prompt)  # counted in slices until past the context, not whole
    finally:
        gate.set()


def test_a_small_prompt_is_not_prepared_behind_a_big_ones_tokenizing(gated):
    target, service = gated
    prompt = CODE * (30_000 // len(CODE))
    assert len(prompt) > SMALL_PROMPT_CHARS  # the large lane's
    big = service.submit(GenerationRequest(prompt=prompt, max_tokens=8))
    assert target.big_started.wait(WAIT_S)  # the big prompt is being tokenized, and stays so
    small = service.submit(GenerationRequest(prompt="def total(values):\n    return", max_tokens=4))
    result = small.wait(WAIT_S)  # answered while the big one's tokenizing is held
    assert result.usage.completion_tokens >= 1 and not big.future.done()
    target.release.set()
    with pytest.raises(InvalidRequestError, match="context"):
        big.wait(WAIT_S)
