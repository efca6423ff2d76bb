"""Token ids <-> UTF-8 bytes, fast enough to call on every drafting step.

Lookup proposers that align an output with a text (the copy pointer, the simulator) need the
exact bytes each token stands for: byte-level BPE tokens concatenate to the UTF-8 text, so a
token's position in a text is a byte offset and a token that ends inside a character still has
one. ``tokenizer.decode`` costs ~10 µs per token; a table built once costs a dict lookup.

Byte-level BPE (GPT-2, Llama 3, Qwen, codespec's own tokenizers) is mapped exactly through the
GPT-2 byte<->unicode table; other tokenizers (SentencePiece) fall back to per-token decoding,
with ``▁`` read as a space.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from codespec.index.tokens import unicode_to_byte

log = logging.getLogger(__name__)


def hf_tokenizer_of(tokenizer: Any) -> Any:
    """The transformers tokenizer behind a tokenizer, an adapter, a bound ``encode`` or a model."""
    seen = 0
    while not hasattr(tokenizer, "convert_ids_to_tokens") and seen < 4:
        inner = (
            getattr(tokenizer, "__self__", None)
            or getattr(tokenizer, "tokenizer", None)
            or getattr(tokenizer, "_tokenizer", None)
        )
        if inner is None:
            break
        tokenizer, seen = inner, seen + 1
    if not hasattr(tokenizer, "convert_ids_to_tokens"):
        raise TypeError(
            f"need a transformers tokenizer (or an object wrapping one, e.g. index.tokens.TokenizerAdapter "
            f"or tokenizer.encode), got {type(tokenizer).__name__}"
        )
    return tokenizer


@dataclass
class Vocabulary:
    """What a tokenizer's ids spell, worked out once per tokenizer and shared: a copy pointer is
    built for every request (inside vLLM, for every sequence), and it would otherwise convert the
    same tokens to bytes again and read the tokenizer's special ids, a property transformers
    computes on each read, in that request's first step."""

    backend: Any  # the fast tokenizer's Rust backend, or None
    byte_level: bool  # byte-level BPE: tokens concatenate to the UTF-8 text
    special: frozenset[int]
    table: dict[int, bytes] = field(default_factory=dict)  # token -> its bytes, filled as tokens are met
    byte_ids: dict[int, int | None] = field(default_factory=dict)  # byte value -> the token spelling it


_VOCABULARIES: weakref.WeakKeyDictionary[Any, Vocabulary] = weakref.WeakKeyDictionary()


def vocabulary(tokenizer: Any) -> Vocabulary:
    """The shared ``Vocabulary`` of a transformers tokenizer (one of its own where the tokenizer
    cannot be weakly referenced)."""
    try:
        found = _VOCABULARIES.get(tokenizer)
    except TypeError:
        found = None
    if found is not None:
        return found
    backend = getattr(tokenizer, "backend_tokenizer", None)
    found = Vocabulary(
        backend,
        type(getattr(backend, "decoder", None)).__name__ == "ByteLevel",
        frozenset(getattr(tokenizer, "all_special_ids", ())),
    )
    try:
        _VOCABULARIES[tokenizer] = found
    except TypeError:  # not weakly referenceable: its own
        pass
    return found


