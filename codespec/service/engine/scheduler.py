"""The batch the engine thread drives: which requests decode together, and one cycle of them.

Each **cycle** every active request plans its step (a draft of its own length, 0 allowed, or a
chunk of its prompt), **one target forward** runs them all (``Target.forward_many``: a ragged
batch, each sequence over its own cache, codespec/ragged.py), and each request verifies and
streams its own. Requests join between cycles while the batch has room (``max_batch`` requests,
``max_cached_tokens`` KV positions; interactive requests first, with ``COMPLETION_HEADROOM`` places
beyond the cap) and leave when they finish, fail or are cancelled, before the next forward
(docs/architecture.md, "Batching"). While an inline completion or a next edit decodes, the other
requests join its forwards one cycle in ``MAX_YIELD + 1``. The engine service (``service.engine``)
owns everything around the batch: preparing prompts, building a request's ``Decoding``, results,
stats and history.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from codespec.core.decode import HOLD, Finished, StepPlan, TextDelta
from codespec.core.draft import EMPTY_DRAFT, BatchShare
from codespec.core.finish import FinishReason
from codespec.core.stats import RequestStats
from codespec.core.target import Target
from codespec.proposers.costs import LinearCost
from codespec.service.engine.bookkeeping import CachePool, ServiceStats
from codespec.service.engine.jobs import Job
from codespec.service.requests.schema import RequestKind

log = logging.getLogger(__name__)

PREFILL_CHUNK = 32  # tokens per cycle of a background prefill (a request arriving meanwhile waits <= one chunk)
COMPLETION_HEADROOM = 2  # interactive requests admitted beyond max_batch (a user is typing)
PROMPT_CHUNK = 512  # most prompt tokens a request prefills in one cycle, alone or not
# On a CPU a chunk's forward costs about 2 x parameters FLOPs a row: a chunk is held near
# CPU_CHUNK_FLOPS (~0.6 s on two cores), at least MIN_PROMPT_CHUNK rows, since a cycle cannot be
# interrupted and an inline completion that arrives during a chunk waits for it
# (docs/architecture.md, "Batching").
CPU_CHUNK_FLOPS = 1.3e11
MIN_PROMPT_CHUNK = 64
# Prompt rows all requests together prefill in one cycle, in chunks: a cycle cannot be interrupted,
# so this bounds how long one holds everyone (64 clients' prompts arriving at once would otherwise
# be one forward of 64 chunks: ~30 s at the qwen2.5-coder-0.5b body on a CPU). A few chunks, not
# one: a larger forward reads the weights once for more rows (8 completion prompts at that body
# were all done in 10.9-11.4 s with room for 4 or 8 chunks a cycle, 12.4 s with room for one;
# taking interactive prompts strictly one at a time answered the first in 4.3 s instead of 10.5 s
# but all 8 in 14.6 s, docs/architecture.md "Batching").
BUDGET_CHUNKS = 4
# Beside an inline completion or a next edit (what a user waits on while typing) every other
# request sits out MAX_YIELD cycles of each MAX_YIELD + 1: the completion's forwards carry a
# teammate's rewrite or chat (its prompt chunks, its drafts) one cycle in eight, and the rewrite
# still moves meanwhile (docs/architecture.md, "Batching": one in four left the completion's p95 at
# 1.55x idle).
MAX_YIELD = 7


def prompt_chunk(target: Target) -> int:
    """Prompt tokens per cycle for ``target``: a power of two, fixed for the target (a request's
    chunking must never depend on what shares its batch: chunks change the prompt's cached keys in
    their last bits). On a CPU, larger models get shorter chunks: at the qwen2.5-coder-0.5b body a
    512-token chunk is a 2.2 s forward and 128 tokens prefill at the same rate in 0.6 s."""
    parameters = target.parameter_count
    if target.device.type != "cpu" or not parameters:
        return PROMPT_CHUNK
    rows = CPU_CHUNK_FLOPS / (2.0 * parameters)
    chunk = PROMPT_CHUNK
    while chunk > MIN_PROMPT_CHUNK and chunk > rows:
        chunk //= 2
    return chunk


Finish = Callable[[Job, str, FinishReason, RequestStats], None]  # (job, text, reason, stats): the job is over
Fail = Callable[[Job, Exception], None]


class Scheduler:
    """The active batch and the requests waiting for a place in it; engine thread only."""

    def __init__(
        self,
        target: Target,
        caches: CachePool,
        stats: ServiceStats,
        max_batch: int,
        max_cached_tokens: int,
        finish: Finish,
        fail: Fail,
    ) -> None:
        self.target = target
        self.caches = caches
        self.stats = stats
        self.max_batch = max_batch
        # a backend with a fixed KV buffer (llama.cpp) bounds what the batch may hold together
        self.max_cached_tokens = min(max_cached_tokens, target.kv_capacity or max_cached_tokens)
        self.active: list[Job] = []  # in the batch: one forward serves them all each cycle
        self.waiting: list[Job] = []  # submitted, waiting for a place in the batch
        self.row_cost = LinearCost("flat", decay=0.95)  # batched forwards: seconds ~ a + b * rows
        self.prompt_budget = BUDGET_CHUNKS * prompt_chunk(target)  # prompt rows a cycle, over all requests
        self._finish = finish
        self._fail = fail

    @property
    def decoding(self) -> bool:
        """Whether a request that decodes (not a background prefill) is in the batch."""
        return any(job.request.kind.decodes for job in self.active)

    def admit(self, start: Callable[[Job], None]) -> None:
        """Move waiting jobs into the batch while it has room; ``start`` builds a job's decoding and
        puts it in ``active`` (or finishes it at once). In order, except that interactive requests
        (inline completions and next edits: what a user is waiting on as they type) go first and
        have ``COMPLETION_HEADROOM`` places beyond the cap, so background rewrites filling the batch
        delay them by one cycle at most. One job always fits, whatever its size."""
        self.waiting.sort(key=lambda job: not job.request.interactive)  # stable
        while self.waiting:
            decoding = [job for job in self.active if job.request.kind.decodes]
            held = sum(len(job.cache) for job in self.active if job.cache is not None)
            job = self.waiting[0]
            interactive = job.request.interactive
            room = self.max_batch + (COMPLETION_HEADROOM if interactive else 0)
            tokens = self.max_cached_tokens * (2 if interactive else 1)
            if job.request.kind.decodes and decoding and (len(decoding) >= room or held >= tokens):
                return
            self.waiting.pop(0)
            start(job)
            if interactive:  # each interactive request starts a fresh count of the others' sit-outs
                for other in self.active:
                    other.yielded = 0

    def take_over_prefill(self, cache_key: str | None) -> None:
        """A request on a key whose cache a background prefill holds: stop the prefill and hand its
        cache back (every forward left it valid), so the request reuses what is already there."""
        for other in [
            j for j in self.active if j.request.kind is RequestKind.PREFILL and j.request.cache_key == cache_key
        ]:
            self.active.remove(other)
            self.caches.give_back(cache_key, other.cache)
            self._finish(other, "", FinishReason.CANCELLED, RequestStats())

    def cycle(self) -> None:
        """One cycle: each active request plans its step (a draft, a prompt chunk), one
        ``forward_many`` runs them all, each request verifies and streams its own. A request that
        is over, cancelled or failed leaves before the forward."""
        planned: list[tuple[Job, StepPlan]] = []
        typing = any(job.request.interactive and job.decoding is not None for job in self.active)
        running = [job for job in self.active if not (typing and self._yields(job))]
        # the forward a draft shares (not the requests the prompt budget holds this cycle: they are
        # not in it): the requests that decode split its fixed cost and the prompt rows beside them
        held, prompt_rows = self._held(running)
        served = [job for job in running if job not in held]
        share = self._share(served, prompt_rows)
        # prompt rows are handed out in priority order: what a user waits on, then by arrival, a
        # document's background prefill last; the forward keeps the batch's own order
        place = {job: index for index, job in enumerate(self.active)}
        room = self.prompt_budget
        for job in sorted(running, key=self._prompt_priority):
            plan: StepPlan | None
            try:
                if job.request.kind is RequestKind.PREFILL:
                    done = len(job.kv) >= len(job.prefill_ids)
                    if job.cancelled or done:
                        self._retire_prefill(
                            job, FinishReason.CANCELLED if job.cancelled and not done else FinishReason.LENGTH
                        )
                        continue
                    if room <= 0:
                        continue
                    chunk = job.prefill_ids[len(job.kv) : len(job.kv) + PREFILL_CHUNK]
                    plan = StepPlan(chunk, 1, EMPTY_DRAFT, prefill=True)
                else:
                    plan = job.steps.propose(share, prompt_room=room)
            except Exception as error:  # a failed request must not take the service down
                self.drop(job, error)
                continue
            if plan is None:
                self._deliver(job, job.steps.finish())
            elif plan is not HOLD:
                room -= plan.prompt_rows
                planned.append((job, plan))
        planned.sort(key=lambda pair: place[pair[0]])
        if not planned:
            return
        self.stats.cycles += 1
        self.stats.cycle_requests += len(planned)
        self.stats.largest_batch = max(self.stats.largest_batch, len(planned))
        for (job, plan), outcome in zip(planned, self._forward(planned), strict=True):
            if isinstance(outcome, Exception):
                self.drop(job, outcome)
            elif job.request.kind is not RequestKind.PREFILL:
                try:
                    events = job.steps.advance(plan, outcome)
                    if job.steps.reason is not None:
                        events += job.steps.finish()
                except Exception as error:
                    self.drop(job, error)
                    continue
                self._deliver(job, events)

    def _share(self, served: list[Job], prompt_rows: int) -> BatchShare:
        """How a draft is priced in this cycle's forward: split among the requests that decode in
        it, the prompt rows beside them part of its fixed cost (they emit nothing of their own)."""
        decoding = max(1, sum(1 for job in served if job.decoding is not None and not job.decoding.prompt_rows_next()))
        fit = self.row_cost.fit() if self.row_cost.fitted and len(served) > 1 else None
        if fit is None:
            return BatchShare(requests=decoding)
        base, per_row = fit
        return BatchShare(requests=decoding, row_cost=(base + per_row * prompt_rows, per_row))

    def _held(self, running: list[Job]) -> tuple[set[Job], int]:
        """The requests this cycle's prompt budget will hold, handed out as the cycle hands it out
        (by ``_prompt_priority``; ``Decoding.holds`` is the rule ``propose`` applies), and the prompt
        rows the others will run."""
        room, held = self.prompt_budget, set()
        for job in sorted(running, key=self._prompt_priority):
            if job.request.kind is RequestKind.PREFILL:
                if room <= 0:
                    held.add(job)
                else:
                    room -= min(PREFILL_CHUNK, len(job.prefill_ids) - len(job.kv))
            elif job.decoding is not None:
                if job.decoding.holds(room):
                    held.add(job)
                else:
                    room -= job.decoding.prompt_rows_next()
        return held, self.prompt_budget - room

    @staticmethod
    def _prompt_priority(job: Job) -> tuple[bool, bool]:
        """Who gets prompt rows first (``sorted`` is stable: then the batch's order, by arrival)."""
        return not job.request.interactive, job.request.kind is RequestKind.PREFILL

    @staticmethod
    def _yields(job: Job) -> bool:
        """Whether ``job`` (not what a user waits on) sits this cycle out beside an interactive request.
        Only when it runs changes, never what it computes; a cancelled one runs, to leave at once."""
        if not job.request.interactive and job.yielded < MAX_YIELD and not job.cancelled:
            job.yielded += 1
            return True
        job.yielded = 0
        return False

    def _forward(self, planned: list) -> list:
        """Logits for each plan, from one ``forward_many``; if that fails, each plan alone, so one
        bad request fails alone (its error in its place) and the others go on."""
        caches = [job.cache for job, _ in planned]
        held = [len(cache) for cache in caches]
        inputs = [plan.input_ids for _, plan in planned]
        keep_last = [plan.keep_last for _, plan in planned]
        try:
            start = time.perf_counter()
            logits: list = list(self.target.forward_many(inputs, caches, keep_last))
            if len(planned) > 1:  # what a shared forward costs by its rows: batched drafts are priced with it
                self.row_cost.add(sum(len(ids) for ids in inputs), time.perf_counter() - start)
            return logits
        except Exception as error:
            if len(planned) == 1:
                return [error]
            log.warning("a batched forward of %d requests failed (%s); running them one by one", len(planned), error)
        outcomes: list = []
        for cache, length, ids, keep in zip(caches, held, inputs, keep_last, strict=True):
            try:
                cache.rollback(length)  # what the failed forward wrote for it, dropped
                outcomes.append(self.target.forward(ids, cache, keep_last=keep))
            except Exception as error:
                outcomes.append(error)
        return outcomes

    def _deliver(self, job: Job, events: list) -> None:
        """Stream ``events`` to the job's caller; at ``Finished`` the job leaves with its result."""
        for event in events:
            if isinstance(event, TextDelta):
                if job.on_delta is not None:
                    try:
                        job.on_delta(event.text)
                    except Exception:  # a caller's callback must not stop the others' cycle
                        log.exception("a delta callback failed")
            elif isinstance(event, Finished):
                self.active.remove(job)
                self.caches.give_back(job.request.cache_key, job.cache)
                self._finish(job, event.text, event.reason, event.stats)

    def drop(self, job: Job, error: Exception) -> None:
        """A request that failed: it leaves the batch with its error; its cache is not reused."""
        if job.decoding is not None:
            job.decoding.close()
        if job in self.active:
            self.active.remove(job)
        job.cache = None  # its state is unknown: do not reuse it
        self._fail(job, error)

    def _retire_prefill(self, job: Job, reason: FinishReason) -> None:
        self.active.remove(job)
        self.caches.give_back(job.request.cache_key, job.cache)  # valid up to its last forward
        self._finish(job, "", reason, RequestStats())
