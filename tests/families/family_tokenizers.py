"""The tokenizers of tests/families/family_layouts.py's families, in each family's hub layout
(tokenizer.json, tokenizer_config.json): BPE merges learned from a few standard-library files,
each family's pre-tokenizer pipeline, added tokens and ids (that module's docstring says which)."""

from __future__ import annotations

import functools
import json
import random
import sysconfig
from pathlib import Path

STDLIB = Path(sysconfig.get_paths()["stdlib"])
CORPUS_FILES = ["json/encoder.py", "json/decoder.py", "textwrap.py", "shlex.py"]

QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN_VOCAB = 151_936
QWEN_BPE = 151_643  # ids of the BPE vocabulary; Qwen's added tokens follow
QWEN_SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
QWEN_PLAIN = [
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
]  # added tokens, not "special" (as in Qwen2.5-Coder's files)
# Qwen2.5's template without the tools branch (the part a rewrite uses).
QWEN_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role != 'system' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

STARCODER2_VOCAB = 49_152
STARCODER2_SPECIAL = [
    "<|endoftext|>",
    "<fim_prefix>",
    "<fim_middle>",
    "<fim_suffix>",
    "<fim_pad>",
    "<repo_name>",
    "<file_sep>",
    "<issue_start>",
    "<issue_comment>",
    "<issue_closed>",
    "<jupyter_start>",
    "<jupyter_text>",
    "<jupyter_code>",
    "<jupyter_output>",
    "<jupyter_script>",
    "<empty_output>",
]

DEEPSEEK_BPE = 32_013
DEEPSEEK_ADDED = [
    ("<｜begin▁of▁sentence｜>", True),
    ("<｜end▁of▁sentence｜>", True),
    ("<｜fim▁hole｜>", False),
    ("<｜fim▁begin｜>", False),
    ("<｜fim▁end｜>", False),
    ("<pad>", True),
    ("<|User|>", False),
    ("<|Assistant|>", False),
    ("<|EOT|>", True),
]  # ids 32,013 .. 32,021
DEEPSEEK_ROWS = 32_256  # the model's embedding is wider than the tokenizer, as in deepseek-coder
DEEPSEEK_LETTERS = "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-Ֆ]+"  # its letter class, abridged


def corpus() -> list[str]:
    return [(STDLIB / name).read_text(encoding="utf-8") for name in CORPUS_FILES]


# -- tokenizers ---------------------------------------------------------------------------------
def _train(normalizer, pre_tokenizer, vocab_size: int) -> tuple[list[str], list[tuple[str, str]]]:
    """Learned BPE tokens (merge results, in merge order) and merges over the byte alphabet."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus(), trainer)
    model = json.loads(tokenizer.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return [a + b for a, b in merges], merges


def _byte_alphabet() -> list[str]:
    from codespec.index.tokens import unicode_to_byte

    return sorted(unicode_to_byte(), key=unicode_to_byte().__getitem__)  # byte 0 .. 255


def spread_vocab(learned: list[str], size: int, seed: int, spread: bool) -> dict[str, int]:
    """``size`` BPE ids: the byte alphabet at 0-255, the learned tokens at ``spread`` slots over the
    whole range (shuffled, so how common a token is says nothing about its id) or right after the
    alphabet, and unreachable filler tokens everywhere else."""
    vocab = {char: i for i, char in enumerate(_byte_alphabet())}
    learned = [t for t in dict.fromkeys(learned) if t not in vocab]
    if spread:
        step = (size - 1 - 256) / max(len(learned) - 1, 1)
        slots = [256 + round(k * step) for k in range(len(learned))]
        random.Random(seed).shuffle(slots)
    else:
        slots = list(range(256, 256 + len(learned)))
    vocab.update(zip(learned, slots))
    taken = set(vocab.values())
    vocab.update({f"¿fill{i}": i for i in range(size) if i not in taken})
    assert sorted(vocab.values()) == list(range(size))
    return vocab


def _bpe(vocab: dict[str, int], merges: list[tuple[str, str]]):
    from tokenizers import models

    return models.BPE(
        vocab=vocab,
        merges=merges,
        dropout=None,
        unk_token=None,
        continuing_subword_prefix="",
        end_of_word_suffix="",
        fuse_unk=False,
        byte_fallback=False,
    )


def _added_tokens_decoder(tokenizer) -> dict[str, dict]:
    return {
        str(i): {
            "content": t.content,
            "lstrip": t.lstrip,
            "normalized": t.normalized,
            "rstrip": t.rstrip,
            "single_word": t.single_word,
            "special": t.special,
        }
        for i, t in sorted(tokenizer.get_added_tokens_decoder().items())
    }


def _write(directory: Path, tokenizer, config: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"added_tokens_decoder": _added_tokens_decoder(tokenizer), **config}
    (directory / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )


def qwen_tokenizer(directory: Path, instruct: bool = False) -> None:
    """Qwen2.5-Coder's tokenizer layout (``instruct``: the -Instruct variant's chat template and EOS)."""
    from tokenizers import Tokenizer

    config = {
        "add_prefix_space": False,
        "additional_special_tokens": QWEN_SPECIAL[1:],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>" if instruct else "<|endoftext|>",
        "errors": "replace",
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    if instruct:
        config["chat_template"] = QWEN_CHAT_TEMPLATE
    _write(directory, Tokenizer.from_str(_qwen_backend()), config)


@functools.lru_cache(maxsize=1)
def _qwen_backend() -> str:
    """The Qwen tokenizer as tokenizer.json text (built once per process: ~1 s)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers

    def pipeline(tokenizer):
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
            ]
        )
        tokenizer.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
        return tokenizer

    probe = pipeline(Tokenizer(_bpe({}, [])))
    learned, merges = _train(probe.normalizer, probe.pre_tokenizer, 3000)
    tokenizer = pipeline(Tokenizer(_bpe(spread_vocab(learned, QWEN_BPE, seed=0, spread=True), merges)))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN_SPECIAL])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN_PLAIN])
    reserved = QWEN_VOCAB - tokenizer.get_vocab_size(with_added_tokens=True)
    tokenizer.add_special_tokens(
        [AddedToken(f"<|reserved_{k}|>", special=True, normalized=False) for k in range(reserved)]
    )
    assert tokenizer.get_vocab_size(with_added_tokens=True) == QWEN_VOCAB
    assert tokenizer.token_to_id("<|endoftext|>") == 151_643 and tokenizer.token_to_id("<|file_sep|>") == 151_664
    return tokenizer.to_str()


