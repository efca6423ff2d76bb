"""The shipped default models: offline loading, tokenizer round trips, and the capability bars.

The bars run the same checks as the model card (training/evaluate.py) on held-out
standard-library functions, with the context-lookup proposer for speed (greedy output is identical
to plain greedy decoding, so the proposer does not change what is measured).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from codespec.core.default_model import draft_path, target_path

COPY_FUNCTIONS = 30
FIM_FUNCTIONS = 30
PLAIN_COPY_FUNCTIONS = 40  # the card's evaluation set (training/evaluate.py)


@pytest.fixture(scope="module")
def target():
    from codespec.core.model import TargetModel

    path = target_path()
    assert path is not None, "codespec/models/default/target is missing"
    return TargetModel.load(str(path), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def heldout_functions():
    from training.corpus import heldout_functions

    return heldout_functions(max(COPY_FUNCTIONS, FIM_FUNCTIONS))


def test_shipped_models_are_small_and_in_the_package():
    total = 0
    for path in (target_path(), draft_path()):
        assert path is not None
        assert path.is_relative_to(os.path.dirname(__import__("codespec").__file__))
        total += (path / "model.safetensors").stat().st_size
    assert total <= 30 * 1024 * 1024


@pytest.mark.slow
def test_both_models_load_offline_in_a_fresh_process():
    script = (
        "import json, sys\n"
        "from codespec.core.default_model import target_path, draft_path\n"
        "from codespec.core.model import TargetModel\n"
        "t = TargetModel.load(str(target_path()), device='cpu', dtype='float32')\n"
        "d = TargetModel.load(str(draft_path()), device='cpu', dtype='float32')\n"
        "print(json.dumps({'target_vocab': t.vocab_size, 'draft_vocab': d.vocab_size,\n"
        "  'dtype': str(t.dtype), 'eos': sorted(t.eos_token_ids), 'draft_eos': sorted(d.eos_token_ids),\n"
        "  'target_layers': t.model.config.num_hidden_layers, 'draft_layers': d.model.config.num_hidden_layers,\n"
        "  'same_vocab': t.tokenizer.get_vocab() == d.tokenizer.get_vocab()}))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout.strip().splitlines()[-1])
    assert info["target_vocab"] == info["draft_vocab"] == 4096
    assert info["same_vocab"] and info["dtype"] == "torch.float32"
    assert info["eos"] == info["draft_eos"] == [0]
    assert info["draft_layers"] < info["target_layers"]


@pytest.mark.parametrize(
    "text",
    [
        "def naïve(café):\n\treturn '日本語 ✓ 🐍'\r\n",
        "\t\tx = 1\r\n\r\n    y = '\\t'\n",
        's = "\\u00e9"  # é ß Ω\n\n\n',
        "",
    ],
)
def test_tokenizer_round_trips_source_text(target, text):
    assert target.decode(target.encode(text)) == text


def test_cli_default_model_is_the_shipped_target():
    from codespec.commands.generate import default_model_path

    assert default_model_path() == str(target_path())


def test_rewrite_prompt_copies_heldout_functions(target, heldout_functions):
    """Bar: greedy rewrite output reproduces >= 80% of 30 held-out functions exactly, then EOS."""
    from codespec.proposers.context import ContextLookup
    from training.evaluate import copy_check

    functions = heldout_functions[:COPY_FUNCTIONS]
    assert len(functions) == COPY_FUNCTIONS
    results = [copy_check(target, fn, ContextLookup()) for fn in functions]
    rate = sum(r.exact for r in results) / len(results)
    failures = [r for r in results if not r.exact][:2]
    assert rate >= 0.8, f"copy rate {rate:.0%} < 80%; e.g. {failures}"


def test_plain_context_copies_heldout_functions(target, heldout_functions):
    """Bar (issue 17): given a held-out function, two blank lines and its header again, greedy decoding
    writes the body's first 60 characters exactly for >= 60% of the model card's 40 functions, as real
    code models copy from plain context (what makes lookup drafts acceptable outside the template)."""
    from codespec.proposers.context import ContextLookup
    from training.corpus import heldout_functions as card_functions
    from training.evaluate import plain_copy_check

    functions = card_functions(PLAIN_COPY_FUNCTIONS)
    assert functions[:COPY_FUNCTIONS] == heldout_functions[:COPY_FUNCTIONS]
    rate = sum(plain_copy_check(target, fn, ContextLookup()) for fn in functions) / len(functions)
    assert rate >= 0.6, f"plain-context copy rate {rate:.0%} < 60%"


def test_fim_completes_a_removed_line_with_valid_python(target, heldout_functions):
    """Bar: with one body line removed, >= 50% of completions make the function parse again."""
    from codespec.proposers.context import ContextLookup
    from training.evaluate import fim_check, fim_split

    splits = [s for s in (fim_split(fn) for fn in heldout_functions[:FIM_FUNCTIONS]) if s is not None]
    assert len(splits) >= 25
    results = [fim_check(target, *split, proposer=ContextLookup()) for split in splits]
    valid = sum(r.valid for r in results) / len(results)
    assert valid >= 0.5, f"FIM validity {valid:.0%} < 50%"
    # A completion is one non-empty line; an empty answer must not count as valid.
    assert all(r.completion.endswith("\n") for r in results)
    assert not any(r.valid for r in results if not r.completion.strip())


def test_rewrite_output_ends_with_eos_not_the_budget(target):
    from training.evaluate import copy_check

    result = copy_check(target, "def add(a, b):\n    return a + b\n")
    assert result.reason == "eos", result


def test_copy_rescue_identity_rows_put_the_loss_on_the_copy_only():
    """The copy-rescue phase's unchanged-rewrite rows: no loss on the prompt, loss on the copy + end token."""
    import random

    from transformers import AutoTokenizer

    from codespec.core import prompts
    from training.examples import IGNORE, ExampleMaker

    tokenizer = AutoTokenizer.from_pretrained(str(target_path()))
    function = "def area(width, height):\n    return width * height\n"
    maker = ExampleMaker(tokenizer, ["x = 1\ny = 2\n"], [function], [5, 6, 7], [5, 6, 7], random.Random(0))
    maker.region = lambda max_chars=600: function  # always the one function
    ids, targets = maker.identity_row()
    assert len(ids) == len(targets)
    prompt_len = len(maker.encode(prompts.rewrite_prompt(function)))
    assert all(t == IGNORE for t in targets[: prompt_len - 1])
    trained = [t for t in targets if t != IGNORE]
    assert tokenizer.decode(trained).endswith(function + prompts.END_OF_TEXT)
    assert len(trained) <= len(ids) - prompt_len + 1


