"""The training recipe's moving parts: LR schedules, the bridge, probe-picked weights, batched probes."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from codespec.core.default_model import target_path
from training.trainer import Shape, TrainConfig, build_llama, lr_at, train


def test_mixture_lr_schedules():
    config = replace(
        TrainConfig(),
        peak_lr=1e-3,
        mix_lr=5e-4,
        warmup_steps=10,
        min_lr_ratio=0.1,
        schedule="linear_tail",
        decay_fraction=0.25,
        total_steps=1100,
    )
    assert lr_at(50, None, config) == 1e-3  # curriculum: the curriculum's peak
    assert lr_at(100, 100, config) == lr_at(849, 100, config) == 5e-4  # constant before the tail
    assert lr_at(975, 100, config) == pytest.approx(5e-4 * (1 - 0.9 * 0.5))
    assert lr_at(1100, 100, config) == pytest.approx(5e-5)
    cosine = replace(config, schedule="cosine")
    assert lr_at(100, 100, cosine) == pytest.approx(5e-4)
    assert lr_at(600, 100, cosine) == pytest.approx(5e-4 * (0.1 + 0.9 * 0.5))
    assert lr_at(1100, 100, cosine) == pytest.approx(5e-5)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(target_path()))


def tiny_maker(tokenizer):
    from training.examples import ExampleMaker

    functions = [
        "def area(width, height):\n    return width * height\n",
        "def greet(name):\n    print('hello', name)\n    return name\n",
    ]
    files = ["import os\n\n\n" + "\n".join(functions)]
    stream = tokenizer.encode(files[0], add_special_tokens=False) * 20
    frequent = sorted(set(stream))
    return ExampleMaker(tokenizer, files, functions, stream, frequent, random.Random(0))


@pytest.mark.slow
def test_train_runs_every_phase_and_keeps_the_best_probed_weights(tokenizer, tmp_path):
    shape = Shape(hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64)
    target = build_llama(shape, len(tokenizer), tokenizer.eos_token_id, 256, 0)
    draft = build_llama(shape, len(tokenizer), tokenizer.eos_token_id, 256, 1)
    draft_before = {k: v.clone() for k, v in draft.state_dict().items()}
    config = TrainConfig(
        copy_stages=((16, 0.0, 3), (64, 0.0, 2)),
        copy_batch=(2, 32),
        mix_batch=(2, 64),
        bridge_stages=((64, 2, 2, 32),),
        mix_steps=6,
        probe_every=2,
        draft_every=2,
        warmup_steps=2,
        checkpoint_every=1000,
        log_every=1000,
    )
    scores = iter([0.2, 0.9, 0.3])
    snapshots = []

    def probe(model) -> float:
        snapshots.append({k: v.clone() for k, v in model.state_dict().items()})
        return next(scores)

    result = train(target, draft, tiny_maker(tokenizer), config, tmp_path, log=lambda _: None, probe=probe)
    assert (result.copy_steps, result.bridge_steps, result.steps) == (5, 2, 13)
    assert result.probes == [(2, 0.2), (4, 0.9), (6, 0.3)]
    assert result.best_step == 4
    kept = target.state_dict()
    assert all(torch.equal(kept[k], snapshots[1][k]) for k in kept)  # the 0.9 weights, not the last
    assert not all(torch.equal(snapshots[1][k], snapshots[2][k]) for k in kept)
    assert not all(torch.equal(draft.state_dict()[k], draft_before[k]) for k in draft_before)
    assert (tmp_path / "checkpoint.pt").exists()


@pytest.mark.slow
def test_batched_probes_agree_with_the_one_at_a_time_evaluation(tokenizer):
    """probe.py ranks checkpoints during training; it must measure what evaluate.py (the card, the
    tests' bars) measures, function by function, despite left padding."""
    from codespec.core.model import TargetModel
    from training import probe
    from training.corpus import heldout_functions
    from training.evaluate import copy_check, fim_check, fim_split

    target = TargetModel.load(str(target_path()), device="cpu", dtype="float32")
    functions = heldout_functions(8)
    for function in functions:
        expected = copy_check(target, function).exact
        assert probe.copy_probe(target.model, tokenizer, [function]) == float(expected)
    batched_copy = probe.copy_probe(target.model, tokenizer, functions)
    assert batched_copy == sum(copy_check(target, fn).exact for fn in functions) / len(functions)
    splits = [s for s in (fim_split(fn) for fn in functions) if s is not None]
    batched_fim = probe.fim_probe(target.model, tokenizer, splits)
    assert batched_fim == sum(fim_check(target, *s).valid for s in splits) / len(splits)


def test_finishing_phase_is_deterministic_and_can_keep_the_starting_weights(tokenizer):
    """The FIM finishing phase probes its starting weights too: if nothing beats them, they ship.
    Two runs from the same weights give the same weights (what --resume relies on)."""
    from training.finish import FinishConfig, finish

    shape = Shape(hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64)
    config = FinishConfig(steps=4, batch=(2, 64), probe_every=2, warmup_steps=1, log_every=1000)
    start = build_llama(shape, len(tokenizer), tokenizer.eos_token_id, 256, 0).state_dict()

    def run(scores):
        model = build_llama(shape, len(tokenizer), tokenizer.eos_token_id, 256, 0)
        model.load_state_dict(start)
        values = iter(scores)
        result = finish(model, tiny_maker(tokenizer), config, lambda _: next(values), log=lambda _: None)
        return result, model.state_dict()

    result, kept = run([0.9, 0.2, 0.3])
    assert result.best_step == 0 and result.probes == [(0, 0.9), (2, 0.2), (4, 0.3)]
    assert all(torch.equal(kept[k], start[k]) for k in start)
    first, trained = run([0.1, 0.2, 0.3])
    second, again = run([0.1, 0.2, 0.3])
    assert first.best_step == second.best_step == 4 and first.steps == 4
    assert not all(torch.equal(trained[k], start[k]) for k in start)
    assert all(torch.equal(trained[k], again[k]) for k in start)


def test_fim_repeat_rows_repeat_the_region_and_put_the_loss_on_the_middle_only(tokenizer):
    """The context-copy phase's FIM rows with repeated code: the region, blank lines, its repetition
    with a gap; the loss on the middle and its end token only, and the middle can be copied."""
    from codespec.core import prompts
    from training.examples import IGNORE

    function = (
        "def area(width, height):\n    if width < 0:\n        raise ValueError(width)\n    return width * height\n"
    )
    maker = tiny_maker(tokenizer)
    maker.region = lambda max_chars=600: function
    same = renamed = 0
    for _ in range(30):
        ids, targets = maker.fim_repeat_row()
        assert len(ids) == len(targets)
        text = tokenizer.decode(ids, skip_special_tokens=False)
        assert text.startswith(prompts.FIM_PREFIX) and text.endswith(prompts.END_OF_TEXT)
        prefix = text[len(prompts.FIM_PREFIX) : text.index(prompts.FIM_SUFFIX)]
        suffix = text[text.index(prompts.FIM_SUFFIX) + len(prompts.FIM_SUFFIX) : text.index(prompts.FIM_MIDDLE)]
        assert prefix.startswith(function + "\n")
        trained = [t for t in targets if t != IGNORE]
        assert ids[len(ids) - len(trained) - 1] == tokenizer.convert_tokens_to_ids(prompts.FIM_MIDDLE)
        middle = tokenizer.decode(trained, skip_special_tokens=False)
        assert middle.endswith(prompts.END_OF_TEXT) and middle[: -len(prompts.END_OF_TEXT)].strip()
        repetition = prefix[len(function) :].lstrip("\n") + middle[: -len(prompts.END_OF_TEXT)] + suffix
        assert repetition.count("\n") == function.count("\n")  # the gap's bounds put the copy back
        same += repetition == function
        renamed += repetition != function
    assert same and renamed  # the same code again, or a near-copy with a name changed


def test_context_copy_probe_rejects_steps_that_lose_fim_validity(monkeypatch):
    """With a tolerance, a probed step whose FIM validity falls more than it below the first probe's
    (the starting weights') scores under the starting weights, however much it copies."""
    from training import probe

    monkeypatch.setattr(probe, "copy_probe", lambda model, tok, fns: model[0])
    monkeypatch.setattr(probe, "fim_probe", lambda model, tok, splits: model[1])
    monkeypatch.setattr(probe, "plain_copy_probe", lambda model, tok, fns: model[2])
    monkeypatch.setattr("training.corpus.heldout_functions", lambda count, files=None: [])
    messages = []
    score = probe.context_copy_scorer(None, [], fim_tolerance=0.03, log=messages.append)
    start = score((0.85, 0.55, 0.0))
    assert start == pytest.approx(1.40)
    assert score((0.90, 0.53, 0.80)) == pytest.approx(2.23)  # within the tolerance
    assert score((0.95, 0.50, 0.90)) < start  # FIM 5 points down: never kept
    assert "rejected" in messages[-1] and "rejected" not in messages[1]
    plain = probe.context_copy_scorer(None, [])
    plain((0.85, 0.55, 0.0))
    assert plain((0.95, 0.30, 0.90)) == pytest.approx(2.15)  # no tolerance: the plain sum
