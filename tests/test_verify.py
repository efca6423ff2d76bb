"""Verification on literal small arrays (as vLLM's rejection-sampler tests do)."""

from __future__ import annotations

import pytest
import torch

from codespec.core.config import SamplingParams
from codespec.core.draft import Draft
from codespec.core.sampling import process_logits
from codespec.core.verify import verify, verify_greedy, verify_lookup_sampling, verify_model_sampling


def one_hot_rows(tokens, vocab=5):
    return torch.nn.functional.one_hot(torch.tensor(tokens), vocab).float()  # [K+1, V]


def test_greedy_accepts_matching_prefix_and_recovers_at_first_mismatch():
    logits = one_hot_rows([3, 1, 4, 0])  # target argmax per position
    verdict = verify_greedy([3, 1, 2], logits)
    assert (verdict.accepted, verdict.next_token) == (2, 4)
    assert verdict.emitted([3, 1, 2]) == [3, 1, 4]


def test_greedy_all_accepted_emits_bonus():
    verdict = verify_greedy([3, 1, 4], one_hot_rows([3, 1, 4, 0]))
    assert (verdict.accepted, verdict.next_token, verdict.bonus) == (3, 0, True)


def test_empty_draft_is_a_plain_step():
    verdict = verify_greedy([], one_hot_rows([2]))
    assert (verdict.accepted, verdict.next_token) == (0, 2)


def test_lookup_sampling_with_certain_target_is_deterministic():
    target_probs = one_hot_rows([3, 1, 4, 0])
    generator = torch.Generator().manual_seed(0)
    verdict = verify_lookup_sampling([3, 1, 2], target_probs, generator)
    # p(3)=1, p(1)=1 accepted; p(2)=0 rejected; the recovered token comes from p without 2.
    assert (verdict.accepted, verdict.next_token) == (2, 4)


def test_lookup_sampling_never_resamples_the_rejected_token():
    target_probs = torch.tensor([[0.5, 0.5, 0.0, 0.0]] * 2)  # [K+1=2, V=4]
    for seed in range(200):
        verdict = verify_lookup_sampling([0], target_probs, torch.Generator().manual_seed(seed))
        if verdict.accepted == 0:
            assert verdict.next_token == 1


def test_model_sampling_accepts_when_target_dominates_draft():
    draft_probs = torch.tensor([[0.25, 0.25, 0.25, 0.25]])  # [K=1, V]
    target_probs = torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])  # [K+1, V]
    verdict = verify_model_sampling([1], draft_probs, target_probs, torch.Generator().manual_seed(0))
    assert (verdict.accepted, verdict.next_token) == (1, 0)  # p/q = 4 >= 1: always accept; bonus 0


def test_model_sampling_residual_excludes_overdrafted_tokens():
    draft_probs = torch.tensor([[0.9, 0.1, 0.0, 0.0]])
    target_probs = torch.tensor([[0.3, 0.1, 0.6, 0.0], [0.25] * 4])
    for seed in range(200):
        verdict = verify_model_sampling([0], draft_probs, target_probs, torch.Generator().manual_seed(seed))
        if verdict.accepted == 0:
            assert verdict.next_token == 2  # max(0, p - q) is non-zero only at token 2


def test_dispatch_uses_draft_probs_only_when_present():
    logits = torch.log(torch.tensor([[0.1, 0.9], [0.5, 0.5]]))
    sampling = SamplingParams(temperature=1.0)
    draft = Draft((1,), "x", draft_probs=torch.tensor([[0.0, 1.0]]))
    verdict = verify(draft, logits, sampling, torch.Generator().manual_seed(1))
    assert verdict.draft_len == 1


def test_top_k_and_top_p_transforms():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0]])
    top_k = process_logits(logits, SamplingParams(temperature=1.0, top_k=2))
    assert top_k[0, 2:].sum() == 0 and abs(float(top_k.sum()) - 1) < 1e-6
    top_p = process_logits(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert top_p[0, 0] == 1.0  # the top token alone already holds >= 50% of the mass
    with pytest.raises(ValueError):
        process_logits(logits, SamplingParams())


def test_draft_probs_must_match_draft_length():
    with pytest.raises(ValueError):
        Draft((1, 2), "x", draft_probs=torch.ones(1, 4) / 4)
