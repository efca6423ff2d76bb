"""Tokenizer adapter: the target's tokenizer seen as ``text -> token ids (+ character starts)``.

The index stores documents in the target's own tokens, so a lookup continuation is directly a
draft. Two facts about byte-level BPE make bulk indexing and incremental edits cheap, and both are
checked here rather than assumed:

- every token decodes to a fixed byte string, so token start offsets are a cumulative sum over a
  per-vocabulary byte-length table (no per-token offset objects from the tokenizer);
- ids fit in ``uint16`` for vocabularies under 65,535, halving the memory of every token array.

Anything with ``encode`` and offsets works; without a byte-length table, starts come from the
tokenizer's offsets (slower, same result).

Bulk encoding takes one of two paths, and the adapter says which: ``encoding`` is
``"pretoken-cache"`` (:mod:`index.pretokens`, for a GPT-2-style byte-level BPE that also agrees with
itself on probe texts) or ``"tokenizer"`` (the tokenizer's own batch encode), ``encoding_reason``
why, and the choice is logged once per tokenizer on the ``codespec.index`` logger. A Qwen2 /
Qwen2.5 tokenizer takes the tokenizer path: its ``Split`` regex is not GPT-2's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from codespec.index.pretokens import PretokenCache, pretoken_cache_mismatch

log = logging.getLogger("codespec.index")

PRETOKEN_CACHE = "pretoken-cache"  # TokenizerAdapter.encoding values
TOKENIZER = "tokenizer"
_REPORTED: set[str] = set()  # fingerprints whose encoding path was logged

_PROBE_TEXT = "def f(x):\n    return x + 1  # é ü 中文 \U0001f600\n\n\tclass A: pass\r\n"


@lru_cache(maxsize=1)
def unicode_to_byte() -> dict[str, int]:
    """GPT-2's bytes_to_unicode table inverted (printable stand-in char -> byte value), the map
    every byte-level BPE vocabulary is written in. ``proposers.token_bytes`` uses it too."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


# Unicode White_Space (what the tokenizers' regexes mean by \s; Python's \s adds \x1c-\x1f).
_WS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_WS_INLINE = _WS.replace("\n", "").replace("\r", "")  # White_Space but the two line breaks
# Forced pre-token splits (a match's end is a split of the full text's pre-tokenization, and the
# pre-tokenizer restarts there as if the text began there), per pre-tokenizer kind:
SPLIT_ANCHORS = {
    # GPT-2's regex: every pattern that matches a non-space character ends before a space.
    "gpt2": re.compile(f"[^{_WS}](?=[{_WS}])"),
    # Qwen2's and Llama 3's regex: the same, except that a punctuation run takes the line breaks
    # after it (`` ?[^\s\p{L}\p{N}]+[\r\n]*``): forced after a letter or digit ([^\W_] is \p{L} and
    # \p{N}), or before a space that is not a line break.
    "letters-digits": re.compile(f"[^\\W_](?=[{_WS}])|[^{_WS}](?=[{_WS_INLINE}])"),
    # A first Split that isolates every line break (DeepSeek-Coder): a split after each one.
    "line-breaks": re.compile("[\r\n]"),
    # Anything else: GPT-2's rule with Python's \s, checked by splice's safety net (index.retokenize).
    "heuristic": re.compile(r"\S(?=\s)"),
}
_LETTER_REGEXES = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+",  # Qwen2
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+",  # Llama 3
}


def split_rule(config: dict | None) -> tuple[str, re.Pattern]:
    """Which ``SPLIT_ANCHORS`` entry holds for a tokenizer configuration (tokenizer.json)."""
    if config is None:
        return "heuristic", SPLIT_ANCHORS["heuristic"]
    normalizer = config.get("normalizer")
    if (
        normalizer is not None
        and normalizer.get("type") not in ("NFC",)
        and not (normalizer.get("type") == "Sequence" and not normalizer.get("normalizers"))
    ):
        return "heuristic", SPLIT_ANCHORS["heuristic"]  # NFC composes only onto non-spaces: harmless
    pre = config.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = [step.get("type") for step in steps]
    if (
        kinds
        and kinds[-1] == "ByteLevel"
        and steps[-1].get("use_regex", True)
        and not steps[-1].get("add_prefix_space", False)
        and set(kinds[:-1]) <= {"Digits"}
    ):
        return "gpt2", SPLIT_ANCHORS["gpt2"]  # Digits before it only splits more
    if (
        kinds == ["Split", "ByteLevel"]
        and not steps[1].get("use_regex", True)
        and not steps[1].get("add_prefix_space", False)
        and steps[0].get("behavior") == "Isolated"
        and not steps[0].get("invert")
        and (steps[0].get("pattern") or {}).get("Regex") in _LETTER_REGEXES
    ):
        return "letters-digits", SPLIT_ANCHORS["letters-digits"]
    first = steps[0] if steps else {}
    if (
        first.get("type") == "Split"
        and (first.get("pattern") or {}).get("Regex") in ("[\r\n]", r"[\r\n]")
        and first.get("behavior") == "Isolated"
        and not first.get("invert")
        and not any(step.get("type") == "ByteLevel" and step.get("add_prefix_space") for step in steps)
    ):
        return "line-breaks", SPLIT_ANCHORS["line-breaks"]
    return "heuristic", SPLIT_ANCHORS["heuristic"]


