"""Greedy speculative output is token-identical to plain greedy decoding, whatever the drafts."""

from __future__ import annotations

import random

import pytest
import torch
from engine_harness import (
    ScriptedProposer,
    always_wrong,
    assert_greedy_equivalent,
    oracle,
    plain_greedy,
    random_tokens,
    right_then_wrong,
    stdlib_corpus,
)

from codespec.proposers.registry import ProposerSetup, create_proposer

MAX_NEW = 24
DRAFT_LENS = (1, 2, 4, 8, 16)


def make_prompts(target, count: int = 50) -> list[list[int]]:
    """Half plain code windows, half with repeated structure so context lookup fires."""
    rng = random.Random(7)
    text = "\n".join(stdlib_corpus())
    prompts = []
    for index in range(count):
        start = rng.randrange(0, len(text) - 400)
        window = text[start : start + rng.randrange(40, 240)]
        if index % 2:
            window = window + "\n" + window[: len(window) // 2]  # repeat: the model may copy
        prompts.append(target.encode(window) or [1])
    return prompts


@pytest.fixture(scope="module")
def cases(tiny_target):
    prompts = make_prompts(tiny_target)
    references = [plain_greedy(tiny_target, prompt, MAX_NEW) for prompt in prompts]
    return prompts, references


def test_plain_engine_matches_transformers_generate(tiny_target, cases):
    prompts, references = cases
    eos = sorted(tiny_target.eos_token_ids) or None
    for prompt, reference in zip(prompts, references):
        output = tiny_target.model.generate(
            torch.tensor([prompt]),
            do_sample=False,
            max_new_tokens=MAX_NEW,
            eos_token_id=eos,
            pad_token_id=0,
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        )[0, len(prompt) :].tolist()
        if eos:  # transformers pads after EOS; the engine stops there
            output = output[: len(reference)]
        assert tuple(output) == tuple(reference)


@pytest.mark.parametrize(
    "kind",
    [
        "oracle",
        pytest.param("always_wrong", marks=pytest.mark.slow),
        pytest.param("random", marks=pytest.mark.slow),
        "right_then_wrong",
        "context",
    ],
)
def test_speculative_greedy_equals_plain(tiny_target, cases, kind):
    prompts, references = cases
    vocab = tiny_target.vocab_size
    forwards_saved = 0
    for case, (prompt, reference) in enumerate(zip(prompts, references)):
        full = [*prompt, *reference]
        for draft_len in DRAFT_LENS:
            if kind == "context":
                proposer = create_proposer("context", ProposerSetup.from_options(tiny_target, {"min_ngram": 1}))
            else:
                script = {
                    "oracle": lambda: oracle(full),
                    "always_wrong": lambda: always_wrong(full, vocab),
                    "random": lambda: random_tokens(vocab, seed=case * 31 + draft_len),
                    "right_then_wrong": lambda: right_then_wrong(full, vocab, right_steps=2),
                }[kind]()
                proposer = ScriptedProposer(kind, script)
            assert_greedy_equivalent(tiny_target, prompt, proposer, reference, MAX_NEW, draft_len)
            if kind == "oracle":
                forwards = len(proposer.outcomes)
                # An always-right draft of length K advances K + 1 tokens per forward.
                assert forwards == -(-len(reference) // (draft_len + 1))
                forwards_saved += len(reference) - forwards
    if kind == "oracle":
        assert forwards_saved > 0
