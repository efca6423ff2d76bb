"""The default tokenizer: byte-level BPE (every string round-trips) with the prompt formats' specials."""

from __future__ import annotations

from collections.abc import Iterable

from bench.shapes import byte_level_bpe
from codespec.core.prompts import END_OF_TEXT, SPECIAL_TOKENS


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096):
    """A transformers fast tokenizer; ``<|endoftext|>`` is id 0 and the EOS."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = byte_level_bpe(texts, vocab_size, SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=END_OF_TEXT,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t != END_OF_TEXT],
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )
    return fast
