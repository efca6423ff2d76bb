"""The scheduler batches: every active request's step runs in one target forward per cycle, and a
request's output is the same tokens as the same request served alone, whatever shares its batch
(greedy), or the same draws from its own seed (sampling); past ``max_batch`` requests wait and
are all answered; a request that fails or is cancelled leaves its batch without touching the others."""

from __future__ import annotations

import threading

import pytest
import torch

from codespec.core.config import SamplingParams
from codespec.core.errors import InvalidRequestError
from codespec.service.engine.service import EngineService
from codespec.service.requests.schema import GenerationRequest, RequestKind

WAIT_S = 180
CODE = "".join(f"def function_{i}(value):\n    return value * {i} + {i % 3}\n\n" for i in range(12))


def requests() -> list[GenerationRequest]:
    """Completions, rewrites and a sampled request, with different prompt lengths and proposers."""
    return [
        GenerationRequest(prompt="def add(a, b):\n    return", max_tokens=24),
        GenerationRequest(prompt=CODE, max_tokens=60, kind=RequestKind.EDIT, reference=CODE[:300]),
        GenerationRequest(prompt=CODE[:500] + "def f", max_tokens=40, proposer="context"),
        GenerationRequest(prompt="import os\nimport", max_tokens=30, proposer="none"),
        GenerationRequest(prompt=CODE[:200], max_tokens=30, sampling=SamplingParams(temperature=0.8, seed=11)),
        GenerationRequest(prompt="class Stack:\n    def push(self, item):\n", max_tokens=30, proposer="auto"),
    ]


@pytest.fixture(scope="module")
def alone(server_target) -> list[str]:
    """Each request served alone (one at a time) by a fresh service."""
    service = EngineService(server_target, proposer="auto", max_draft=8)
    try:
        return [service.submit(request).wait(WAIT_S).text for request in requests()]
    finally:
        service.close()


def test_concurrent_requests_share_forwards_and_get_their_alone_output(server_target, alone):
    service = EngineService(server_target, proposer="auto", max_draft=8)
    try:
        jobs = [service.submit(request) for request in requests()]
        texts = [job.wait(WAIT_S).text for job in jobs]
        stats = service.snapshot()
    finally:
        service.close()
    assert texts == alone
    batching = stats["batching"]
    # the five completions share forwards; the rewrite joins them one cycle in MAX_YIELD + 1
    assert batching["largest_batch"] >= len(jobs) - 1
    forwards = sum(entry["target_forwards"] for entry in stats["last_requests"])
    assert batching["cycles"] < forwards  # forwards were shared


def test_past_max_batch_requests_wait_and_are_all_answered(server_target, alone):
    service = EngineService(server_target, proposer="auto", max_draft=8, max_batch=2)
    try:
        jobs = [service.submit(request) for request in requests()]
        texts = [job.wait(WAIT_S).text for job in jobs]
        stats = service.snapshot()
    finally:
        service.close()
    assert texts == alone
    from codespec.service.engine.scheduler import COMPLETION_HEADROOM

    # rewrites keep to 2; inline completions (four of the six) may take the headroom beyond it
    assert 2 <= stats["batching"]["largest_batch"] <= 2 + COMPLETION_HEADROOM
    assert stats["waiting_requests"] == 0 and stats["max_batch"] == 2


def test_a_cancelled_request_leaves_the_batch_and_the_others_are_unchanged(server_target, alone):
    service = EngineService(server_target, proposer="auto", max_draft=8)
    try:
        started = threading.Event()
        long_edit = GenerationRequest(prompt=CODE, max_tokens=2000, kind=RequestKind.EDIT)
        doomed = service.submit(long_edit, on_delta=lambda text: started.set())
        jobs = [service.submit(request) for request in requests()]
        assert started.wait(WAIT_S)
        doomed.cancel()
        assert doomed.wait(WAIT_S).reason == "cancelled"
        assert [job.wait(WAIT_S).text for job in jobs] == alone
    finally:
        service.close()


class PoisonedTarget:
    """The server's target, failing any forward whose input holds ``poison`` (as a backend fails
    on input it cannot run): the fault a batch must keep to the request that brought it."""

    def __init__(self, target, poison: int) -> None:
        self._target = target
        self.poison = poison

    def __getattr__(self, name):
        return getattr(self._target, name)

    def _check(self, inputs) -> None:
        if any(self.poison in ids for ids in inputs):
            raise InvalidRequestError(f"this backend cannot run token id {self.poison}")

    def forward(self, input_ids, cache, keep_last=1):
        self._check([input_ids])
        return self._target.forward(input_ids, cache, keep_last)

    def forward_many(self, inputs, caches, keep_last):
        self._check(inputs)
        return self._target.forward_many(inputs, caches, keep_last)


