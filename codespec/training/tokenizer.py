"""The default tokenizer: byte-level BPE (every string round-trips) with the prompt formats' specials."""

from __future__ import annotations

from typing import Iterable

from codespec.prompts import END_OF_TEXT, SPECIAL_TOKENS


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096):
    """A transformers fast tokenizer; ``<|endoftext|>`` is id 0 and the EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train_from_iterator(list(texts), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=END_OF_TEXT,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t != END_OF_TEXT],
        model_max_length=1024, clean_up_tokenization_spaces=False,
    )
    return fast
