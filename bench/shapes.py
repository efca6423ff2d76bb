"""Random-weight models of named sizes, and small byte-level BPE tokenizers.

Random weights are the right tool for engine tests (tiny shapes) and for replay-mode timing
(realistic shapes): compute cost depends on the shape, not on what the weights learned.

Two kinds of shape:
- ``SHAPES``: Llamas of a few sizes (hidden, layers, heads, kv heads, intermediate), vocabulary
  sized to the tokenizer (the engine tests and the quick profile's 30m);
- ``PUBLISHED``: the exact published configuration of a real code model (architecture, widths,
  attention layout, biases, norms, RoPE, vocabulary size and embedding tying), so a forward costs
  what that model's forward costs. The shipped tokenizer (4,096 ids) drives them; its ids simply
  use the first rows of the 151,936 / 49,152 / ... embedding and LM-head rows, and the LM head
  computes every row, as the real model does. Sources: docs/benchmarks.md ("Model shapes").
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

# hidden, layers, heads, kv heads, intermediate
SHAPES: dict[str, tuple[int, int, int, int, int]] = {
    "tiny": (64, 2, 4, 2, 128),
    "30m": (512, 8, 8, 4, 1408),
    "100m": (768, 12, 12, 4, 2048),
    "1b": (2048, 16, 32, 8, 5632),
}

SPECIAL_TOKENS = ["<|endoftext|>"]


@dataclass(frozen=True)
class PublishedShape:
    """A real model's configuration: ``model_type`` (a transformers architecture) and its fields."""

    name: str
    model_type: str  # "qwen2" | "starcoder2" | "llama"
    config: dict = field(hash=False)
    source: str = ""  # the config.json it was read from

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])


# Each the published config.json, field for field (the fields that change a forward's cost or
# numerics; ids such as bos/eos come from the tokenizer that drives the model). The Qwen2.5-Coder
# sizes share these and differ in the rest.
QWEN2_CODER = dict(
    hidden_act="silu",
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    use_sliding_window=False,
    sliding_window=None,
    initializer_range=0.02,
)
PUBLISHED: dict[str, PublishedShape] = {
    shape.name: shape
    for shape in (
        PublishedShape(
            "qwen2.5-coder-0.5b",
            "qwen2",
            dict(
                **QWEN2_CODER,
                vocab_size=151936,
                hidden_size=896,
                intermediate_size=4864,
                num_hidden_layers=24,
                num_attention_heads=14,
                num_key_value_heads=2,
                tie_word_embeddings=True,
                max_window_layers=24,
            ),  # q/k/v bias: Qwen2 always
            "Qwen/Qwen2.5-Coder-0.5B config.json",
        ),
        PublishedShape(
            "qwen2.5-coder-1.5b",
            "qwen2",
            dict(
                **QWEN2_CODER,
                vocab_size=151936,
                hidden_size=1536,
                intermediate_size=8960,
                num_hidden_layers=28,
                num_attention_heads=12,
                num_key_value_heads=2,
                tie_word_embeddings=True,
                max_window_layers=21,
            ),
            "Qwen/Qwen2.5-Coder-1.5B config.json",
        ),
        PublishedShape(
            "qwen2.5-coder-7b",
            "qwen2",
            dict(
                **QWEN2_CODER,
                vocab_size=152064,
                hidden_size=3584,
                intermediate_size=18944,
                num_hidden_layers=28,
                num_attention_heads=28,
                num_key_value_heads=4,
                tie_word_embeddings=False,
                max_window_layers=28,
            ),
            "Qwen/Qwen2.5-Coder-7B config.json",
        ),
        PublishedShape(
            "starcoder2-3b",
            "starcoder2",
            dict(
                vocab_size=49152,
                hidden_size=3072,
                intermediate_size=12288,
                num_hidden_layers=30,
                num_attention_heads=24,
                num_key_value_heads=2,
                hidden_act="gelu_pytorch_tanh",
                max_position_embeddings=16384,
                norm_epsilon=1e-5,
                rope_theta=999999.4420358813,
                sliding_window=4096,
                use_bias=True,
                tie_word_embeddings=True,
                initializer_range=0.018042,
            ),  # tying: the config's default
            "bigcode/starcoder2-3b config.json",
        ),
        PublishedShape(
            "deepseek-coder-1.3b",
            "llama",
            dict(
                vocab_size=32256,
                hidden_size=2048,
                intermediate_size=5504,
                num_hidden_layers=24,
                num_attention_heads=16,
                num_key_value_heads=16,
                hidden_act="silu",
                max_position_embeddings=16384,
                rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 100000.0},
                tie_word_embeddings=False,
                attention_bias=False,
                mlp_bias=False,
                initializer_range=0.02,
            ),
            "deepseek-ai/deepseek-coder-1.3b-base config.json",
        ),
    )
}

SHAPE_NAMES = (*SHAPES, *PUBLISHED)


