"""Prompt formats per model family: detected from the tokenizer's special tokens, spelled as each
family's model card documents, overridable, and a chat template used for rewrites when present."""

from __future__ import annotations

import pytest
from engine_harness import stdlib_corpus

from bench.shapes import build_tokenizer
from codespec.core.errors import InvalidRequestError
from codespec.core.prompts import FORMATS, Fim, PromptRenderer, Rewrite, detect_format, resolve_format

FAMILY_TOKENS = {
    "qwen2.5-coder": [
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|fim_pad|>",
        "<|file_sep|>",
        "<|repo_name|>",
    ],
    "starcoder2": ["<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>", "<file_sep>", "<repo_name>"],
    "deepseek-coder": [
        "<｜fim▁begin｜>",
        "<｜fim▁hole｜>",
        "<｜fim▁end｜>",
        "<｜end▁of▁sentence｜>",
        "<｜begin▁of▁sentence｜>",
    ],
    "codellama": ["▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>", "<s>", "</s>"],
    "plain": [],
}
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizers():
    corpus = stdlib_corpus()
    made = {}
    for family, specials in FAMILY_TOKENS.items():
        tokenizer = build_tokenizer(corpus, 384, specials)
        if family in ("deepseek-coder", "codellama"):
            tokenizer.bos_token = specials[-2] if family == "codellama" else specials[-1]
        made[family] = tokenizer
    return made


def test_each_family_is_detected_from_its_tokens(tokenizers):
    for family, tokenizer in tokenizers.items():
        assert detect_format(tokenizer).name == family


def test_fim_layouts_as_the_model_cards_give_them(tokenizers):
    fim = Fim("def f(x):\n    ", "\n    return y\n")
    rendered = {family: PromptRenderer(tok, detect_format(tok)).render(fim).text for family, tok in tokenizers.items()}
    assert rendered["qwen2.5-coder"] == "<|fim_prefix|>def f(x):\n    <|fim_suffix|>\n    return y\n<|fim_middle|>"
    assert rendered["starcoder2"] == "<fim_prefix>def f(x):\n    <fim_suffix>\n    return y\n<fim_middle>"
    assert rendered["deepseek-coder"] == (
        "<｜begin▁of▁sentence｜><｜fim▁begin｜>def f(x):\n    <｜fim▁hole｜>\n    return y\n<｜fim▁end｜>"
    )
    assert rendered["codellama"] == "<s>▁<PRE> def f(x):\n     ▁<SUF>\n    return y\n ▁<MID>"
    assert rendered["plain"] == "def f(x):\n    "  # no FIM tokens: prefix-only completion


def test_fim_markers_stay_single_tokens_and_end_markers_stop(tokenizers):
    for family, tokenizer in tokenizers.items():
        spec = detect_format(tokenizer)
        renderer = PromptRenderer(tokenizer, spec)
        vocab = tokenizer.get_vocab()
        for marker in spec.fim_tokens or ():
            assert tokenizer.encode(marker, add_special_tokens=False) == [vocab[marker]], (family, marker)
        assert set(renderer.end_markers) <= set(spec.end_markers)
        assert tokenizer.eos_token_id in renderer.stop_token_ids()
        assert {vocab[m] for m in renderer.end_markers} <= renderer.stop_token_ids()


def test_rewrites_use_the_family_layout_without_a_chat_template(tokenizers):
    rewrite = Rewrite("x = 1\n", "rename x")
    qwen = PromptRenderer(tokenizers["qwen2.5-coder"], FORMATS["qwen2.5-coder"]).render(rewrite)
    assert qwen.text == "<|file_sep|>original.py\nx = 1\n<|file_sep|>instruction.txt\nrename x\n<|file_sep|>edited.py\n"
    starcoder = PromptRenderer(tokenizers["starcoder2"], FORMATS["starcoder2"]).render(rewrite)
    assert starcoder.text.startswith("<file_sep>original.py\nx = 1\n") and starcoder.text.endswith(
        "<file_sep>edited.py\n"
    )
    plain = PromptRenderer(tokenizers["plain"], FORMATS["plain"]).render(Rewrite("x = 1\n"))
    assert plain.text == "# Original:\nx = 1\n\n# Rewritten:\n" and plain.stop == ()


def test_a_chat_template_renders_rewrites_and_the_closing_fence_stops(tokenizers):
    tokenizer = build_tokenizer(stdlib_corpus(), 384, ["<|im_start|>", "<|im_end|>", *FAMILY_TOKENS["qwen2.5-coder"]])
    tokenizer.chat_template = CHAT_TEMPLATE
    renderer = PromptRenderer(tokenizer, detect_format(tokenizer))
    rendered = renderer.render(Rewrite("x = 1", "rename x to y"))
    assert rendered.text == (
        "<|im_start|>user\nrename x to y\n\n```\nx = 1\n```<|im_end|>\n<|im_start|>assistant\n```\n"
    )
    assert rendered.stop == ("```",)
    assert "<|im_end|>" in renderer.end_markers
    # FIM is unchanged by the chat template
    assert renderer.render(Fim("a", "b")).text == "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>"


def test_the_format_can_be_named_and_a_wrong_name_is_a_clear_error(tokenizers):
    assert resolve_format(tokenizers["plain"], "starcoder2").name == "starcoder2"
    assert resolve_format(tokenizers["starcoder2"], "auto").name == "starcoder2"
    with pytest.raises(InvalidRequestError, match="unknown prompt format 'gpt'"):
        resolve_format(tokenizers["plain"], "gpt")


def test_the_shipped_model_is_qwen_format():
    from transformers import AutoTokenizer

    from codespec.core.default_model import target_path

    assert detect_format(AutoTokenizer.from_pretrained(str(target_path()))).name == "qwen2.5-coder"
