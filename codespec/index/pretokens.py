"""Bulk encoding through a cache of pre-token encodings (GPT-2-style byte-level BPE).

A byte-level BPE with GPT-2's pre-tokenizer splits text with one regex and runs its merges inside
each pre-token alone, so a document's ids are the concatenation of its pre-tokens' ids. Source code
repeats its pre-tokens (names, keywords, operators, indentation) so heavily that a workspace of
tens of megabytes has only a few hundred thousand distinct ones: encoding each once and joining
cached id bytes is several times faster than the tokenizer's own batch encode (which builds offsets
and an ``Encoding`` object per document), and the index build is mostly tokenization.

Exactness is checked, not assumed: the cache is only used for a tokenizer whose configuration is
exactly that (no normalizer, ``ByteLevel`` with GPT-2's regex and no prefix space, BPE without
dropout) and that agrees with its own encode on probe texts. Over ASCII, GPT-2's ``\\p{L}``,
``\\p{N}`` and ``\\s`` are fixed byte classes, so Python's ``re`` reproduces the split; a stretch
around non-ASCII characters, cut at forced splits on both sides, goes to the tokenizer whole, as
does a text containing an added token. New pre-tokens and stretches are encoded by the tokenizer
itself, joined by an added token (split off before pre-tokenization, so each is encoded alone).

Any other tokenizer falls back to its own batch encode: ``pretoken_cache_mismatch`` names what
differs (Qwen2 / Qwen2.5: an NFC normalizer and ``Split`` with Qwen2's regex before
``ByteLevel(use_regex=False)``), and the probe texts include splits where such regexes differ
from GPT-2's, so the probe check alone would refuse them too. ``index.tokens.TokenizerAdapter``
records and logs which path was taken.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from itertools import chain

import numpy as np

_SPACE = "\\t\\n\\x0b\\x0c\\r "  # Unicode White_Space within ASCII (not \x1c-\x1f, unlike str.isspace)
_ALNUM = "A-Za-z0-9"
# GPT-2's pattern 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ over ASCII.
ASCII_PRETOKEN = re.compile(
    rf"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^{_SPACE}{_ALNUM}]+"
    rf"|[{_SPACE}]+(?![^{_SPACE}])|[{_SPACE}]+"
)

_NON_ASCII = re.compile(r"[^\x00-\x7f]+")
# A forced split: a whitespace character after a printable non-space ASCII one. Every pattern that
# matches the printable character ends before the whitespace (none of them mixes the two), and
# the next match starts there as if the text began there (no pattern looks behind).
_FORCED = re.compile(rf"(?<=[!-~])[{_SPACE}]")

_PROBES = (
    "x = 'é' \n  # 中文 comment\u3000 here\n\ty=\"ü\"\r\n  z = 1  \xa0 w\n",
    "def f(x):\n    return x + 1  # it's 3.14\n\n\tclass A: pass\r\n",
    "a  b   c\t\t d \x0b\x0c e\x1c\x1d\x1e\x1f f  \n  \n\n    x = [1, 2,3]  ",
    "I'm you'll we'd they've 's 'S 'LL don't  'x ''s 12345678901234 a1b2 _x__y__ $%^&*() ~`{}|",
    "    if  x :\r\n        y  =  '''doc''' \"\"\" ;;\n\n\n   ",
    # Where other byte-level regexes split differently (Qwen2, Llama 3: a punctuation character
    # joins the letters after it, digits go one by one, punctuation keeps the line breaks after it).
    "self.items.append(value)\n\n    return (self._x, obj.attr)\n}\n\n{\n\tx=[];\n\n'''\n",
    "import os.path\nfrom .util import _helper, Path\n#comment\n@property\n    def __init__(self):\n",
)


def supports_pretoken_cache(backend) -> bool:
    """True if ``backend`` (a ``tokenizers.Tokenizer``) is the GPT-2-style byte-level BPE this
    cache reproduces; the caller still verifies on probes."""
    return pretoken_cache_mismatch(backend) is None


def pretoken_cache_mismatch(backend) -> str | None:
    """Why ``backend``'s configuration (a ``tokenizers.Tokenizer``, or its tokenizer.json already
    parsed) is not the one this cache reproduces (None: it is). A byte-level BPE with another split
    regex (Qwen2's ``Split`` then ``ByteLevel(use_regex=False)``, Llama 3's, DeepSeek's splits) cuts
    pre-tokens elsewhere than GPT-2's regex, so it is refused."""
    try:
        config = backend if isinstance(backend, dict) else json.loads(backend.to_str())
    except Exception:  # not serialisable: unknown parts
        return "its configuration cannot be serialised"
    pre = config.get("pre_tokenizer") or {}
    model = config.get("model") or {}
    found = []
    if config.get("normalizer") is not None:
        found.append(f"it has a normalizer ({describe_component(config['normalizer'])})")
    if pre.get("type") != "ByteLevel" or not pre.get("use_regex", True):
        described = describe_component(pre) if pre else "none"
        found.append(f"its pre-tokenizer is {described}, not ByteLevel with GPT-2's regex")
    elif pre.get("add_prefix_space", False):
        found.append("its ByteLevel pre-tokenizer adds a prefix space")
    if model.get("type") != "BPE" or model.get("dropout") not in (None, 0.0):
        found.append(f"its model is {model.get('type')} (dropout {model.get('dropout')}), not a BPE without dropout")
    return "; ".join(found) or None


def describe_component(config: dict) -> str:
    """A normalizer or pre-tokenizer configuration in a few words, e.g.
    ``Sequence[Split(Qwen2's regex), ByteLevel(use_regex=False)]``."""
    kind = config.get("type", "?")
    if kind == "Sequence":
        parts = config.get("pretokenizers") or config.get("normalizers") or []
        return f"Sequence[{', '.join(describe_component(part) for part in parts)}]"
    if kind == "Split":
        pattern = config.get("pattern") or {}
        text = pattern.get("Regex") or pattern.get("String") or ""
        return f"Split({KNOWN_REGEXES.get(text) or repr(text[:40] + ('...' if len(text) > 40 else ''))})"
    if kind == "ByteLevel":
        return f"ByteLevel(use_regex={config.get('use_regex', True)})"
    return str(kind)


# Split patterns worth naming in a message (as tokenizer.json files spell them).
KNOWN_REGEXES = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+": "Qwen2's regex",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": "Llama 3's regex",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+": "GPT-2's regex",
}