def test_a_request_that_fails_in_a_batch_fails_alone(server_target, alone):
    poison_text = "while True:"
    poison = server_target.encode(poison_text)[0]
    batch = requests()
    assert not any(poison in server_target.encode(str(request.prompt)) for request in batch)
    service = EngineService(PoisonedTarget(server_target, poison), proposer="none", max_draft=8)
    try:
        bad = service.submit(GenerationRequest(prompt="x = 1\n" + poison_text, max_tokens=8))
        jobs = [service.submit(request) for request in batch]
        with pytest.raises(InvalidRequestError, match="cannot run token id"):
            bad.wait(WAIT_S)
        texts = [job.wait(WAIT_S).text for job in jobs]
    finally:
        service.close()
    # plain decoding here (proposer none) against the alone runs' speculative outputs: equal where
    # greedy (the sampled request draws differently once its drafts differ)
    greedy = [index for index, request in enumerate(batch) if request.sampling.temperature == 0]
    assert [texts[i] for i in greedy] == [alone[i] for i in greedy]


def test_an_inline_completion_never_waits_behind_a_full_batch(server_target):
    service = EngineService(server_target, proposer="none", max_draft=8, max_batch=1)
    try:
        started = threading.Event()
        running = service.submit(
            GenerationRequest(prompt=CODE, max_tokens=2000, kind=RequestKind.EDIT), on_delta=lambda text: started.set()
        )
        assert started.wait(WAIT_S)
        queued = service.submit(GenerationRequest(prompt=CODE[:400], max_tokens=50, kind=RequestKind.EDIT))
        completion = service.submit(GenerationRequest(prompt="def add(a, b):\n    return", max_tokens=6))
        result = completion.wait(WAIT_S)
        assert result.usage.completion_tokens == 6
        assert not running.future.done() and not queued.future.done()  # it went past the queue and the cap
        running.cancel()
        assert queued.wait(WAIT_S).usage.completion_tokens > 0  # the queued request is still answered
    finally:
        service.close()


class RecordingTarget:
    """The real target, with each cycle's caches recorded (which requests shared the forward)."""

    def __init__(self, target) -> None:
        self._target = target
        self.cycles: list[list] = []
        self.rows: list[list[int]] = []  # per cycle, each request's rows

    def __getattr__(self, name):
        return getattr(self._target, name)

    def forward_many(self, inputs, caches, keep_last):
        self.cycles.append(list(caches))
        self.rows.append([len(ids) for ids in inputs])
        return self._target.forward_many(inputs, caches, keep_last)


def _beside_a_rewrite(server_target, requests: list[GenerationRequest]) -> tuple[list, list[list[bool]]]:
    """Each of ``requests`` in turn (one after the other) while a long rewrite streams (it must
    still be streaming at the end); their results and, per request, whether each forward that
    carried it carried the rewrite too."""
    target = RecordingTarget(server_target)
    service = EngineService(target, proposer="none", max_draft=8)
    results, caches = [], []
    try:
        started = threading.Event()
        rewrite = service.submit(
            GenerationRequest(prompt=CODE, max_tokens=4000, kind=RequestKind.EDIT), on_delta=lambda text: started.set()
        )
        assert started.wait(WAIT_S)
        for request in requests:
            job = service.submit(request)
            results.append(job.wait(WAIT_S))
            caches.append(job.cache)
        rewrite_cache = rewrite.cache
        assert not rewrite.future.done()
        rewrite.cancel()
        rewrite.wait(WAIT_S)
    finally:
        service.close()
    carried = [[cycle for cycle in target.cycles if any(c is cache for c in cycle)] for cache in caches]
    return results, [[any(c is rewrite_cache for c in cycle) for cycle in own] for own in carried]


def test_a_rewrite_sits_out_most_cycles_of_an_inline_completion_and_still_moves(server_target):
    """Beside an inline completion (a user typing), another request joins one cycle in
    MAX_YIELD + 1: the completion's forwards rarely carry the rewrite's rows, the rewrite is not
    stopped, and neither output changes."""
    from codespec.service.engine.scheduler import MAX_YIELD

    completion_request = GenerationRequest(prompt="def add(a, b):\n    return", max_tokens=24, proposer="none")
    plain = EngineService(server_target, proposer="none", max_draft=8)
    try:
        completion_alone = plain.submit(completion_request).wait(WAIT_S).text
    finally:
        plain.close()
    [result], [cycles] = _beside_a_rewrite(server_target, [completion_request])
    assert result.text == completion_alone
    assert len(cycles) >= result.usage.completion_tokens >= 2 * (MAX_YIELD + 1)
    assert 1 <= sum(cycles) <= len(cycles) // (MAX_YIELD + 1) + 1


