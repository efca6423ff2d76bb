"""Greedy output with each model-based proposer and with ``auto`` equals plain decoding
(``--proposer none``), over several prompts and draft lengths (the engine's equivalence harness)."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from codespec.model import TargetModel
from codespec.registry import ProposerSetup, create_proposer
from codespec.shapes import random_llama
from engine_harness import assert_greedy_equivalent, plain_greedy
from proposers.auto import AutoProposer
from proposers.draft_model import DraftModelProposer
from proposers.early_exit import EarlyExitProposer

MAX_NEW = 24
DRAFT_LENS = (1, 3, 8, 16)


@pytest.fixture(scope="module")
def cases(tiny_target):
    from engine_harness import stdlib_corpus

    rng = random.Random(11)
    text = "\n".join(stdlib_corpus())
    prompts = []
    for index in range(8):
        start = rng.randrange(0, len(text) - 400)
        window = text[start:start + rng.randrange(40, 240)]
        if index % 2:
            window += "\n" + window[: len(window) // 2]  # repeated structure: context lookup fires
        prompts.append(tiny_target.encode(window))
    return [(prompt, plain_greedy(tiny_target, prompt, MAX_NEW)) for prompt in prompts]


def nearby(target: TargetModel, scale: float) -> TargetModel:
    """The target's weights plus noise: a draft that is right part of the time."""
    model = copy.deepcopy(target.model)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale * parameter.std())
    return TargetModel(model, target.tokenizer)


def builders(target, model_dir):
    unrelated = random_llama((64, 2, 4, 2, 128), vocab_size=target.vocab_size, seed=21, init_std=0.25)
    return {
        "draft-self": lambda: DraftModelProposer(TargetModel.load(str(model_dir), device="cpu"), target.vocab_size),
        "draft-nearby": lambda: DraftModelProposer(nearby(target, 0.3), target.vocab_size),
        "draft-unrelated": lambda: DraftModelProposer(TargetModel(unrelated, target.tokenizer), target.vocab_size),
        "early-exit": lambda: EarlyExitProposer(target, exit_layer=1),
        "auto": lambda: create_proposer("auto", ProposerSetup(target, {"draft_model": str(model_dir)})),
        "auto-nearby": lambda: AutoProposer(
            lookups=[create_proposer("context", ProposerSetup(target, {"min_ngram": 1}))],
            models=[DraftModelProposer(nearby(target, 0.3), target.vocab_size), EarlyExitProposer(target, 1)],
        ),
    }


@pytest.mark.parametrize("kind", ["draft-self", "draft-nearby", "draft-unrelated", "early-exit", "auto",
                                  "auto-nearby"])
def test_greedy_output_equals_plain_decoding(tiny_target, tiny_model_dir, cases, kind):
    # One instance across all requests: state (caches, statistics) carries over between them.
    proposer = Counting(builders(tiny_target, tiny_model_dir)[kind]())
    for prompt, reference in cases:
        for draft_len in DRAFT_LENS:
            assert_greedy_equivalent(tiny_target, prompt, proposer, reference, MAX_NEW, draft_len)
    if kind in ("draft-self", "draft-nearby", "auto-nearby"):
        assert proposer.accepted > 0  # the draft path really ran and was verified
    if kind == "draft-self":
        assert proposer.accepted == proposer.drafted


class Counting:
    """Passes every call through; counts drafted and accepted tokens."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = inner.name
        self.drafted = self.accepted = 0

    def begin(self, prompt_ids):
        self.inner.begin(prompt_ids)

    def propose(self, context):
        return self.inner.propose(context)

    def observe(self, outcome):
        self.drafted += len(outcome.draft)
        self.accepted += outcome.accepted
        self.inner.observe(outcome)

    def end(self):
        self.inner.end()
