"""Speculative sampling follows the target distribution exactly (docs/design.md §2).

On a 6-token vocabulary the exact joint distribution of the first three sampled tokens is
enumerated from the model (216 outcomes). 20,000 seeded speculative samples from the real decode
loop are compared with it by a chi-square test at a false-failure rate of 1e-4. The same test must
reject a deliberately wrong acceptance rule ("always accept the draft"), which shows it has power.

For speed the 20,000-sample runs use ``MemoTarget``: the real tiny Llama's logits, memoised per
prefix (each distinct prefix is run through the model once), behind the engine's target
interface. Everything else (decode loop, drafts, verification, sampling) is the production code;
a smaller run on the plain model checks the same property without the memo.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch

import codespec.core.verify as verify_module
from codespec.core.config import GenerationLimits, SamplingParams
from codespec.core.decode import generate_all
from codespec.core.draft import Draft
from codespec.core.model import TargetModel
from codespec.core.sampling import process_logits

pytestmark = pytest.mark.slow  # statistical exactness over thousands of samples: `python -m pytest --full` runs it

VOCAB = 6
PROMPT = [0, 3, 1]
NEW_TOKENS = 3
SAMPLES = 20_000
ALPHA = 1e-4  # false-failure rate of the test
SAMPLING = SamplingParams(temperature=0.9, top_k=5, top_p=0.95, seed=None)


def word_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


@pytest.fixture(scope="module")
def small_vocab_target():
    from bench.shapes import random_llama

    model = random_llama((32, 2, 4, 2, 64), vocab_size=VOCAB, seed=3, init_std=0.1, max_context=64)
    return TargetModel(model, word_tokenizer())


class MemoCache:
    """The KV-cache contract (token_ids, rollback) without tensors: MemoTarget recomputes nothing."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []

    def __len__(self) -> int:
        return len(self.token_ids)

    def rollback(self, length: int) -> None:
        del self.token_ids[length:]