class PretokenCache:
    """Encodes texts by joining cached per-pre-token id bytes; ``fallback`` encodes texts that
    contain an added token."""

    def __init__(
        self,
        encode_many: Callable[[list[str]], list[list[int]]],
        added: Sequence[str],
        dtype: np.dtype,
        separator: tuple[str, int] | None = None,
        max_entries: int = 1 << 18,
    ) -> None:
        self.encode_many = encode_many  # the tokenizer's own batch encode: texts -> id lists
        self.added = tuple(a for a in added if a)
        self.dtype = np.dtype(dtype)
        # An added token (text, id): new pre-tokens are encoded joined by it, a few long texts
        # instead of one short text each (3x faster: the tokenizer's cost is mostly per text).
        # Added tokens are split off before pre-tokenization, so each piece is encoded alone.
        self.separator = separator
        self.max_entries = max_entries
        self.pieces: dict[str, bytes] = {}

    def verify(self) -> bool:
        expected = self.encode_many(list(_PROBES))
        got = self.encode_batch(list(_PROBES), lambda texts: [])
        return all(g is not None and g.tolist() == e for g, e in zip(got, expected))

    def eligible(self, text: str) -> bool:
        return not any(a in text for a in self.added)

    @staticmethod
    def split(text: str) -> list[str]:
        """Pre-tokens of an ASCII text; for any other text, the pre-tokens of its ASCII stretches
        and, whole, each stretch around non-ASCII characters between two forced splits (encoded
        by the tokenizer alone, which gives the same ids as in place)."""
        if text.isascii():
            return ASCII_PRETOKEN.findall(text)
        out: list[str] = []
        pos = 0
        for match in _NON_ASCII.finditer(text):
            if match.start() < pos:
                continue  # inside the previous stretch
            start = _forced_split_before(text, match.start(), pos)
            after = _FORCED.search(text, match.end())
            end = after.start() if after else len(text)
            out += ASCII_PRETOKEN.findall(text, pos, start)
            out.append(text[start:end])
            pos = end
        out += ASCII_PRETOKEN.findall(text, pos)
        return out

    def encode_batch(self, texts: Sequence[str], fallback: Callable[[list[str]], list[np.ndarray]]) -> list[np.ndarray]:
        out: list[np.ndarray | None] = [None] * len(texts)
        split: dict[int, list[str]] = {}
        others: list[int] = []
        for i, text in enumerate(texts):
            if self.eligible(text):
                split[i] = self.split(text)
            else:
                others.append(i)
        if len(self.pieces) > self.max_entries:
            self.pieces.clear()
        missing = list(set(chain.from_iterable(split.values())).difference(self.pieces))
        if missing:
            self.pieces.update(zip(missing, self._encode_pieces(missing)))
        get = self.pieces.__getitem__
        for i, pieces in split.items():
            out[i] = np.frombuffer(b"".join(map(get, pieces)), dtype=self.dtype)
        for i, array in zip(others, fallback([texts[i] for i in others]) if others else ()):
            out[i] = array
        return out  # type: ignore[return-value]

    def _encode_pieces(self, pieces: list[str], chunk: int = 8192) -> list[bytes]:
        if self.separator is None:
            return [np.asarray(ids, dtype=self.dtype).tobytes() for ids in self.encode_many(pieces)]
        text, sep_id = self.separator
        chunks = [pieces[i : i + chunk] for i in range(0, len(pieces), chunk)]
        encoded: list[bytes] = []
        for part, ids in zip(chunks, self.encode_many([text.join(c) for c in chunks])):
            joined = np.asarray(ids, dtype=self.dtype)
            cuts = np.flatnonzero(joined == sep_id)
            if len(cuts) != len(part) - 1:  # not split as expected: one text per piece
                encoded += [np.asarray(i, dtype=self.dtype).tobytes() for i in self.encode_many(part)]
                continue
            bounds = np.concatenate([[-1], cuts, [len(joined)]])
            raw = joined.tobytes()
            width = self.dtype.itemsize
            encoded += [raw[(lo + 1) * width : hi * width] for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist())]
        return encoded


def _forced_split_before(text: str, position: int, floor: int) -> int:
    """The last forced split at or before ``position`` and after ``floor`` (itself a split)."""
    window = 256
    while True:
        low = max(floor, position - window)
        last = None
        for last in _FORCED.finditer(text, low, position + 1):  # noqa: B007 (keeps the last match)
            pass
        if last is not None:
            return last.start()
        if low == floor:
            return floor
        window *= 4
