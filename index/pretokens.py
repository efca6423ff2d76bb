"""Bulk encoding through a cache of pre-token encodings (ASCII text, GPT-2-style byte-level BPE).

A byte-level BPE with GPT-2's pre-tokenizer splits text with one regex and runs its merges inside
each pre-token alone, so a document's ids are the concatenation of its pre-tokens' ids. Source code
repeats its pre-tokens (names, keywords, operators, indentation) so heavily that a workspace of
tens of megabytes has only a few hundred thousand distinct ones: encoding each once and joining
cached id bytes is several times faster than the tokenizer's own batch encode (which builds offsets
and an ``Encoding`` object per document), and the index build is mostly tokenization.

Exactness is checked, not assumed: the cache is only used for a tokenizer whose configuration is
exactly that (no normalizer, ``ByteLevel`` with GPT-2's regex and no prefix space, BPE without
dropout) and that agrees with its own encode on a probe set. Only ASCII texts without added
tokens take this path: over ASCII, GPT-2's ``\\p{L}``, ``\\p{N}`` and ``\\s`` are fixed byte
classes, so Python's ``re`` reproduces the split; anything else goes to the tokenizer itself.
"""

from __future__ import annotations

import json
import logging
import re
from itertools import chain
from typing import Callable, Sequence

import numpy as np

log = logging.getLogger("codespec.index")

_SPACE = "\\t\\n\\x0b\\x0c\\r "  # Unicode White_Space within ASCII (not \x1c-\x1f, unlike str.isspace)
_ALNUM = "A-Za-z0-9"
# GPT-2's pattern 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ over ASCII.
ASCII_PRETOKEN = re.compile(
    rf"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^{_SPACE}{_ALNUM}]+"
    rf"|[{_SPACE}]+(?![^{_SPACE}])|[{_SPACE}]+")

_PROBES = (
    "def f(x):\n    return x + 1  # it's 3.14\n\n\tclass A: pass\r\n",
    "a  b   c\t\t d \x0b\x0c e\x1c\x1d\x1e\x1f f  \n  \n\n    x = [1, 2,3]  ",
    "I'm you'll we'd they've 's 'S 'LL don't  'x ''s 12345678901234 a1b2 _x__y__ $%^&*() ~`{}|",
    "    if  x :\r\n        y  =  '''doc''' \"\"\" ;;\n\n\n   ",
)


def supports_pretoken_cache(backend) -> bool:
    """True if ``backend`` (a ``tokenizers.Tokenizer``) is the GPT-2-style byte-level BPE this
    cache reproduces; the caller still verifies on probes."""
    try:
        config = json.loads(backend.to_str())
    except Exception:  # not serialisable: unknown parts
        return False
    pre = config.get("pre_tokenizer") or {}
    model = config.get("model") or {}
    return (config.get("normalizer") is None and pre.get("type") == "ByteLevel"
            and pre.get("use_regex", True) and not pre.get("add_prefix_space", False)
            and model.get("type") == "BPE" and model.get("dropout") in (None, 0.0))


class PretokenCache:
    """Encodes ASCII texts by joining cached per-pre-token id bytes; ``fallback`` encodes the rest."""

    def __init__(self, encode_many: Callable[[list[str]], list[list[int]]], added: Sequence[str],
                 dtype: np.dtype, max_entries: int = 1 << 19) -> None:
        self.encode_many = encode_many  # the tokenizer's own batch encode: texts -> id lists
        self.added = tuple(a for a in added if a)
        self.dtype = np.dtype(dtype)
        self.max_entries = max_entries
        self.pieces: dict[str, bytes] = {}

    def verify(self) -> bool:
        expected = self.encode_many(list(_PROBES))
        got = self.encode_batch(list(_PROBES), lambda texts: [])
        return all(g is not None and g.tolist() == e for g, e in zip(got, expected))

    def eligible(self, text: str) -> bool:
        return text.isascii() and not any(a in text for a in self.added)

    def encode_batch(self, texts: Sequence[str], fallback: Callable[[list[str]], list[np.ndarray]]
                     ) -> list[np.ndarray]:
        out: list[np.ndarray | None] = [None] * len(texts)
        split: dict[int, list[str]] = {}
        others: list[int] = []
        for i, text in enumerate(texts):
            if self.eligible(text):
                split[i] = ASCII_PRETOKEN.findall(text)
            else:
                others.append(i)
        if len(self.pieces) > self.max_entries:
            self.pieces.clear()
        missing = list(set(chain.from_iterable(split.values())).difference(self.pieces))
        if missing:
            for piece, ids in zip(missing, self.encode_many(missing)):
                self.pieces[piece] = np.asarray(ids, dtype=self.dtype).tobytes()
        get = self.pieces.__getitem__
        for i, pieces in split.items():
            out[i] = np.frombuffer(b"".join(map(get, pieces)), dtype=self.dtype)
        for i, array in zip(others, fallback([texts[i] for i in others]) if others else ()):
            out[i] = array
        return out  # type: ignore[return-value]
