"""The prompt formats: exact strings, and that the default tokenizer keeps every marker one token."""

from __future__ import annotations

import pytest

from codespec.core import prompts


def test_fim_prompt_is_prefix_suffix_middle_like_qwen():
    assert prompts.fim_prompt("a = ", "\nb = 2\n") == "<|fim_prefix|>a = <|fim_suffix|>\nb = 2\n<|fim_middle|>"


def test_rewrite_prompt_without_and_with_instruction():
    original = "def f():\n    return 1\n"
    assert prompts.rewrite_prompt(original) == (
        "<|file_sep|>original.py\ndef f():\n    return 1\n<|file_sep|>edited.py\n"
    )
    with_instruction = prompts.rewrite_prompt(original, "  rename f to g \n")
    assert with_instruction == (
        "<|file_sep|>original.py\ndef f():\n    return 1\n"
        "<|file_sep|>instruction.txt\nrename f to g\n<|file_sep|>edited.py\n"
    )
    # An empty instruction is the same as none (the model then copies).
    assert prompts.rewrite_prompt(original, "") == prompts.rewrite_prompt(original)


def test_examples_end_with_the_end_token():
    assert prompts.rewrite_example("x\n", "y\n").endswith("<|file_sep|>edited.py\ny\n<|endoftext|>")
    assert prompts.fim_example("a", "b", "c") == "<|fim_prefix|>a<|fim_suffix|>c<|fim_middle|>b<|endoftext|>"


def test_cut_at_end_marker_takes_the_earliest_marker():
    assert prompts.cut_at_end_marker("x = 1\n<|file_sep|>more<|endoftext|>") == "x = 1\n"
    assert prompts.cut_at_end_marker("no marker") == "no marker"


@pytest.fixture(scope="module")
def default_tokenizer():
    from transformers import AutoTokenizer

    from codespec.core.default_model import target_path

    path = target_path()
    assert path is not None, "the default model is not shipped in codespec/models/default/target"
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def test_every_marker_is_one_special_token(default_tokenizer):
    for marker in prompts.SPECIAL_TOKENS:
        ids = default_tokenizer.encode(marker, add_special_tokens=False)
        assert len(ids) == 1, marker
        assert default_tokenizer.convert_ids_to_tokens(ids) == [marker]
    assert default_tokenizer.eos_token == prompts.END_OF_TEXT


def test_stop_token_ids_cover_eos_and_file_separator(default_tokenizer):
    vocab = default_tokenizer.get_vocab()
    stops = prompts.stop_token_ids(default_tokenizer)
    assert stops == {vocab[m] for m in prompts.END_MARKERS}
    assert default_tokenizer.eos_token_id in stops


def test_prompt_markers_tokenize_apart_from_the_code(default_tokenizer):
    """The original region is tokenized the same in the prompt as on its own line of a file."""
    code = "def f(x):\n    return x\n"
    ids = default_tokenizer.encode(prompts.rewrite_prompt(code), add_special_tokens=False)
    sep = default_tokenizer.convert_tokens_to_ids(prompts.FILE_SEP)
    assert ids.count(sep) == 2
    assert default_tokenizer.decode(ids, skip_special_tokens=False) == prompts.rewrite_prompt(code)