class TokenBytes:
    """Encode text to ids and map ids back to bytes, for one tokenizer."""

    def __init__(self, tokenizer: Any, encode: Callable[[str], list[int]] | None = None) -> None:
        """``encode`` overrides how text becomes ids (e.g. a client's own token ids for a prediction)."""
        self.tokenizer = hf_tokenizer_of(tokenizer)
        self._encode = encode
        known = vocabulary(self.tokenizer)
        self._backend = known.backend
        self._byte_level = known.byte_level
        self._table = known.table
        self._byte_ids = known.byte_ids
        self._special = known.special

    def encode(self, text: str) -> list[int]:
        if self._encode is not None:
            return list(self._encode(text))
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    def token(self, token_id: int) -> bytes:
        """The bytes one token contributes to the text (b"" for special tokens)."""
        found = self._table.get(token_id)
        if found is None:
            found = self._table[token_id] = self._compute(token_id)
        return found

    def byte_id(self, value: int) -> int | None:
        """The token that spells the single byte ``value``, or None when the vocabulary has none."""
        found = self._byte_ids.get(value, -1)
        if found == -1:
            if self._byte_level:
                piece = next(char for char, byte in unicode_to_byte().items() if byte == value)
            else:  # SentencePiece byte fallback
                piece = f"<0x{value:02X}>"
            candidate = self.tokenizer.convert_tokens_to_ids(piece)
            found = candidate if isinstance(candidate, int) and self.token(candidate) == bytes([value]) else None
            self._byte_ids[value] = found
        return found

    def pieces(self, token_ids: Sequence[int]) -> list[bytes]:
        """Each token's bytes (``token`` for many at once: the table read in C, computed where missing)."""
        table = self._table
        try:
            return list(map(table.__getitem__, token_ids))
        except KeyError:
            return [table[t] if t in table else self.token(t) for t in token_ids]

    def fill(self) -> None:
        """Every token's bytes into the shared table now: a server pays for them once at its start
        rather than in its requests' first steps."""
        try:
            size = len(self.tokenizer)
            if len(self._table) < size:
                self.pieces(range(size))
        except Exception:  # an id the tokenizer cannot convert: the rest are found as they are met
            log.warning("codespec: the token table could not be filled ahead; tokens are read as met", exc_info=True)

    def ids_containing(self, fragment: bytes) -> frozenset[int] | None:
        """Every token whose bytes contain ``fragment``; None where the table is not filled (``fill``),
        so which tokens do is not known."""
        try:
            if len(self._table) < len(self.tokenizer):
                return None
        except Exception:
            return None
        return frozenset(token for token, piece in self._table.items() if fragment in piece)

    def join(self, token_ids: Sequence[int]) -> bytes:
        return b"".join(self.pieces(token_ids))

    def spelled_in(self, token_ids: Sequence[int], text: str) -> list[int] | None:
        """``text`` as ids, read from where it last lies in ``token_ids``: the tokens wholly inside
        it as they are there, the bytes of a token it starts or ends within encoded on their own.
        Inside vLLM a prompt's code is already tokenized in the prompt, and encoding it again was
        most of a request's first step. None where the tokens do not spell it plainly (a tokenizer
        that is not byte-level, text not there or across a special token or a split character)."""
        wanted = text.encode("utf-8")
        if not self._byte_level or not wanted:
            return None
        pieces = self.pieces(token_ids)
        spelled = b"".join(pieces)
        at = spelled.rfind(wanted)
        if at < 0:
            return None
        end = at + len(wanted)
        starts = list(itertools.accumulate(map(len, pieces), initial=0))  # [n + 1]: token k is starts[k]..starts[k + 1]
        first = bisect.bisect_left(starts, at)  # the first token starting at or after the text
        last = bisect.bisect_right(starts, end) - 1  # tokens first..last-1 end within it
        while first < last and starts[first] == at == starts[first + 1]:  # special tokens (no bytes) at its edges
            first += 1
        while last > first and starts[last - 1] == end == starts[last]:
            last -= 1
        if first >= last:  # inside one or two tokens: nothing to keep
            return self.encode(text)
        inside = list(token_ids[first:last])
        if not self._special.isdisjoint(inside):
            return None
        try:
            head, tail = spelled[at : starts[first]].decode("utf-8"), spelled[starts[last] : end].decode("utf-8")
        except UnicodeDecodeError:  # a token boundary inside a character
            return None
        return (self.encode(head) if head else []) + inside + (self.encode(tail) if tail else [])

    def _compute(self, token_id: int) -> bytes:
        if token_id in self._special:
            return b""
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if piece is None:
            return b""
        if self._byte_level:
            mapping = unicode_to_byte()
            if all(char in mapping for char in piece):
                return bytes(mapping[char] for char in piece)
            return piece.encode("utf-8")  # an added (non-special) token is stored as plain text
        if piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:  # SentencePiece byte fallback
            return bytes([int(piece[3:5], 16)])
        return piece.replace("▁", " ").encode("utf-8")
