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

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from family_tokenizers import (  # noqa: F401  (STDLIB and corpus: the families' tests use them from here)
    DEEPSEEK_ROWS,
    QWEN_VOCAB,
    STARCODER2_VOCAB,
    STDLIB,
    corpus,
    deepseek_tokenizer,
    qwen_tokenizer,
    starcoder2_tokenizer,
)

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
