"""transformers' own decoding modes on the same model, in the same process: the hf-* configurations.

- ``hf-greedy``: ``model.generate`` (greedy, or sampling with the run's temperature / top-p);
- ``hf-pld``: ``prompt_lookup_num_tokens=10`` (leftmost n-gram match, n <= 2, fixed length);
- ``hf-assisted``: ``assistant_model`` = the same draft model codespec's ``draft`` uses;
- ``hf-early-exit``: ``assistant_early_exit=E`` with codespec's default exit layer.

transformers runs as users run it: its own ``sdpa`` attention and PyTorch's ``linear`` (codespec's
forwards use ``codespec.attention`` and ``codespec.linear``); ``--peer-kernels codespec`` lends the
peers codespec's kernels instead, which separates the kernels' share of a ratio from speculation's.

Timing uses a streamer (``BaseStreamer``-compatible): ``generate`` calls ``put`` once with the
prompt and then once per decoding step with that step's new tokens, so the put times give TTFT and
inter-token gaps on the same footing as codespec's streamed steps. The candidate generator that
``generate`` builds is wrapped (an instance attribute, removed afterwards) to record each step's
draft length and proposal time; the streamer's token count per step gives accepted + 1. Together
they form ``StepRecord``s, so every metric comes from ``codespec.stats``, as for codespec's own
configurations. In replay mode the bias is a ``LogitsProcessor`` on the target only: it is removed
from the candidate generator, whose assistant would otherwise be told the answer.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

from bench.measure import MemoryProbe, RunResult
from bench.replay import Recording, ReplayLogitsProcessor, VocabularyLimit
from codespec.core.config import SamplingParams
from codespec.core.stats import RequestStats, StepRecord

HF_CONFIGS = ("hf-greedy", "hf-pld", "hf-assisted", "hf-early-exit")
PLD_TOKENS = 10


class TimingStreamer:
    """Records (time, tokens) per ``put`` after the prompt's."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.events: list[tuple[float, int]] = []
        self._prompt_seen = False

    def put(self, value) -> None:
        now = time.perf_counter()
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.events.append((now, int(value.numel())))

    def end(self) -> None:
        pass


class StepLog:
    """Per decoding step: draft length and proposal seconds (from the candidate generator)."""

    def __init__(self) -> None:
        self.drafts: list[tuple[int, float, float]] = []  # (draft_len, proposal_s, end time)


@contextlib.contextmanager
def instrumented(model, log: StepLog):
    """Wrap the candidate generator ``generate`` builds; drop the replay bias from it."""
    original = type(model)._get_candidate_generator

    def build(*args, **kwargs):
        generator = original(model, *args, **kwargs)
        processors = getattr(generator, "logits_processor", None)
        if processors is not None:
            kept = [p for p in processors if not isinstance(p, ReplayLogitsProcessor)]
            generator.logits_processor = type(processors)(kept)  # a list or a LogitsProcessorList
        get_candidates = generator.get_candidates

        def timed(input_ids, *a, **kw):
            start = time.perf_counter()
            candidate_ids, candidate_logits = get_candidates(input_ids, *a, **kw)
            end = time.perf_counter()
            log.drafts.append((int(candidate_ids.shape[1] - input_ids.shape[1]), end - start, end))
            return candidate_ids, candidate_logits

        generator.get_candidates = timed
        return generator

    model._get_candidate_generator = build
    try:
        yield
    finally:
        del model._get_candidate_generator


def steps_from(streamer: TimingStreamer, log: StepLog, start: float) -> RequestStats:
    """Pure: streamer events (+ draft log, when speculating) -> StepRecords and request timings."""
    stats = RequestStats()
    previous = start
    for number, (at, emitted) in enumerate(streamer.events):
        if log.drafts and number < len(log.drafts):
            draft_len, proposal_s, drafted_at = log.drafts[number]
            verify_s = max(at - drafted_at, 0.0)
        else:
            draft_len, proposal_s, verify_s = 0, 0.0, at - previous
        accepted = min(max(emitted - 1, 0), draft_len)
        stats.steps.append(
            StepRecord("hf" if draft_len else "", draft_len, accepted, emitted, proposal_s, verify_s, at - start)
        )
        if number:
            stats.token_gaps_s.append(at - previous)
        previous = at
    if streamer.events:
        first, last = streamer.events[0][0], streamer.events[-1][0]
        stats.ttft_s.append(first - start)
        stats.decode_s.append(last - first)
        stats.decode_tokens.append(sum(n for _, n in streamer.events) - 1)
    return stats


class HFConfig:
    def __init__(
        self,
        name: str,
        model,
        eos_token_ids: Sequence[int],
        draft_hf=None,
        exit_layer: int | None = None,
        stock_kernels: bool = True,
        vocab_limit: int | None = None,
    ) -> None:
        if name not in HF_CONFIGS:
            raise ValueError(f"unknown transformers configuration {name!r}")
        self.name = name
        self.model = model
        self.stock_kernels = stock_kernels  # transformers' sdpa and PyTorch's linear, as users run it
        self.vocab_limit = vocab_limit  # real mode on a random published shape: ids the tokenizer has
        self.eos_token_ids = sorted(eos_token_ids)
        self.extra: dict = {}
        if name == "hf-pld":
            self.extra = {"prompt_lookup_num_tokens": PLD_TOKENS}
        elif name == "hf-assisted":
            if draft_hf is None:
                raise ValueError("hf-assisted needs a draft model (--draft PATH or a shape name)")
            self.extra = {"assistant_model": draft_hf}
        elif name == "hf-early-exit":
            self.extra = {"assistant_early_exit": exit_layer}

    def run(
        self,
        case,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        sampling: SamplingParams,
        probe: MemoryProbe,
        recording: Recording | None = None,
    ) -> RunResult:
        import torch
        from transformers import LogitsProcessorList

        from codespec.core.attention import stock_attention
        from codespec.core.linear import stock_linears

        device = next(self.model.parameters()).device
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)  # [1, T]
        processors = LogitsProcessorList([ReplayLogitsProcessor(recording)] if recording is not None else [])
        if recording is None and self.vocab_limit is not None:
            processors.append(VocabularyLimit(self.vocab_limit))
        kwargs: dict[str, Any] = dict(
            max_new_tokens=max_new_tokens,
            eos_token_id=self.eos_token_ids or None,
            pad_token_id=self.eos_token_ids[0] if self.eos_token_ids else None,
            logits_processor=processors,
            attention_mask=torch.ones_like(ids),
        )
        if sampling.greedy:
            kwargs.update(do_sample=False)
        else:  # top_k=0 switches transformers' default top-k (50) off, as codespec's 0 does
            kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
        log = StepLog()
        probe.start()
        streamer = TimingStreamer()
        # transformers as users run it: its own sdpa and PyTorch's linear (codespec's forwards use
        # codespec.attention and codespec.linear); ``stock_kernels=False`` lends it codespec's.
        models = (self.model, self.extra.get("assistant_model")) if self.stock_kernels else ()
        with instrumented(self.model, log), stock_attention(*models), stock_linears(*models), torch.inference_mode():
            output = self.model.generate(ids, streamer=streamer, **kwargs, **self.extra)
        stats = steps_from(streamer, log, streamer.start)
        rss, cuda = probe.stop()
        return RunResult(tuple(output[0, ids.shape[1] :].tolist()), stats, rss, cuda)
