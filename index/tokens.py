"""Tokenizer adapter: the target's tokenizer seen as ``text -> token ids (+ character starts)``.

The index stores documents in the target's own tokens, so a lookup continuation is directly a
draft. Two facts about byte-level BPE make bulk indexing and incremental edits cheap, and both are
checked here rather than assumed:

- every token decodes to a fixed byte string, so token start offsets are a cumulative sum over a
  per-vocabulary byte-length table (no per-token offset objects from the tokenizer);
- ids fit in ``uint16`` for vocabularies under 65,535, halving the memory of every token array.

Anything with ``encode`` and offsets works; without a byte-length table, starts come from the
tokenizer's offsets (slower, same result).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from index.pretokens import PretokenCache, supports_pretoken_cache

_PROBE_TEXT = "def f(x):\n    return x + 1  # é ü 中文 \U0001f600\n\n\tclass A: pass\r\n"


@lru_cache(maxsize=1)
def unicode_to_byte() -> dict[str, int]:
    """GPT-2's bytes_to_unicode table inverted (printable stand-in char -> byte value), the map
    every byte-level BPE vocabulary is written in. ``proposers.token_bytes`` uses it too."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class TokenizerAdapter:
    """Wraps a transformers fast tokenizer (or a ``tokenizers.Tokenizer``).

    ``dtype``/``sep``: token arrays use the narrowest integer type; ``sep`` is a value no real
    token takes, used to separate documents in concatenated arrays.
    """

    def __init__(self, tokenizer) -> None:
        if isinstance(tokenizer, TokenizerAdapter):
            tokenizer = tokenizer.tokenizer
        self.tokenizer: Any = tokenizer
        self._backend: Any = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
        if self._backend is None and hasattr(tokenizer, "encode_batch"):
            self._backend = tokenizer  # a raw tokenizers.Tokenizer
        if self._backend is not None:
            self.vocab_size = self._backend.get_vocab_size(with_added_tokens=True)
        else:
            self.vocab_size = len(tokenizer)
        self.dtype = np.dtype(np.uint16) if self.vocab_size < 65535 else np.dtype(np.int32)
        self.sep = int(np.iinfo(self.dtype).max)  # sorts after every real token
        self.byte_lengths = self._byte_length_table()
        self.fingerprint = self._fingerprint()
        self.pretokens = self._pretoken_cache()

    # -- encoding -------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        if self._backend is not None:
            encoding = self._backend.encode(text, add_special_tokens=False)
            return encoding.ids, [tuple(o) for o in encoding.offsets]
        out = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(out["input_ids"]), [tuple(o) for o in out["offset_mapping"]]

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=self.dtype)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Many documents at once: through the pre-token cache where it applies
        (:mod:`index.pretokens`), else the Rust backend (parallel over documents)."""
        if self.pretokens is not None and texts:
            return self.pretokens.encode_batch(texts, self._backend_batch)
        return self._backend_batch(texts)

    def _backend_ids(self, texts: list[str]) -> list[list[int]]:
        encode = getattr(self._backend, "encode_batch_fast", None) or self._backend.encode_batch
        return [e.ids for e in encode(texts, add_special_tokens=False)]

    def _backend_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        if self._backend is not None and texts:
            return [np.asarray(ids, dtype=self.dtype) for ids in self._backend_ids(list(texts))]
        return [self.encode_array(t) for t in texts]

    def char_starts(self, text: str, token_ids: np.ndarray) -> np.ndarray:
        """Character offset where each token starts (int64, one per token), for ``token_ids``
        = the encoding of ``text``. A token that starts inside a multi-byte character gets the
        start of that character."""
        if self.byte_lengths is not None:
            lengths = self.byte_lengths[token_ids.astype(np.int64)]
            byte_starts = np.zeros(len(token_ids), dtype=np.int64)
            np.cumsum(lengths[:-1], out=byte_starts[1:])
            if text.isascii():
                if len(token_ids) == 0 or byte_starts[-1] + lengths[-1] == len(text):
                    return byte_starts
            else:
                raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
                if len(token_ids) == 0 or byte_starts[-1] + lengths[-1] == len(raw):
                    char_of_byte = np.cumsum((raw & 0xC0) != 0x80) - 1
                    return char_of_byte[byte_starts] if len(raw) else byte_starts
        ids, offsets = self.encode_with_offsets(text)
        if len(ids) != len(token_ids):
            raise ValueError("token ids do not belong to this text")
        return np.asarray([o[0] for o in offsets], dtype=np.int64)

    # -- setup checks ---------------------------------------------------------------------------
    def _pretoken_cache(self) -> PretokenCache | None:
        if self._backend is None or not supports_pretoken_cache(self._backend):
            return None
        decoder = self._backend.get_added_tokens_decoder() if hasattr(self._backend, "get_added_tokens_decoder") else {}
        added = [t.content for t in decoder.values()]
        # The separator must not swallow the whitespace beside it (an lstrip / rstrip token would).
        special = [(t.content, i) for i, t in decoder.items()
                   if t.special and t.content and not t.lstrip and not t.rstrip]
        cache = PretokenCache(self._backend_ids, added, self.dtype, special[0] if special else None)
        return cache if cache.verify() else None

    def _byte_length_table(self) -> np.ndarray | None:
        """Per-id UTF-8 byte length, if this is a byte-level BPE (verified on a probe text)."""
        if self._backend is None:
            return None
        decoder = unicode_to_byte()
        table = np.zeros(self.vocab_size, dtype=np.int64)
        vocab = self._backend.get_vocab(with_added_tokens=True)
        added = {t.content for t in self._backend.get_added_tokens_decoder().values()} \
            if hasattr(self._backend, "get_added_tokens_decoder") else set()
        for piece, token_id in vocab.items():
            if token_id >= self.vocab_size:
                continue
            if piece in added:
                table[token_id] = len(piece.encode("utf-8"))
            elif all(ch in decoder for ch in piece):
                table[token_id] = len(piece)
            else:
                return None
        ids, offsets = self.encode_with_offsets(_PROBE_TEXT)
        raw = _PROBE_TEXT.encode("utf-8")
        if int(table[ids].sum()) != len(raw):
            return None
        return table

    def _fingerprint(self) -> str:
        """Identifies the tokenization, so persisted tokens are reused only with the same one."""
        digest = hashlib.blake2b(digest_size=16)
        if self._backend is not None and hasattr(self._backend, "to_str"):
            digest.update(self._backend.to_str().encode("utf-8"))
        else:
            digest.update(json.dumps(self.encode(_PROBE_TEXT)).encode())
            digest.update(str(self.vocab_size).encode())
        return digest.hexdigest()