class MemoTarget:
    """The real model's logits for each prefix, computed once (fresh prefill) and memoised."""

    def __init__(self, target: TargetModel) -> None:
        self.target = target
        self.device = target.device
        self.eos_token_ids = frozenset()
        self.max_context = target.max_context
        self.vocab_size = target.vocab_size
        self.decode = target.decode
        self._rows: dict[tuple[int, ...], torch.Tensor] = {}

    def new_cache(self) -> MemoCache:
        return MemoCache()

    def row(self, prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix not in self._rows:
            self._rows[prefix] = self.target.forward(list(prefix), self.target.new_cache(), keep_last=1)[0]
        return self._rows[prefix]

    def forward(self, input_ids, cache: MemoCache, keep_last: int = 1) -> torch.Tensor:
        cache.token_ids.extend(input_ids)
        ends = range(len(cache.token_ids) - keep_last + 1, len(cache.token_ids) + 1)
        return torch.stack([self.row(tuple(cache.token_ids[:end])) for end in ends])  # [keep_last, V]


def exact_joint(target, sampling: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(x1, x2, x3 | prompt) by enumeration with the same logit transforms as the engine."""
    joint = {(): 1.0}
    for _ in range(NEW_TOKENS):
        extended = {}
        for prefix, mass in joint.items():
            logits = target.row((*PROMPT, *prefix))  # [V]
            probs = process_logits(logits, sampling)  # [V]
            for token in range(VOCAB):
                if probs[token] > 0:
                    extended[(*prefix, token)] = mass * float(probs[token])
        joint = extended
    return joint


def chi_square_p_value(counts: Counter, expected_probs: dict, total: int) -> float:
    """Pearson chi-square; cells expecting < 5 are pooled so the approximation holds."""
    statistic, cells, pooled_expected, pooled_observed = 0.0, 0, 0.0, 0
    for outcome in set(expected_probs) | set(counts):
        expected = expected_probs.get(outcome, 0.0) * total
        if expected < 5:
            pooled_expected += expected
            pooled_observed += counts.get(outcome, 0)
            continue
        statistic += (counts.get(outcome, 0) - expected) ** 2 / expected
        cells += 1
    if pooled_expected > 0:
        statistic += (pooled_observed - pooled_expected) ** 2 / max(pooled_expected, 1e-9)
        cells += 1
    dof = cells - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), torch.tensor(statistic / 2.0)))


class LookupDraft:
    """A deterministic draft (q one-hot): a fixed guess of the next tokens."""

    name = "lookup"

    def begin(self, prompt_ids):
        pass

    def observe(self, outcome):
        pass

    def end(self):
        pass

    def propose(self, context):
        return Draft(tuple((len(context.token_ids) * 5 + i) % VOCAB for i in range(context.max_len)), self.name)


class ModelDraft:
    """A draft that samples from its own q (a fixed, deliberately different distribution)."""

    name = "model"

    def begin(self, prompt_ids):
        pass

    def observe(self, outcome):
        pass

    def end(self):
        pass

    def propose(self, context):
        draft_probs = torch.tensor([[0.05, 0.4, 0.1, 0.25, 0.15, 0.05]] * context.max_len)  # [K, V]
        tokens = torch.multinomial(draft_probs, 1, generator=context.generator).squeeze(1)  # [K]
        return Draft(tuple(tokens.tolist()), self.name, draft_probs=draft_probs)


def sample_outputs(target, proposer, draft_len: int, samples: int = SAMPLES) -> Counter:
    counts = Counter()
    limits = GenerationLimits(max_new_tokens=NEW_TOKENS, max_draft_len=draft_len)
    for seed in range(samples):
        sampling = SamplingParams(SAMPLING.temperature, SAMPLING.top_k, SAMPLING.top_p, seed)
        counts[generate_all(target, PROMPT, proposer, sampling, limits).token_ids] += 1
    return counts


@pytest.fixture(scope="module")
def memo_target(small_vocab_target):
    return MemoTarget(small_vocab_target)


@pytest.fixture(scope="module")
def joint(memo_target):
    return exact_joint(memo_target, SAMPLING)


@pytest.mark.parametrize("proposer", [LookupDraft(), ModelDraft()], ids=["lookup-draft", "model-draft"])
def test_speculative_sampling_matches_target_distribution(memo_target, joint, proposer):
    counts = sample_outputs(memo_target, proposer, draft_len=2)
    assert sum(counts.values()) == SAMPLES
    assert chi_square_p_value(counts, joint, SAMPLES) > ALPHA


def test_plain_model_with_kv_cache_matches_too(small_vocab_target, joint):
    """The same property through the real KV-cached forward and rollback (fewer samples)."""
    samples = 2_000
    counts = sample_outputs(small_vocab_target, LookupDraft(), draft_len=2, samples=samples)
    assert chi_square_p_value(counts, joint, samples) > ALPHA


def always_accept(draft_ids, target_probs, generator):
    """A wrong acceptance rule (every draft token kept) the chi-square test must reject."""
    return verify_module.Verdict(
        len(draft_ids), verify_module.sample(target_probs[len(draft_ids)], generator), len(draft_ids)
    )


def test_the_check_rejects_a_wrong_acceptance_rule(memo_target, joint, monkeypatch):
    monkeypatch.setattr(verify_module, "verify_lookup_sampling", always_accept)
    counts = sample_outputs(memo_target, LookupDraft(), draft_len=2)
    assert chi_square_p_value(counts, joint, SAMPLES) < ALPHA


def test_seeded_requests_are_reproducible(small_vocab_target):
    limits = GenerationLimits(max_new_tokens=8, max_draft_len=3)
    sampling = SamplingParams(1.0, seed=1234)
    first = generate_all(small_vocab_target, PROMPT, LookupDraft(), sampling, limits).token_ids
    second = generate_all(small_vocab_target, PROMPT, LookupDraft(), sampling, limits).token_ids
    assert first == second


def test_enumeration_is_a_distribution(joint):
    assert abs(sum(joint.values()) - 1.0) < 1e-5
    assert all(len(outcome) == NEW_TOKENS for outcome in itertools.islice(joint, 10))
