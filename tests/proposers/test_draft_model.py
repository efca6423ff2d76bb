"""Draft-model proposer: vocabulary checks, KV rollback in step with the target, exact sampling."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from bench.shapes import build_tokenizer, random_llama
from codespec.core.config import GenerationLimits, SamplingParams
from codespec.core.decode import generate_all
from codespec.core.draft import Draft, NoDraft
from codespec.core.errors import CodespecError
from codespec.core.model import TargetModel
from codespec.core.sampling import process_logits
from codespec.proposers.draft_model import DraftModelProposer
from codespec.proposers.registry import ProposerSetup, create_proposer


def perturbed(target: TargetModel, scale: float, seed: int) -> TargetModel:
    """A draft close to the target (some drafts accepted, some rejected): its weights plus noise."""
    model = copy.deepcopy(target.model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale * parameter.std())
    return TargetModel(model, target.tokenizer, name=f"perturbed-{scale}")


def save_model_with_tokenizer(directory, tokenizer, vocab_size: int, seed: int):
    model = random_llama((64, 2, 4, 2, 128), vocab_size=vocab_size, seed=seed, init_std=0.25, max_context=512)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def prompts(tiny_target):
    from engine_harness import stdlib_corpus

    text = "\n".join(stdlib_corpus())
    return [
        tiny_target.encode(text[start : start + length])
        for start, length in ((0, 200), (1500, 120), (4000, 300), (9000, 60))
    ]


# -- loading and vocabulary ---------------------------------------------------------------------
def test_from_setup_loads_a_draft_sharing_the_tokenizer(tiny_target, tiny_model_dir, tmp_path):
    directory = save_model_with_tokenizer(tmp_path / "draft", tiny_target.tokenizer, tiny_target.vocab_size, seed=9)
    proposer = create_proposer("draft", ProposerSetup.from_options(tiny_target, {"draft_model": str(directory)}))
    assert isinstance(proposer, DraftModelProposer)
    assert proposer.draft.device == tiny_target.device and proposer.draft.dtype == tiny_target.dtype
    assert proposer.min_confidence == 0.4  # transformers' assistant_confidence_threshold default
    full_length = create_proposer(
        "draft", ProposerSetup.from_options(tiny_target, {"draft_model": str(directory), "draft_min_confidence": 0})
    )
    assert full_length.min_confidence == 0.0


def test_a_draft_with_another_tokenizer_is_refused_clearly(tiny_target, tmp_path):
    other = build_tokenizer(["completely different text " * 50, "zzz yyy xxx " * 40], vocab_size=300)
    directory = save_model_with_tokenizer(tmp_path / "other", other, len(other), seed=3)
    with pytest.raises(CodespecError, match="does not share the target's tokenizer"):
        create_proposer("draft", ProposerSetup.from_options(tiny_target, {"draft_model": str(directory)}))


def test_no_draft_model_is_a_clear_error(tiny_target, monkeypatch):
    monkeypatch.setattr("codespec.proposers.draft_model.default_draft_path", lambda: None)
    with pytest.raises(CodespecError, match="no draft model"):
        create_proposer("draft", ProposerSetup.from_options(tiny_target, {}))


@pytest.mark.parametrize("extra", [-5, 7])
def test_draft_logit_width_is_fitted_to_the_target(tiny_target, prompts, extra):
    """A draft head wider or narrower than the target's: q rows have the target's width and
    padded ids are never drafted."""
    vocab = tiny_target.vocab_size
    model = random_llama((64, 2, 4, 2, 128), vocab_size=vocab + extra, seed=4, init_std=0.25)
    proposer = DraftModelProposer(TargetModel(model, tiny_target.tokenizer), vocab)
    limits = GenerationLimits(max_new_tokens=20, max_draft_len=4)
    sampling = SamplingParams(temperature=1.0, seed=1)
    captured = []
    original = proposer.propose
    proposer.propose = lambda context: captured.append(original(context)) or captured[-1]
    prompt = [token for token in prompts[0] if token < vocab + min(extra, 0)]  # ids the draft can read
    generate_all(tiny_target, prompt, proposer, sampling, limits)
    drafted = [d for d in captured if len(d)]
    assert drafted and all(d.draft_probs.shape == (len(d), vocab) for d in drafted)
    assert all(max(d.token_ids) < vocab + min(extra, 0) for d in drafted)


def test_a_draft_that_cannot_embed_every_token_is_refused(tiny_target, tmp_path):
    directory = save_model_with_tokenizer(tmp_path / "narrow", tiny_target.tokenizer, tiny_target.vocab_size - 5, 2)
    with pytest.raises(CodespecError, match="embeds only"):
        create_proposer("draft", ProposerSetup.from_options(tiny_target, {"draft_model": str(directory)}))


# -- greedy: the target as its own draft, and rollback ---------------------------------------
def test_target_as_its_own_draft_accepts_every_token(tiny_target, tiny_model_dir, prompts):
    proposer = DraftModelProposer(TargetModel.load(str(tiny_model_dir), device="cpu"), tiny_target.vocab_size)
    limits = GenerationLimits(max_new_tokens=30, max_draft_len=5)
    for prompt in prompts:
        plain = generate_all(tiny_target, prompt, NoDraft(), SamplingParams(), limits)
        spec = generate_all(tiny_target, prompt, proposer, SamplingParams(), limits)
        assert spec.token_ids == plain.token_ids
        assert spec.stats.accepted_tokens == spec.stats.drafted_tokens > 0
        assert len(spec.stats.steps) == math.ceil(30 / 6)  # K + 1 tokens per forward


class CheckedDraft(DraftModelProposer):
    """After every observe(): the draft cache must hold a prefix of the sequence, missing at most
    the tokens not yet fed, and equal a fresh prefill of that prefix (keys, values, next logits)."""

    def begin(self, prompt_ids):
        super().begin(prompt_ids)
        self.sequence = list(prompt_ids)
        self.checked = self.accepted = self.rejected = 0

    def observe(self, outcome):
        super().observe(outcome)
        self.sequence.extend(outcome.emitted)
        self.accepted += outcome.accepted
        self.rejected += outcome.rejected
        cached = self.cache.token_ids
        assert cached == self.sequence[: len(cached)], "draft cache holds tokens that are not in the sequence"
        # Unfed: the recovered token, or the last draft token and the bonus token after a full accept.
        unfed = len(self.sequence) - len(cached)
        if len(outcome.draft) and len(outcome.emitted) == outcome.accepted + 1:
            assert unfed == (2 if outcome.rejected == 0 else 1)
        fresh = self.draft.new_cache()
        self.draft.forward(cached, fresh, keep_last=1)
        for layer, fresh_layer in zip(self.cache.hf_cache.layers, fresh.hf_cache.layers):
            torch.testing.assert_close(layer.keys, fresh_layer.keys, atol=1e-4, rtol=0)
            torch.testing.assert_close(layer.values, fresh_layer.values, atol=1e-4, rtol=0)
        # Feeding the unfed tokens to (a copy of) the rolled-back cache gives a fresh prefill's logits.
        if unfed:
            cached_logits = self.draft.forward(self.sequence[len(cached) :], copy.deepcopy(self.cache), keep_last=1)
            full_logits = self.draft.forward(self.sequence, self.draft.new_cache(), keep_last=1)  # [1, V]
            torch.testing.assert_close(cached_logits, full_logits, atol=1e-4, rtol=0)
        self.checked += 1


@pytest.mark.parametrize(
    "sampling", [SamplingParams(), SamplingParams(temperature=1.0, top_p=0.9, seed=5)], ids=["greedy", "sampling"]
)
def test_draft_cache_equals_a_fresh_prefill_after_every_step(tiny_target, prompts, sampling):
    draft = perturbed(tiny_target, scale=0.3, seed=2)
    proposer = CheckedDraft(draft, tiny_target.vocab_size)
    totals = [0, 0]
    for prompt in prompts[:3]:
        for draft_len in (1, 3, 6):
            limits = GenerationLimits(max_new_tokens=24, max_draft_len=draft_len)
            finished = generate_all(tiny_target, prompt, proposer, sampling, limits)
            assert proposer.checked == len(finished.stats.steps)
            totals[0] += proposer.accepted
            totals[1] += proposer.rejected
    assert totals[0] > 0 and totals[1] > 0, "the draft should be partly right so both paths run"


def test_confidence_stop_shortens_drafts(tiny_target, prompts):
    proposer = DraftModelProposer(perturbed(tiny_target, 0.3, 2), tiny_target.vocab_size, min_confidence=1.0)
    finished = generate_all(
        tiny_target, prompts[0], proposer, SamplingParams(), GenerationLimits(max_new_tokens=12, max_draft_len=6)
    )
    drafted = [step.draft_len for step in finished.stats.steps if step.draft_len]
    assert len(drafted) >= 5 and set(drafted) == {1}  # depth 1 always, never beyond


def test_cache_survives_reuse_across_requests(tiny_target, prompts):
    """begin() keeps only what a new prompt shares with the old cache (prompt caching)."""
    proposer = CheckedDraft(perturbed(tiny_target, 0.3, 2), tiny_target.vocab_size)
    limits = GenerationLimits(max_new_tokens=10, max_draft_len=4)
    generate_all(tiny_target, prompts[1], proposer, SamplingParams(), limits)
    shared = prompts[1][:20]
    proposer.begin([*shared, 1, 2, 3])
    assert proposer.cache.token_ids == shared
    finished = generate_all(tiny_target, [*shared, 1, 2, 3], proposer, SamplingParams(), limits)
    plain = generate_all(tiny_target, [*shared, 1, 2, 3], NoDraft(), SamplingParams(), limits)
    assert finished.token_ids == plain.token_ids


# -- exact sampling, end to end ------------------------------------------------------------
SMALL_VOCAB = 16
SAMPLING = dict(temperature=0.9, top_k=4, top_p=0.95)
NEW_TOKENS = 3


def exact_joint(target: TargetModel, prompt, sampling: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(first NEW_TOKENS output tokens) by enumerating the (top-k limited) support; a sequence
    that reaches EOS earlier is a shorter cell."""
    joint = {(): 1.0}
    for _ in range(NEW_TOKENS):
        grown = {}
        for prefix, mass in joint.items():
            if prefix and prefix[-1] in target.eos_token_ids:  # the engine stops after EOS
                grown[prefix] = mass
                continue
            logits = target.forward([*prompt, *prefix], target.new_cache(), keep_last=1)[0]  # [V]
            probs = process_logits(logits, sampling)  # [V]
            for token in torch.nonzero(probs).flatten().tolist():
                grown[(*prefix, token)] = mass * float(probs[token])
        joint = grown
    return joint