def _backend_config_text(backend) -> str | None:
    try:
        return backend.to_str() if backend is not None and hasattr(backend, "to_str") else None
    except Exception:  # not serialisable
        return None


class TokenizerAdapter:
    """Wraps a transformers fast tokenizer (or a ``tokenizers.Tokenizer``).

    ``dtype``/``sep``: token arrays use the narrowest integer type that holds every id: ``uint16``
    below 65,535 ids, else ``int32`` (a Qwen2.5 vocabulary of 151,936 ids); ``sep`` is a value no
    real token takes (the type's maximum), used to separate documents in concatenated arrays.
    ``encoding`` / ``encoding_reason``: the bulk-encoding path and why (module docstring).
    ``split_rule`` / ``split_anchor``: where this tokenizer's pre-tokenizer is sure to split, for
    incremental re-tokenization (:func:`split_rule`).
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
        self._config_text = _backend_config_text(self._backend)  # tokenizer.json, serialised once
        self.fingerprint = self._fingerprint()
        config = json.loads(self._config_text) if self._config_text is not None else None
        self.encoding, self.encoding_reason = TOKENIZER, "no tokenizers backend"
        self.pretokens = self._pretoken_cache(config)
        self.split_rule, self.split_anchor = split_rule(config)
        if self.fingerprint not in _REPORTED:
            _REPORTED.add(self.fingerprint)
            log.info(
                "index: bulk encoding through %s (%s); %s token arrays",
                "the pre-token cache" if self.encoding == PRETOKEN_CACHE else "the tokenizer's batch encode",
                self.encoding_reason,
                self.dtype.name,
            )

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
    def _pretoken_cache(self, config: dict | None) -> PretokenCache | None:
        """The cache when its configuration check and its probe check both pass; sets ``encoding``."""
        if self._backend is None:
            return None
        mismatch = pretoken_cache_mismatch(config if config is not None else self._backend)
        if mismatch is not None:
            self.encoding_reason = f"pre-token cache not used: {mismatch}"
            return None
        decoder = self._backend.get_added_tokens_decoder() if hasattr(self._backend, "get_added_tokens_decoder") else {}
        added = [t.content for t in decoder.values()]
        # The separator must not swallow the whitespace beside it (an lstrip / rstrip token would).
        special = [
            (t.content, i) for i, t in decoder.items() if t.special and t.content and not t.lstrip and not t.rstrip
        ]
        cache = PretokenCache(self._backend_ids, added, self.dtype, special[0] if special else None)
        if not cache.verify():
            self.encoding_reason = (
                "pre-token cache not used: configured like GPT-2's byte-level BPE, but "
                "it disagrees with the tokenizer's own encode on probe texts"
            )
            return None
        self.encoding, self.encoding_reason = PRETOKEN_CACHE, "GPT-2-style byte-level BPE, verified on probe texts"
        return cache

    def _byte_length_table(self) -> np.ndarray | None:
        """Per-id UTF-8 byte length, if this is a byte-level BPE (verified on a probe text)."""
        if self._backend is None:
            return None
        table = np.zeros(self.vocab_size, dtype=np.int64)
        vocab = self._backend.get_vocab(with_added_tokens=True)
        added = (
            {t.content for t in self._backend.get_added_tokens_decoder().values()}
            if hasattr(self._backend, "get_added_tokens_decoder")
            else set()
        )
        pieces = [(piece, token_id) for piece, token_id in vocab.items() if token_id < self.vocab_size]
        plain = [(piece, token_id) for piece, token_id in pieces if piece not in added]
        # One set operation over every piece instead of a check per character (151,936 pieces).
        if not set("".join(piece for piece, _ in plain)) <= unicode_to_byte().keys():
            return None
        if plain:
            table[np.fromiter((i for _, i in plain), np.int64, len(plain))] = np.fromiter(
                (len(piece) for piece, _ in plain), np.int64, len(plain)
            )
        for piece, token_id in pieces:
            if piece in added:
                table[token_id] = len(piece.encode("utf-8"))
        ids, offsets = self.encode_with_offsets(_PROBE_TEXT)
        raw = _PROBE_TEXT.encode("utf-8")
        if int(table[ids].sum()) != len(raw):
            return None
        return table

    def _fingerprint(self) -> str:
        """Identifies the tokenization, so persisted tokens are reused only with the same one."""
        digest = hashlib.blake2b(digest_size=16)
        if self._config_text is not None:
            digest.update(self._config_text.encode("utf-8"))
        else:
            digest.update(json.dumps(self.encode(_PROBE_TEXT)).encode())
            digest.update(str(self.vocab_size).encode())
        return digest.hexdigest()