def starcoder2_tokenizer(directory: Path) -> None:
    """StarCoder2's layout: its special tokens at ids 0.., Digits + ByteLevel, 49,152 ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers

    pre = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    learned, merges = _train(None, pre, 2000)
    specials = len(STARCODER2_SPECIAL)
    base = spread_vocab(learned, STARCODER2_VOCAB - specials, seed=1, spread=False)
    vocab = {**{t: i for i, t in enumerate(STARCODER2_SPECIAL)}, **{t: i + specials for t, i in base.items()}}
    tokenizer = Tokenizer(_bpe(vocab, merges))
    tokenizer.pre_tokenizer = pre
    tokenizer.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in STARCODER2_SPECIAL])
    assert tokenizer.get_vocab_size(with_added_tokens=True) == STARCODER2_VOCAB
    _write(
        directory,
        tokenizer,
        {
            "additional_special_tokens": STARCODER2_SPECIAL,
            "bos_token": "<|endoftext|>",
            "clean_up_tokenization_spaces": True,
            "eos_token": "<|endoftext|>",
            "model_max_length": 1_000_000_000,
            "tokenizer_class": "GPT2Tokenizer",
            "unk_token": "<|endoftext|>",
            "vocab_size": STARCODER2_VOCAB,
        },
    )


def deepseek_tokenizer(directory: Path) -> None:
    """DeepSeek-Coder's layout: Split / Digits / ByteLevel, 32,013 BPE ids, then its added tokens;
    BOS added by the post-processor (the product encodes without it and spells it in the prompt)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors

    def split(pattern: str):
        return pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)

    pre = pre_tokenizers.Sequence(
        [
            split("[\r\n]"),
            split(DEEPSEEK_LETTERS),
            split("\\s?[!-/:-~！-／：-～‘-‟　-。]+"),
            split("\\s+$"),
            split("[一-龥ࠀ-一가-퟿]+"),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    normalizer = normalizers.Sequence([])
    learned, merges = _train(normalizer, pre, 2000)
    tokenizer = Tokenizer(_bpe(spread_vocab(learned, DEEPSEEK_BPE, seed=2, spread=True), merges))
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre
    tokenizer.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    for content, special in DEEPSEEK_ADDED:
        token = AddedToken(content, special=special, normalized=not special)
        (tokenizer.add_special_tokens if special else tokenizer.add_tokens)([token])
    bos = "<｜begin▁of▁sentence｜>"
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, 32_013)]
    )
    assert tokenizer.token_to_id(bos) == 32_013 and tokenizer.token_to_id("<｜fim▁begin｜>") == 32_016
    _write(
        directory,
        tokenizer,
        {
            "add_bos_token": True,
            "add_eos_token": False,
            "bos_token": bos,
            "clean_up_tokenization_spaces": False,
            "eos_token": "<｜end▁of▁sentence｜>",
            "legacy": True,
            "model_max_length": 16384,
            "pad_token": "<｜end▁of▁sentence｜>",
            "sp_model_kwargs": {},
            "tokenizer_class": "LlamaTokenizerFast",
            "unk_token": None,
        },
    )