def test_each_inline_completion_starts_a_fresh_count_of_sit_outs(server_target):
    """The rewrite sits out the first MAX_YIELD cycles of every completion, also of one that comes
    after another completion ended part-way through the rewrite's count."""
    from codespec.service.engine.scheduler import MAX_YIELD

    completions = [
        GenerationRequest(prompt="def add(a, b):\n    return", max_tokens=11, proposer="none", cache_key="a"),
        GenerationRequest(prompt="def mul(a, b):\n    return", max_tokens=24, proposer="none", cache_key="b"),
    ]
    _, carried = _beside_a_rewrite(server_target, completions)
    for cycles in carried:
        assert len(cycles) > MAX_YIELD
        assert not any(cycles[: MAX_YIELD - 1])  # its first cycle may be the prompt's, before it decodes


def test_a_next_edit_asked_ahead_does_not_make_others_sit_out(server_target):
    """A speculated next edit (nobody waits on it yet) is background work: the rewrite shares its forwards."""
    ahead = GenerationRequest(
        prompt="def add(a, b):\n    return", max_tokens=24, kind=RequestKind.NEXT_EDIT, proposer="none", ahead=True
    )
    assert RequestKind.NEXT_EDIT.interactive and not ahead.interactive
    _, carried = _beside_a_rewrite(server_target, [ahead])
    decoding = carried[0][1:]  # after its prompt's forward
    assert len(decoding) >= 8 and all(decoding)


def test_an_evicted_cache_is_reused_for_the_next_new_document(server_target):
    from codespec.service.engine.bookkeeping import CachePool

    pool = CachePool(server_target, capacity=1, spare=1)
    first = pool.take("a")
    server_target.forward(server_target.encode("def add(a, b):\n    return a + b\n"), first)
    pool.give_back("a", first)
    pool.give_back("b", pool.take("b"))  # "a" is evicted: its cache becomes the spare
    reused = pool.take("c")
    assert reused is first and len(reused) == 0 and reused.token_ids == []
    prompt = server_target.encode("import os\n")
    fresh = server_target.new_cache()
    assert torch.equal(server_target.forward(prompt, reused), server_target.forward(prompt, fresh))


def test_prompt_chunks_are_fixed_per_target_and_shorter_for_larger_models_on_a_cpu(server_target):
    """A chunk's forward stays near CPU_CHUNK_FLOPS on a CPU; on an accelerator, or when the size is
    unknown, PROMPT_CHUNK. The chunk is the target's, never the batch's."""
    from types import SimpleNamespace

    from codespec.service.engine.scheduler import MIN_PROMPT_CHUNK, PROMPT_CHUNK, prompt_chunk

    def sized(parameters, device="cpu"):
        return SimpleNamespace(parameter_count=parameters, device=torch.device(device))

    assert prompt_chunk(server_target) == PROMPT_CHUNK  # the tiny test model
    assert prompt_chunk(sized(30_000_000)) == 512
    assert prompt_chunk(sized(494_000_000)) == 128  # qwen2.5-coder-0.5b
    assert prompt_chunk(sized(7_600_000_000)) == MIN_PROMPT_CHUNK
    assert prompt_chunk(sized(7_600_000_000, "meta")) == PROMPT_CHUNK  # not a CPU
    assert prompt_chunk(SimpleNamespace(parameter_count=0, device=torch.device("cpu"))) == PROMPT_CHUNK  # size unknown
    service = EngineService(server_target, proposer="none")
    try:
        assert service.prompt_chunk == prompt_chunk(server_target)
    finally:
        service.close()


def _serve_long_prompts(server_target, requests, together: bool, budget_chunks: int = 4):
    """``requests`` alone (one after another) or together, with 64-token prompt chunks; the texts,
    the recording target and each request's cache."""
    target = RecordingTarget(server_target)
    service = EngineService(target, proposer="none", max_draft=8)
    service.prompt_chunk = 64
    service.scheduler.prompt_budget = 64 * budget_chunks
    try:
        if together:
            jobs = [service.submit(request) for request in requests]
            texts = [job.wait(WAIT_S).text for job in jobs]
        else:
            jobs, texts = [], []
            for request in requests:
                jobs.append(service.submit(request))
                texts.append(jobs[-1].wait(WAIT_S).text)
        rows = [
            {id(cache): count for cache, count in zip(caches, counts, strict=True)}
            for caches, counts in zip(target.cycles, target.rows, strict=True)
        ]
        return texts, rows, [id(job.cache) for job in jobs]
    finally:
        service.close()


