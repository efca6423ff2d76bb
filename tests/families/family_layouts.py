"""Random-weight checkpoints in each model family's on-disk layout, for tests/families/.

Each is what ``save_pretrained`` writes for that architecture (config.json, generation_config.json,
model.safetensors) next to the files a hub checkpoint of the family ships for its tokenizer
(tokenizer.json, tokenizer_config.json), so the product loads it exactly as it would load the
real one (``TargetModel.load``: ``AutoTokenizer`` / ``AutoModelForCausalLM``, offline):

- ``qwen2.5-coder``: Qwen2ForCausalLM, 151,936 embedding rows tied to the LM head, qkv bias; the
  tokenizer has Qwen's pipeline (NFC, the Split regex then ``ByteLevel(use_regex=False)``, BPE),
  Qwen's added tokens at Qwen's ids (``<|endoftext|>`` = 151,643 ... ``<|file_sep|>`` = 151,664;
  the FIM and file tokens not "special", as on the hub) and exactly 151,936 ids, the learned
  tokens spread over the whole id space so most of real text encodes to ids above 65,535;
- ``qwen2.5-coder-instruct``: the same with a chat template and ``<|im_end|>`` as EOS;
- ``starcoder2``: Starcoder2ForCausalLM (LayerNorm, biases, tied head, a sliding window shorter
  than the test prompts) with StarCoder2's tokenizer layout (special tokens at ids 0.., Digits +
  ByteLevel pre-tokenizer, 49,152 ids);
- ``deepseek-coder``: LlamaForCausalLM (linear RoPE scaling, no GQA) with 32,256 embedding rows
  and DeepSeek-Coder's tokenizer (32,022 ids: its Split / Digits / ByteLevel pipeline, BOS
  ``<｜begin▁of▁sentence｜>`` added by the post-processor, the FIM tokens at 32,015-32,017).

Weights are random (init std 0.25, biases random too, so they matter); a family's draft model is
a two-layer model of the same class sharing the target's embedding, first layers, final norm and
head (a real drafter: it agrees with the target often enough that drafts are both accepted and
rejected). The BPE merges are learned from a few standard-library files.
"""

from __future__ import annotations

import functools
import json
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

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

INIT_STD = 0.25

# The layouts of issue 14 (a)-(d), and Qwen2 with use_sliding_window on (a KV cache case).
FAMILIES = ("qwen2.5-coder", "starcoder2", "deepseek-coder", "qwen2.5-coder-instruct")
ALL_FAMILIES = (*FAMILIES, "qwen2.5-coder-sliding")


@dataclass(frozen=True)
class Family:
    """One family's saved checkpoints and what the product must make of them."""

    name: str  # test id
    prompt_format: str  # the codespec.prompts.FORMATS name the product must detect
    target: Path
    draft: Path
    layers: int  # the target's depth
    chat: bool = False  # the tokenizer has a chat template (rewrites go through it)


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
    from index.tokens import unicode_to_byte

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


# -- models -------------------------------------------------------------------------------------
LATE_LAYER_SCALE = 0.3  # layers after the first write this much less into the residual stream


def randomize(model, seed: int) -> None:
    """Seeded random weights everywhere (biases included: transformers initializes them to zero),
    norms near one; tied weights stay tied. The output projections of layers after the first are
    scaled down, so a model's first layers already predict its output often, not always: early
    exit and a two-layer draft then see drafts both accepted and rejected."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.copy_(1.0 + 0.1 * torch.randn(parameter.shape, generator=generator))
                continue
            scale = INIT_STD
            parts = name.split(".")
            if (
                "layers" in parts
                and int(parts[parts.index("layers") + 1]) >= 1
                and parts[-2] in ("o_proj", "down_proj", "c_proj")
            ):
                scale *= LATE_LAYER_SCALE
            parameter.copy_(scale * torch.randn(parameter.shape, generator=generator))


def mute(model, live: set[int]) -> None:
    """Zero the LM-head rows of every id but ``live`` (the ids real text encodes to): their logit is
    exactly 0 while a live token's is of order +-3, so greedy output is made of real tokens and
    decodes to text that encodes back to much the same ids. With tied embeddings this zeroes the
    input rows too (the added tokens read as zero vectors: a random model has no use for them)."""
    head = model.get_output_embeddings().weight  # [V, H]
    keep = torch.zeros(head.shape[0], dtype=torch.bool)
    keep[sorted(i for i in live if i < head.shape[0])] = True
    with torch.no_grad():
        head[~keep] = 0.0


def live_ids(tokenizer_dir: Path) -> set[int]:
    """Ids of the BPE vocabulary's byte alphabet and learned tokens (not fillers, not added)."""
    saved = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    added = {token["id"] for token in saved["added_tokens"]}
    return {i for token, i in saved["model"]["vocab"].items() if not token.startswith("¿fill") and i not in added}


