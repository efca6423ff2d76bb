"""Greedy output with each model-based proposer, with the lookups that draft from an edited copy of
the output (reference, index) and with ``auto`` equals plain decoding (``--proposer none``), over
several prompts and draft lengths (the engine's equivalence harness)."""

from __future__ import annotations

import copy
import random

import engine_harness
import pytest
import torch
from engine_harness import assert_greedy_equivalent, plain_greedy

from bench.shapes import random_llama
from codespec.core.model import TargetModel
from codespec.index import WorkspaceIndex
from codespec.proposers.auto import AutoProposer
from codespec.proposers.draft_model import DraftModelProposer
from codespec.proposers.early_exit import EarlyExitProposer
from codespec.proposers.index_lookup import IndexLookup
from codespec.proposers.reference import ReferenceLookup
from codespec.proposers.registry import ProposerSetup, create_proposer

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
        window = text[start : start + rng.randrange(40, 240)]
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
        "auto": lambda: create_proposer("auto", ProposerSetup.from_options(target, {"draft_model": str(model_dir)})),
        "auto-nearby": lambda: AutoProposer(
            lookups=[create_proposer("context", ProposerSetup.from_options(target, {"min_ngram": 1}))],
            models=[DraftModelProposer(nearby(target, 0.3), target.vocab_size), EarlyExitProposer(target, 1)],
        ),
    }


@pytest.mark.parametrize(
    "kind",
    [
        "draft-self",
        pytest.param("draft-nearby", marks=pytest.mark.slow),
        pytest.param("draft-unrelated", marks=pytest.mark.slow),
        "early-exit",
        "auto",
        "auto-nearby",
    ],
)
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


# -- lookups over an edited copy of the output: drafts partly accepted --------------------------


def edited_copy(target: TargetModel, output_ids) -> list[int]:
    """The plain greedy output with an insertion, a deletion and a replaced word (token-level
    edits, so every aligned stretch is exactly the target's own tokens): a reference that is
    right in stretches of 3 to 8 tokens, so drafts are accepted in part and the copy pointer
    must re-anchor after each edit."""
    ids = list(output_ids)
    size = len(ids)
    insert_at, delete_at, replace_at = size // 5, size // 2, 3 * size // 4
    return (
        ids[:insert_at]
        + target.encode("# note\n")
        + ids[insert_at:delete_at]  # inserted line
        + ids[delete_at + 3 : replace_at]  # three tokens deleted
        + target.encode(" value")
        + ids[replace_at + 2 :]
    )  # two tokens replaced by a word


@pytest.fixture(scope="module")
def edited(tiny_target, cases):
    """Per case: the edited copy as text (what a client sends) and as the target's ids."""
    out = []
    for _, reference in cases:
        ids = edited_copy(tiny_target, reference)
        out.append((tiny_target.decode(ids), ids))
    return out


@pytest.fixture
def decoded(monkeypatch):
    """Every decode result that ``assert_greedy_equivalent`` produces, for its statistics."""
    results = []
    real = engine_harness.generate_all

    def generate_all(*args, **kwargs):
        result = real(*args, **kwargs)
        results.append(result)
        return result

    monkeypatch.setattr(engine_harness, "generate_all", generate_all)
    return results


def edit_builders(target, edited):
    """kind -> (case number -> proposer). A random model's output is rarely valid UTF-8 or its
    text's canonical tokenization, so "reference" (the text only, as ``--reference`` gives it)
    matches in places, and "reference-ids" is given the target's own ids too, as a client sending
    prediction tokens would; the index holds every case's edited text."""
    workspace = WorkspaceIndex(target.tokenizer, db_path=None)
    for number, (text, _) in enumerate(edited):
        workspace.add_document(f"case{number}.py", text, 1)
    index = IndexLookup(workspace)  # one instance for all requests, as a server keeps it

    def with_ids(number):
        text, ids = edited[number]
        return ReferenceLookup(
            text, lambda piece: list(ids) if piece == text else target.encode(piece), tokenizer=target.tokenizer
        )

    def auto(number):
        return create_proposer(
            "auto",
            ProposerSetup.from_options(
                target,
                {
                    "reference": edited[number][0],
                    "index": workspace,
                    "auto_state": "fresh",
                    # no draft model: the shipped one does not fit this target, and it would win anyway
                    "auto_candidates": "context,reference,index,early-exit",
                },
            ),
        )

    def next_edit(number):
        # an edit renaming a word the edited copy holds: the predicted copy differs from it, so
        # both of the next-edit proposer's pointers draft (and are verified)
        text = edited[number][0]
        word = max(text.split(), key=len, default="value")
        options = {"reference": text, "edits": [(f"x = {word}\n", f"x = {word}_v2\n")]}
        return create_proposer("next-edit", ProposerSetup.from_options(target, options))

    return {
        "reference": lambda number: create_proposer(
            "reference", ProposerSetup.from_options(target, {"reference": edited[number][0]})
        ),
        "next-edit": next_edit,
        "reference-ids": with_ids,
        "index": lambda number: index,
        "auto": auto,
    }


@pytest.mark.parametrize("kind", ["reference", "reference-ids", "next-edit", "index", "auto"])
def test_greedy_output_equals_plain_decoding_with_an_edited_reference(tiny_target, cases, edited, decoded, kind):
    build = edit_builders(tiny_target, edited)[kind]
    for number, (prompt, reference) in enumerate(cases):
        proposer = build(number)  # a new reference per request; auto keeps its sub-proposers' state
        for draft_len in DRAFT_LENS:
            assert_greedy_equivalent(tiny_target, prompt, proposer, reference, MAX_NEW, draft_len)
    assert len(decoded) == len(cases) * len(DRAFT_LENS)
    steps = [step for result in decoded for step in result.stats.steps]
    lookups = {"reference", "index", "next-edit"}
    accepted = sum(step.accepted for step in steps if step.proposer in lookups)
    rejected = sum(step.draft_len - step.accepted for step in steps if step.proposer in lookups)
    # Drafts from the edited copy were verified both ways: some tokens accepted, some rejected,
    # and some drafts cut short after accepted tokens (the rollback after partial acceptance).
    assert accepted >= 40 and rejected > 0
    assert sum(1 for step in steps if step.proposer in lookups and 0 < step.accepted < step.draft_len) >= 10
    if kind == "auto":
        assert {step.proposer for step in steps if step.draft_len} >= {"reference", "index"}  # the policy chose each