def test_prompts_past_the_budget_prefill_in_turn_beside_a_decoding_request(server_target):
    """With room for one chunk a cycle, two long prompts arriving together prefill one after the
    other (in arrival order), while a short request decodes every cycle; every output is the one it
    gets alone."""
    short = GenerationRequest(prompt="def add(a, b):\n    return", max_tokens=300, proposer="none", cache_key="c")
    long_a = GenerationRequest(prompt=CODE * 2, max_tokens=8, proposer="none", cache_key="a")
    long_b = GenerationRequest(prompt=CODE[::-1] * 2, max_tokens=8, proposer="none", cache_key="b")
    requests = [short, long_a, long_b]
    alone, _, _ = _serve_long_prompts(server_target, requests, together=False, budget_chunks=1)
    together, cycles, (c, a, b) = _serve_long_prompts(server_target, requests, together=True, budget_chunks=1)
    assert together == alone
    assert not any(cycle.get(a, 0) >= 64 and cycle.get(b, 0) >= 64 for cycle in cycles)
    first_b = next(i for i, cycle in enumerate(cycles) if b in cycle)
    a_chunks = [i for i, cycle in enumerate(cycles) if cycle.get(a, 0) >= 64]
    assert len(a_chunks) >= 4 and max(a_chunks) < first_b  # a's prompt first, then b's
    assert any(c in cycle and max(cycle.values()) >= 64 for cycle in cycles)  # c decodes beside the chunks


def test_background_prompts_share_cycles_within_the_prompt_budget(server_target):
    """Rewrites' prompts prefill together, at most the budget's rows of prompt a cycle (two chunks
    here), and each output is the one it gets alone."""
    rewrites = [
        GenerationRequest(prompt=CODE[i:] * 2, max_tokens=8, kind=RequestKind.EDIT, proposer="none", cache_key=str(i))
        for i in range(3)
    ]
    alone, _, _ = _serve_long_prompts(server_target, rewrites, together=False, budget_chunks=2)
    together, cycles, caches = _serve_long_prompts(server_target, rewrites, together=True, budget_chunks=2)
    assert together == alone
    chunks_a_cycle = [sum(1 for cache in caches if cycle.get(cache, 0) >= 64) for cycle in cycles]
    assert max(chunks_a_cycle) == 2  # shared, and within the budget


def test_a_request_held_for_prompt_room_is_not_priced_as_part_of_the_forward(server_target, monkeypatch):
    """A draft is priced against the requests its forward serves: one the prompt budget holds this
    cycle is not among them, and one that runs prompt rows in it emits nothing of its own
    (BatchShare.requests: the forward's requests that decode)."""
    from codespec.core.decode import HOLD, Decoding
    from codespec.core.draft import ALONE

    target = RecordingTarget(server_target)
    service = EngineService(target, proposer="none", max_draft=8)
    service.prompt_chunk = 64
    service.scheduler.prompt_budget = 64  # one chunk a cycle
    calls: list[tuple[int, int, int, bool]] = []  # (forward, the share's requests, the cache, decodes) per step
    original = Decoding.propose

    def recording(self, batch=ALONE, prompt_room=None):
        decodes = not self.prompt_rows_next()
        plan = original(self, batch, prompt_room)
        if plan is not None and plan is not HOLD:
            calls.append((len(target.cycles), batch.requests, id(self.cache), decodes))
        return plan

    monkeypatch.setattr(Decoding, "propose", recording)
    short = GenerationRequest(prompt="def add(a, b):\n    return", max_tokens=200, proposer="none", cache_key="c")
    long_a = GenerationRequest(prompt=CODE * 2, max_tokens=8, proposer="none", cache_key="a")
    long_b = GenerationRequest(prompt=CODE[::-1] * 2, max_tokens=8, proposer="none", cache_key="b")
    try:
        jobs = [service.submit(request) for request in (short, long_a, long_b)]
        for job in jobs:
            job.wait(WAIT_S)
    finally:
        service.close()
    assert any(len(cycle) == 2 for cycle in target.cycles)  # b held while a prefilled beside c
    decoding: dict[int, int] = {}
    for forward, _, _, decodes in calls:
        decoding[forward] = decoding.get(forward, 0) + decodes
    checked = 0
    for forward, requests, cache, _ in calls:
        if forward < len(target.cycles) and cache in map(id, target.cycles[forward]):
            assert requests == max(1, decoding[forward]), (forward, requests, decoding[forward])
            checked += 1
    # some forward carried a request in its prompt beside one that decodes: not counted
    assert checked and any(len(target.cycles[f]) > n >= 1 for f, n in decoding.items() if f < len(target.cycles))
