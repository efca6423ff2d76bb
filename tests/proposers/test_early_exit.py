"""Early exit: drafts come from the target's first E layers + norm + head; the model is restored."""

from __future__ import annotations

import copy

import pytest
import torch

from bench.shapes import random_llama
from codespec.core.config import GenerationLimits, SamplingParams
from codespec.core.decode import generate_all
from codespec.core.draft import NoDraft, ProposeContext
from codespec.core.errors import CodespecError
from codespec.core.model import TargetModel, truncated_layers
from codespec.core.sampling import make_generator, process_logits
from codespec.proposers.early_exit import EarlyExitProposer
from codespec.proposers.registry import ProposerSetup, create_proposer

LAYERS = 4


@pytest.fixture(scope="module")
def deep_target(tiny_target):
    """A 4-layer target sharing the tiny tokenizer (so exit layers 1..3 are all meaningful)."""
    model = random_llama(
        (64, LAYERS, 4, 2, 128), vocab_size=tiny_target.vocab_size, seed=3, init_std=0.25, max_context=512
    )
    return TargetModel(model, tiny_target.tokenizer, name="deep-tiny")


@pytest.fixture(scope="module")
def prompt(tiny_target):
    from engine_harness import stdlib_corpus

    return tiny_target.encode(stdlib_corpus()[2][:300])


def exit_logits(target: TargetModel, token_ids, exit_layer: int) -> torch.Tensor:
    """Reference: the full model's hidden state after layer E, through the final norm and head."""
    with torch.inference_mode():
        output = target.model(input_ids=torch.tensor([token_ids]), output_hidden_states=True)
        hidden = output.hidden_states[exit_layer][0, -1]  # [H] after decoder layer E
        return target.model.lm_head(target.model.model.norm(hidden)).float()  # [V]


def test_truncated_layers_restores_the_stack_when_the_body_raises(deep_target, prompt):
    layers = deep_target.model.model.layers
    before = deep_target.forward(prompt, deep_target.new_cache())
    with pytest.raises(RuntimeError, match="boom"):
        with truncated_layers(deep_target.model, 2):
            assert len(deep_target.model.model.layers) == 2
            raise RuntimeError("boom")
    assert deep_target.model.model.layers is layers and len(layers) == LAYERS
    torch.testing.assert_close(deep_target.forward(prompt, deep_target.new_cache()), before, atol=0, rtol=0)


def test_a_failing_draft_forward_leaves_the_target_whole(deep_target, prompt):
    """An exception inside the proposer's own forward (here a hook on layer 0) restores the layers."""
    layers = deep_target.model.model.layers
    proposer = EarlyExitProposer(deep_target, exit_layer=2)

    def fail(module, args):
        raise RuntimeError("layer failed")

    handle = layers[0].register_forward_pre_hook(fail)
    try:
        with pytest.raises(RuntimeError, match="layer failed"):
            proposer.propose(ProposeContext(prompt, len(prompt), 4))
    finally:
        handle.remove()
    assert deep_target.model.model.layers is layers and len(layers) == LAYERS


@pytest.mark.parametrize("exit_layer", [1, 3])
def test_draft_tokens_are_the_early_exit_argmax_chain(deep_target, prompt, exit_layer):
    proposer = EarlyExitProposer(deep_target, exit_layer=exit_layer)
    proposer.begin(prompt)
    draft = proposer.propose(ProposeContext(list(prompt), len(prompt), 5))
    sequence = list(prompt)
    for token in draft.token_ids:
        assert token == int(exit_logits(deep_target, sequence, exit_layer).argmax())
        sequence.append(token)
    assert len(draft) == 5 and draft.draft_probs is None


def test_sampled_drafts_carry_the_early_exit_q(deep_target, prompt):
    sampling = SamplingParams(temperature=0.8, top_k=20, seed=3)
    proposer = EarlyExitProposer(deep_target, exit_layer=2)
    proposer.begin(prompt)
    draft = proposer.propose(ProposeContext(list(prompt), len(prompt), 3, sampling, make_generator(3)))
    assert draft.draft_probs.shape == (3, deep_target.vocab_size)
    sequence = list(prompt)
    for row, token in zip(draft.draft_probs, draft.token_ids):
        expected = process_logits(exit_logits(deep_target, sequence, 2), sampling)  # [V]
        torch.testing.assert_close(row, expected, atol=1e-5, rtol=0)
        assert row[token] > 0
        sequence.append(token)


def test_exit_layer_must_leave_layers_to_skip(deep_target):
    for bad in (0, LAYERS):
        with pytest.raises(CodespecError, match="exit layer"):
            create_proposer("early-exit", ProposerSetup.from_options(deep_target, {"exit_layer": bad}))
    default = create_proposer("early-exit", ProposerSetup.from_options(deep_target, {}))
    assert default.exit_layer == 1 and default.min_confidence == 0.4  # a quarter of 4; stop when unsure


class CheckedEarlyExit(EarlyExitProposer):
    """After every observe(): the E-layer cache equals a fresh early-exit prefill of its tokens."""

    def begin(self, prompt_ids):
        super().begin(prompt_ids)
        self.sequence = list(prompt_ids)
        self.steps = self.rejections = 0

    def observe(self, outcome):
        super().observe(outcome)
        self.sequence.extend(outcome.emitted)
        self.rejections += outcome.rejected > 0
        cached = self.cache.token_ids
        assert cached == self.sequence[: len(cached)] and len(self.sequence) - len(cached) <= 3
        fresh = self.target.new_cache()
        with truncated_layers(self.target.model, self.exit_layer):
            self.target.forward(cached, fresh)
            if len(self.sequence) > len(cached):
                from_cache = self.target.forward(self.sequence[len(cached) :], copy.deepcopy(self.cache))
                from_scratch = self.target.forward(self.sequence, self.target.new_cache())
                torch.testing.assert_close(from_cache, from_scratch, atol=1e-4, rtol=0)
        for index in range(self.exit_layer):
            torch.testing.assert_close(
                self.cache.hf_cache.layers[index].keys, fresh.hf_cache.layers[index].keys, atol=1e-4, rtol=0
            )
            torch.testing.assert_close(
                self.cache.hf_cache.layers[index].values, fresh.hf_cache.layers[index].values, atol=1e-4, rtol=0
            )
        self.steps += 1


@pytest.mark.parametrize(
    "sampling", [SamplingParams(), SamplingParams(temperature=1.0, seed=2)], ids=["greedy", "sampling"]
)
def test_early_exit_cache_equals_a_fresh_prefill_after_every_step(deep_target, prompt, sampling):
    proposer = CheckedEarlyExit(deep_target, exit_layer=2)
    limits = GenerationLimits(max_new_tokens=24, max_draft_len=4)
    finished = generate_all(deep_target, prompt, proposer, sampling, limits)
    assert proposer.steps == len(finished.stats.steps) and proposer.rejections > 0
    assert len(deep_target.model.model.layers) == LAYERS
    if sampling.greedy:
        plain = generate_all(deep_target, prompt, NoDraft(), sampling, limits)
        assert finished.token_ids == plain.token_ids