def test_copy_rescue_lr_is_constant_then_decays():
    from training.rescue import RescueConfig, rescue_lr

    config = RescueConfig(steps=100, lr=1e-3, decay_fraction=0.2)
    assert rescue_lr(0, config) == rescue_lr(79, config) == 1e-3
    assert rescue_lr(90, config) < 1e-3
    assert rescue_lr(99, config) == pytest.approx(1e-3 * (1 - 0.9 * 19 / 20))


def test_fim_middle_rows_put_the_loss_on_the_middle_only():
    """The finishing phase's FIM rows: no loss on prefix or suffix; the middle + end token trained;
    the parts always put the text back together, and the cursor sometimes has text after it."""
    import random

    from transformers import AutoTokenizer

    from codespec.core import prompts
    from training.examples import IGNORE, ExampleMaker

    tokenizer = AutoTokenizer.from_pretrained(str(target_path()))
    function = (
        "def area(width, height):\n    if width < 0:\n        raise ValueError(width)\n\n"
        "    return width * height  # square units\n"
    )
    maker = ExampleMaker(tokenizer, ["x = 1\n"], [function], [5, 6, 7], [5, 6, 7], random.Random(0))
    maker.region = lambda max_chars=600: function
    mid_line = 0
    for _ in range(60):
        prefix, middle, suffix = maker.fim_parts(function)
        assert prefix + middle + suffix == function and middle.strip()
        mid_line += not prefix.endswith("\n") and prefix != "" and suffix.startswith(("\n", ")", " ", "("))
    assert mid_line >= 5
    ids, targets = maker.fim_middle_row()
    trained = [t for t in targets if t != IGNORE]
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert text.startswith(prompts.FIM_PREFIX) and text.endswith(prompts.END_OF_TEXT)
    assert ids[len(ids) - len(trained) - 1] == tokenizer.convert_tokens_to_ids(prompts.FIM_MIDDLE)
    middle = tokenizer.decode(trained, skip_special_tokens=False)
    assert middle.endswith(prompts.END_OF_TEXT) and middle[: -len(prompts.END_OF_TEXT)] in function


def test_finishing_lr_warms_up_then_decays_to_the_floor():
    from training.finish import FinishConfig, finish_lr

    config = FinishConfig(steps=100, lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    assert finish_lr(0, config) == pytest.approx(1e-4)
    assert finish_lr(10, config) == pytest.approx(1e-3)
    assert finish_lr(55, config) < 1e-3
    assert finish_lr(100, config) == pytest.approx(1e-4)
