"""What a prompt costs, known before paying for it: a lower bound on its tokens from its length alone,
and a count in bounded slices that stops once the context is passed.

A token of a given tokenizer covers at most as many characters as its longest vocabulary entry
spells (a byte-level BPE spells one character per byte, and a character is at least a byte; a
SentencePiece entry spells its characters; an added token its content). So a text of ``n``
characters is at least ``n / longest`` tokens, whatever it holds: a prompt over ``max_context *
longest`` characters is refused without tokenizing it (the shipped model: 41 characters a token,
1,024 positions, so 41,984 characters; qwen2.5-coder: 45 and 32,768). A normalizer may merge a
few characters into one (NFC composes a decomposed Hangul syllable from three), so a tokenizer
with one gets ``NORMALIZER_FACTOR`` times the room for text that is not ASCII.

Between that bound and the context, :func:`count_exceeds` tokenizes a long text a slice at a time
and stops once the count has passed the context, so an over-long prompt costs the tokenizing of
about a context's worth of text, not of all of it (nor the tokenizer's buffers for all of it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

NORMALIZER_FACTOR = 3  # characters one normalized character may stand for (NFC: a Hangul L+V+T)
SLICE_CHARS = 16_384  # characters tokenized at a time when counting an over-long text (~10 ms)
SLICE_MARGIN = 8  # tokens a cut between slices may add to the count (cuts are at line starts)


@dataclass(frozen=True)
class TokenBound:
    """The most characters one token of a tokenizer covers: a lower bound on a text's tokens."""

    chars_per_token: int
    normalizes: bool = False  # the tokenizer normalizes its input (see NORMALIZER_FACTOR)

    @classmethod
    def of(cls, tokenizer: Any) -> TokenBound | None:
        """The bound for a transformers tokenizer (None: it has no vocabulary to read)."""
        get_vocab = getattr(tokenizer, "get_vocab", None)
        if get_vocab is None:
            return None
        try:
            spellings = list(get_vocab())
        except Exception:  # a tokenizer without a readable vocabulary: no bound, every prompt is tokenized
            return None
        spellings += [
            str(getattr(token, "content", token)) for token in getattr(tokenizer, "added_tokens_decoder", {}).values()
        ]
        if not spellings:
            return None
        backend = getattr(tokenizer, "backend_tokenizer", None)
        normalizes = backend is None or getattr(backend, "normalizer", None) is not None
        return cls(max(1, max(len(spelling) for spelling in spellings)), normalizes)

    def per_token(self, text: str) -> int:
        """Characters one token of ``text`` may cover (``str.isascii`` is O(1) in CPython)."""
        return self.chars_per_token * (NORMALIZER_FACTOR if self.normalizes and not text.isascii() else 1)

    def at_least(self, text: str) -> int:
        """Tokens ``text`` has at least."""
        return -(-len(text) // self.per_token(text))


def slices(text: str, size: int = SLICE_CHARS) -> list[tuple[int, int]]:
    """(start, end) cuts of ``text`` about ``size`` characters long, each cut at a line start that
    begins with a non-space (a pre-tokenizer splits there too, so the slices' counts add up to
    the whole's, nearly always exactly); where none is near, at ``size``."""
    cuts, start = [], 0
    while len(text) - start > size:
        end = start + size
        newline = text.rfind("\n", start + size // 2, end)
        while newline >= 0 and newline + 1 < len(text) and text[newline + 1].isspace():
            newline = text.rfind("\n", start + size // 2, newline)
        if newline >= 0:
            end = newline + 1
        cuts.append((start, end))
        start = end
    cuts.append((start, len(text)))
    return cuts


def count_exceeds(encode: Callable[[str], list[int]], text: str, limit: int) -> int | None:
    """Tokenize ``text`` a slice at a time until the count has passed ``limit`` (with the cuts'
    margin): the count so far, a lower bound of the whole's; None: the text did not pass it."""
    counted = 0
    for number, (start, end) in enumerate(slices(text)):
        counted += len(encode(text[start:end]))
        if counted > limit + SLICE_MARGIN * number:
            return counted - SLICE_MARGIN * number
    return None
