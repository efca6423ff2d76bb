"""Random-weight Llama models of named sizes, and small byte-level BPE tokenizers.

Random weights are the right tool for engine tests (tiny shapes) and for replay-mode timing
(realistic shapes): compute cost depends on the shape, not on what the weights learned.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

# hidden, layers, heads, kv heads, intermediate
SHAPES: dict[str, tuple[int, int, int, int, int]] = {
    "tiny": (64, 2, 4, 2, 128),
    "30m": (512, 8, 8, 4, 1408),
    "100m": (768, 12, 12, 4, 2048),
    "1b": (2048, 16, 32, 8, 5632),
}

SPECIAL_TOKENS = ["<|endoftext|>"]


def byte_level_bpe(texts: Iterable[str], vocab_size: int, specials: Iterable[str]):
    """A byte-level BPE (every string round-trips) trained on ``texts``: a ``tokenizers.Tokenizer``
    whose first ids are ``specials``. The default model's tokenizer is trained with it too."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train_from_iterator(list(texts), trainer)
    return tokenizer


def build_tokenizer(corpus: Iterable[str], vocab_size: int = 512, extra_special: Iterable[str] = ()):
    """A small test tokenizer trained on ``corpus``, as a transformers fast tokenizer."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = byte_level_bpe(corpus, vocab_size, [*SPECIAL_TOKENS, *extra_special])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=SPECIAL_TOKENS[0])


def random_llama(shape: str | tuple = "tiny", vocab_size: int = 512, seed: int = 0,
                 init_std: float = 0.02, max_context: int = 2048, eos_token_id: int | None = None):
    """A LlamaForCausalLM with seeded random weights. A large ``init_std`` separates logits, so
    argmax ties (where batched and single-token forwards may round differently) become rare."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, heads, kv_heads, intermediate = SHAPES[shape] if isinstance(shape, str) else shape
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=intermediate,
        max_position_embeddings=max_context, initializer_range=init_std,
        bos_token_id=None, eos_token_id=eos_token_id, pad_token_id=None, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = None
    return model


def save_random_model(directory: str | Path, corpus: Iterable[str], shape: str | tuple = "tiny",
                      vocab_size: int = 512, seed: int = 0, init_std: float = 0.02,
                      max_context: int = 2048, eos: bool = False) -> Path:
    """Write a random Llama + a tokenizer trained on ``corpus`` as a loadable model directory."""
    directory = Path(directory)
    tokenizer = build_tokenizer(corpus, vocab_size)
    eos_id = tokenizer.eos_token_id if eos else None
    model = random_llama(shape, len(tokenizer), seed, init_std, max_context, eos_id)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
