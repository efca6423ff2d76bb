"""Reusable checks for "speculation never changes greedy output" (used by engine and proposer tests).

``assert_greedy_equivalent`` runs a proposer through the real decode loop and compares its tokens
with plain decoding. A mismatch is only excusable as a numerics tie: the test reports the target's
logit gap between the two candidate tokens at the first differing position (fresh prefill); a gap
under 1e-5 is float rounding between batched and single-token forwards, anything larger is a bug.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from codespec.core.config import GenerationLimits, SamplingParams
from codespec.core.decode import generate_all
from codespec.core.draft import NoDraft

TIE_GAP = 1e-5
STDLIB = Path(sysconfig.get_paths()["stdlib"])
CORPUS_FILES = ["json/encoder.py", "json/decoder.py", "textwrap.py", "shlex.py"]


def stdlib_corpus() -> list[str]:
    """A few standard-library files: always present, enough to train a small test tokenizer."""
    return [(STDLIB / name).read_text(encoding="utf-8") for name in CORPUS_FILES]


def plain_greedy(target, prompt_ids: Sequence[int], max_new_tokens: int) -> tuple[int, ...]:
    limits = GenerationLimits(max_new_tokens=max_new_tokens, max_draft_len=0)
    return generate_all(target, prompt_ids, NoDraft(), SamplingParams(), limits).token_ids


def logit_gap(target, prefix: Sequence[int], token_a: int, token_b: int) -> float:
    """|logit(a) - logit(b)| for the token after ``prefix``, from a fresh prefill."""
    logits = target.forward(list(prefix), target.new_cache(), keep_last=1)[0]  # [V]
    return abs(float(logits[token_a] - logits[token_b]))


def assert_greedy_equivalent(
    target, prompt_ids: Sequence[int], proposer, reference: Sequence[int], max_new_tokens: int, max_draft_len: int
) -> None:
    limits = GenerationLimits(max_new_tokens=max_new_tokens, max_draft_len=max_draft_len)
    got = generate_all(target, prompt_ids, proposer, SamplingParams(), limits).token_ids
    if tuple(got) == tuple(reference):
        return
    position = next((i for i, (a, b) in enumerate(zip(got, reference)) if a != b), min(len(got), len(reference)))
    if position < min(len(got), len(reference)):
        gap = logit_gap(target, [*prompt_ids, *reference[:position]], got[position], reference[position])
        assert gap < TIE_GAP, (
            f"speculative output differs from plain greedy at output position {position} "
            f"({got[position]} vs {reference[position]}) with a logit gap of {gap:.3g}: a bug, not a tie"
        )
    else:
        raise AssertionError(f"lengths differ: {len(got)} vs {len(reference)} tokens")


class ScriptedProposer:
    """A proposer for tests: ``script(sequence, max_len) -> draft token ids``."""

    def __init__(self, name: str, script: Callable[[Sequence[int], int], Sequence[int]]) -> None:
        self.name = name
        self.script = script
        self.outcomes = []

    def begin(self, prompt_ids):
        self.outcomes = []

    def propose(self, context):
        from codespec.core.draft import Draft

        return Draft(tuple(self.script(context.token_ids, context.max_len))[: context.max_len], self.name)

    def observe(self, outcome):
        self.outcomes.append(outcome)

    def end(self):
        pass


def oracle(full_sequence: Sequence[int]) -> Callable:
    """Always right: drafts the true greedy continuation."""

    def script(sequence, max_len):
        return full_sequence[len(sequence) : len(sequence) + max_len]

    return script


def always_wrong(full_sequence: Sequence[int], vocab_size: int) -> Callable:
    def script(sequence, max_len):
        truth = full_sequence[len(sequence) : len(sequence) + max_len]
        return [(token + 1) % vocab_size for token in truth]

    return script


def random_tokens(vocab_size: int, seed: int) -> Callable:
    generator = torch.Generator().manual_seed(seed)

    def script(sequence, max_len):
        return torch.randint(vocab_size, (max_len,), generator=generator).tolist()

    return script


def right_then_wrong(full_sequence: Sequence[int], vocab_size: int, right_steps: int) -> Callable:
    calls = [0]

    def script(sequence, max_len):
        calls[0] += 1
        truth = full_sequence[len(sequence) : len(sequence) + max_len]
        if calls[0] <= right_steps:
            return truth
        return [(token + 1) % vocab_size for token in truth]

    return script