def chi_square(counts: dict, expected_probs: dict, samples: int) -> tuple[float, int]:
    """Pearson statistic with cells of expected count < 5 pooled; returns (statistic, dof)."""
    statistic, pooled_observed, pooled_expected, cells = 0.0, 0, 0.0, 0
    assert set(counts) <= set(expected_probs), "sampled a sequence the target gives probability 0"
    for cell, probability in expected_probs.items():
        expected = probability * samples
        if expected < 5:
            pooled_observed += counts.get(cell, 0)
            pooled_expected += expected
            continue
        statistic += (counts.get(cell, 0) - expected) ** 2 / expected
        cells += 1
    if pooled_expected > 0:
        statistic += (pooled_observed - pooled_expected) ** 2 / pooled_expected
        cells += 1
    return statistic, cells - 1


def marginal(distribution: dict, position: int) -> dict:
    out: dict = {}
    for cell, value in distribution.items():
        key = cell[position] if position < len(cell) else None  # None: ended at EOS before
        out[key] = out.get(key, 0) + value
    return out


def views_failing(counts: dict, expected: dict, samples: int) -> list[str]:
    """Chi-square on the joint of all tokens and on each position's marginal; the views that fail."""
    failing = []
    views = [("joint", counts, expected)] + [
        (f"token {i + 1}", marginal(counts, i), marginal(expected, i)) for i in range(NEW_TOKENS)
    ]
    for name, observed, probabilities in views:
        statistic, dof = chi_square(observed, probabilities, samples)
        if dof > 0 and statistic > chi_square_critical(dof):
            failing.append(f"{name}: chi-square {statistic:.1f} > {chi_square_critical(dof):.1f} ({dof} dof)")
    return failing