def qwen2_config(layers: int = 4, sliding_window: int | None = None, eos: int | list[int] = 151_643, **extra):
    from transformers import Qwen2Config

    sliding = (
        {"use_sliding_window": True, "sliding_window": sliding_window, "max_window_layers": 1}
        if sliding_window
        else {"use_sliding_window": False, "sliding_window": 131_072, "max_window_layers": layers}
    )
    return Qwen2Config(
        vocab_size=QWEN_VOCAB,
        hidden_size=32,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=151_643,
        eos_token_id=eos,
        **sliding,
        **extra,
    )


def starcoder2_config(layers: int = 4, sliding_window: int | None = 40):
    from transformers import Starcoder2Config

    return Starcoder2Config(
        vocab_size=STARCODER2_VOCAB,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        sliding_window=sliding_window,
        use_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 999_999.44},
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
    )


def deepseek_config(layers: int = 4, rows: int = DEEPSEEK_ROWS):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=rows,
        hidden_size=64,
        intermediate_size=172,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 100_000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=32_013,
        eos_token_id=32_014,
    )


def build_model(config, seed: int, live: set[int] | None = None):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    randomize(model, seed)
    if live is not None:
        mute(model, live)
    return model


def draft_of(target, config):
    """A smaller model of the target's class: the target's embedding, first layers, norm and head."""
    draft = build_model(config, seed=0)  # every tensor is overwritten below
    own = draft.state_dict()
    with torch.no_grad():
        for name, tensor in target.state_dict().items():
            if name in own and own[name].shape == tensor.shape:
                own[name].copy_(tensor)
            elif name in own:  # a narrower embedding or head: the first rows
                own[name].copy_(tensor[: own[name].shape[0]])
    return draft


def save(model, directory: Path, tokenizer_from: Path | None = None) -> Path:
    import shutil

    model.generation_config.bos_token_id = model.config.bos_token_id
    model.generation_config.eos_token_id = model.config.eos_token_id
    model.generation_config.pad_token_id = None
    model.save_pretrained(directory)
    if tokenizer_from is not None:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tokenizer_from / name, directory / name)
    return directory


def build_family(name: str, root: Path) -> Family:
    """Write ``name``'s target and draft under ``root`` (tokenizer files in both)."""
    target_dir, draft_dir = root / "target", root / "draft"
    target_dir.mkdir(parents=True)
    if name in ("qwen2.5-coder", "qwen2.5-coder-instruct"):
        instruct = name.endswith("instruct")
        qwen_tokenizer(target_dir, instruct=instruct)
        eos = [151_645, 151_643] if instruct else 151_643
        target = build_model(qwen2_config(4, eos=eos), seed=11, live=live_ids(target_dir))
        draft = draft_of(target, qwen2_config(2, eos=eos))
        fmt = "qwen2.5-coder"
    elif name == "qwen2.5-coder-sliding":  # use_sliding_window: layers >= max_window_layers slide
        qwen_tokenizer(target_dir)
        target = build_model(qwen2_config(4, sliding_window=24), seed=12, live=live_ids(target_dir))
        draft = draft_of(target, qwen2_config(2, sliding_window=24))
        fmt = "qwen2.5-coder"
    elif name == "starcoder2":
        starcoder2_tokenizer(target_dir)
        target = build_model(starcoder2_config(4), seed=13, live=live_ids(target_dir))
        draft = draft_of(target, starcoder2_config(2))
        fmt = "starcoder2"
    elif name == "deepseek-coder":
        deepseek_tokenizer(target_dir)
        target = build_model(deepseek_config(4), seed=14, live=live_ids(target_dir))
        draft = draft_of(target, deepseek_config(2, rows=32_022))  # exactly the tokenizer's ids
        fmt = "deepseek-coder"
    else:
        raise ValueError(f"unknown family {name!r}")
    save(target, target_dir)
    save(draft, draft_dir, tokenizer_from=target_dir)
    return Family(name, fmt, target_dir, draft_dir, target.config.num_hidden_layers, chat=name.endswith("instruct"))