def config_of(
    shape: str, eos_token_id: int | None = None, max_context: int | None = None, vocab_size: int | None = None
):
    """The transformers config of a published shape (``max_context`` caps the position table only;
    ``vocab_size`` replaces the published vocabulary, e.g. by a small tokenizer's)."""
    from transformers import LlamaConfig, Qwen2Config, Starcoder2Config

    spec = PUBLISHED[shape]
    classes = {"qwen2": Qwen2Config, "starcoder2": Starcoder2Config, "llama": LlamaConfig}
    fields = dict(spec.config)
    if max_context is not None:
        fields["max_position_embeddings"] = min(max_context, fields["max_position_embeddings"])
    if vocab_size is not None:
        fields["vocab_size"] = vocab_size
    return classes[spec.model_type](**fields, bos_token_id=None, eos_token_id=eos_token_id, pad_token_id=None)


def random_published(
    shape: str,
    seed: int = 0,
    eos_token_id: int | None = None,
    device=None,
    dtype=None,
    max_context: int | None = None,
    vocab_size: int | None = None,
):
    """A model of a published shape with seeded random weights, built on ``device`` in ``dtype``."""
    import torch
    from transformers import AutoModelForCausalLM

    config = config_of(shape, eos_token_id, max_context, vocab_size)
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    if dtype is not None and dtype.is_floating_point:
        torch.set_default_dtype(dtype)  # initialise in the run's dtype: no fp32 copy of a 7b on the way
    try:
        with torch.device(device or "cpu"):
            model = AutoModelForCausalLM.from_config(config)
    finally:
        torch.set_default_dtype(previous)
    model = model.eval()
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = None
    return model


def byte_level_bpe(texts: Iterable[str], vocab_size: int, specials: Iterable[str]):
    """A byte-level BPE (every string round-trips) trained on ``texts``: a ``tokenizers.Tokenizer``
    whose first ids are ``specials``. The default model's tokenizer is trained with it too."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(texts), trainer)
    return tokenizer


def build_tokenizer(corpus: Iterable[str], vocab_size: int = 512, extra_special: Iterable[str] = ()):
    """A small test tokenizer trained on ``corpus``, as a transformers fast tokenizer."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = byte_level_bpe(corpus, vocab_size, [*SPECIAL_TOKENS, *extra_special])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=SPECIAL_TOKENS[0])


def random_llama(
    shape: str | tuple = "tiny",
    vocab_size: int = 512,
    seed: int = 0,
    init_std: float = 0.02,
    max_context: int = 2048,
    eos_token_id: int | None = None,
):
    """A LlamaForCausalLM with seeded random weights. A large ``init_std`` separates logits, so
    argmax ties (where batched and single-token forwards may round differently) become rare."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, heads, kv_heads, intermediate = SHAPES[shape] if isinstance(shape, str) else shape
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        max_position_embeddings=max_context,
        initializer_range=init_std,
        bos_token_id=None,
        eos_token_id=eos_token_id,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = None
    return model


def save_random_model(
    directory: str | Path,
    corpus: Iterable[str],
    shape: str | tuple = "tiny",
    vocab_size: int = 512,
    seed: int = 0,
    init_std: float = 0.02,
    max_context: int = 2048,
    eos: bool = False,
) -> Path:
    """Write a random Llama + a tokenizer trained on ``corpus`` as a loadable model directory."""
    directory = Path(directory)
    tokenizer = build_tokenizer(corpus, vocab_size)
    eos_id = tokenizer.eos_token_id if eos else None
    model = random_llama(shape, len(tokenizer), seed, init_std, max_context, eos_id)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def save_shape(shape: str, directory: str | Path, dtype: str = "float32", seed: int = 0) -> Path:
    """A loadable model directory of a named shape with the shipped tokenizer (for tools that take a
    model path, e.g. ``bench.inline`` through the language server)."""
    import torch
    from transformers import AutoTokenizer

    from codespec.core.default_model import target_path

    directory = Path(directory)
    tokenizer = AutoTokenizer.from_pretrained(target_path(), local_files_only=True)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    if shape in PUBLISHED:
        model = random_published(shape, seed, tokenizer.eos_token_id, dtype=torch_dtype)
    else:
        model = random_llama(shape, len(tokenizer), seed, eos_token_id=tokenizer.eos_token_id).to(torch_dtype)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def main(argv: list[str] | None = None) -> int:
    """python -m bench.shapes save SHAPE DIR [--dtype float32|bfloat16]"""
    import argparse

    parser = argparse.ArgumentParser(description="write a random-weight model of a named shape to a directory")
    commands = parser.add_subparsers(dest="command", required=True)
    save = commands.add_parser("save")
    save.add_argument("shape", choices=SHAPE_NAMES)
    save.add_argument("directory", type=Path)
    save.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    save.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(save_shape(args.shape, args.directory, args.dtype, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