def chi_square_critical(dof: int, z: float = 3.09) -> float:
    """Upper 0.1% point of chi-square (Wilson-Hilferty approximation)."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


class LyingDraft(DraftModelProposer):
    """Samples from q but claims a sharpened q: the known bug class exact sampling must catch."""

    def propose(self, context):
        draft = super().propose(context)
        if draft.draft_probs is None:
            return draft
        claimed = draft.draft_probs**3
        return Draft(draft.token_ids, self.name, claimed / claimed.sum(-1, keepdim=True), draft.match)


def run_samples(target, proposer, prompt, samples: int) -> dict:
    limits = GenerationLimits(max_new_tokens=NEW_TOKENS, max_draft_len=NEW_TOKENS - 1)
    counts: dict[tuple[int, ...], int] = {}
    for seed in range(samples):
        tokens = generate_all(target, prompt, proposer, SamplingParams(**SAMPLING, seed=seed), limits).token_ids
        counts[tokens] = counts.get(tokens, 0) + 1
    return counts


@pytest.fixture(scope="module")
def small_vocab_pair(tiny_target):
    """A 16-token target and a nearby draft (same tokenizer; ids < 16 are byte tokens)."""
    model = random_llama((32, 1, 2, 1, 64), vocab_size=SMALL_VOCAB, seed=11, init_std=0.3)
    target = TargetModel(model, tiny_target.tokenizer, name="small-vocab")
    return target, perturbed(target, scale=0.8, seed=12)


@pytest.mark.slow
def test_sampling_with_draft_model_is_exact(small_vocab_pair):
    """The first three sampled tokens follow the target's distribution: chi-square on their joint
    and on each marginal, 1,500 seeded runs, each view at its 0.1% critical value. Each run drafts
    2 tokens from q and verifies them, so acceptance, the residual and the bonus token all occur.
    A companion test shows that the same check flags a draft that misreports q."""
    target, draft = small_vocab_pair
    prompt = [3, 7, 1]
    expected = exact_joint(target, prompt, SamplingParams(**SAMPLING))
    proposer = DraftModelProposer(draft, SMALL_VOCAB)
    samples = 1500
    counts = run_samples(target, proposer, prompt, samples)
    assert not views_failing(counts, expected, samples)
    # The draft must have been partly rejected, or this says nothing about the residual path.
    finished = generate_all(
        target,
        prompt,
        proposer,
        SamplingParams(**SAMPLING, seed=0),
        GenerationLimits(max_new_tokens=60, max_draft_len=4),
    )
    assert 0 < finished.stats.accepted_tokens < finished.stats.drafted_tokens


def test_the_exactness_check_catches_a_draft_that_lies_about_q(small_vocab_pair):
    target, draft = small_vocab_pair
    prompt = [3, 7, 1]
    expected = exact_joint(target, prompt, SamplingParams(**SAMPLING))
    samples = 400
    counts = run_samples(target, LyingDraft(draft, SMALL_VOCAB), prompt, samples)
    assert views_failing(counts, expected, samples), "a draft claiming the wrong q went unnoticed"


def test_confidence_stop_mid_draft_keeps_greedy_output_identical(tiny_target, prompts):
    """A low-confidence stop leaves every draft token fed to the draft cache (not K - 1): the next
    steps must still roll back and catch up correctly."""
    limits = GenerationLimits(max_new_tokens=24, max_draft_len=6)
    lengths = set()
    for threshold in (0.3, 0.6):
        proposer = DraftModelProposer(perturbed(tiny_target, 0.3, 2), tiny_target.vocab_size, min_confidence=threshold)
        for prompt in prompts[:3]:
            spec = generate_all(tiny_target, prompt, proposer, SamplingParams(), limits)
            plain = generate_all(tiny_target, prompt, NoDraft(), SamplingParams(), limits)
            assert spec.token_ids == plain.token_ids
            lengths |= {step.draft_len for step in spec.stats.steps if step.draft_len}
    assert len(lengths - {6}) >= 2, f"drafts should stop at several depths, got lengths {sorted(lengths)}"
