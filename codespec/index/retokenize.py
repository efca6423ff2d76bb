"""Incremental re-tokenization: apply a text edit to a token array by re-encoding a small window.

Why a window is exact. Byte-level BPE first splits text into pre-tokens with a left-to-right regex
(GPT-2's pattern) and merges only inside a pre-token. Where a non-space character is followed by
a space character, every pattern ends before the space: the split there is *forced*, and the
pre-tokens before it do not depend on anything after it, while the regex restarts there as if the
text began there. So between two forced splits that lie outside the edited span, tokenizing the
window alone gives exactly the tokens a full rebuild gives, and the tokens outside it are kept.
Windows are found by searching outwards from the edit for such anchors.

Other pre-tokenizers force splits elsewhere, so the anchor is the adapter's
(``TokenizerAdapter.split_anchor``, chosen from the tokenizer's configuration): Qwen2's and Llama 3's
regex let a punctuation run take the line breaks after it (``">\n\n"`` is one pre-token), so a
split there is not forced and anchors sit after letters and digits, or before a space that is
not a line break; DeepSeek-Coder's first ``Split`` isolates every line break, so anchors sit after
each one.

For tokenizers where that reasoning might not hold, both window ends are compared with the old
tokens that lie outside the edit; on disagreement the window grows (to the whole text at worst),
so the result is always what a full encode gives. The property test checks equality with a full
rebuild on random edit sequences (tests/index; tests/families for the Qwen2 and DeepSeek rules).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from codespec.index.tokens import TokenizerAdapter

_ANCHOR = re.compile(r"\S(?=\s)")  # the split after this non-space character is forced (GPT-2's regex)
_FIRST_SPAN = 256  # characters searched for an anchor on each side before widening


@dataclass(frozen=True)
class Spliced:
    """A document after an edit: its text, tokens and token start offsets (characters), plus the
    old token range [first, stop) that was replaced and how many tokens replaced it."""

    text: str
    token_ids: np.ndarray
    starts: np.ndarray
    first: int
    stop: int
    inserted: int


def _left_anchor(text: str, limit: int, span: int, anchor: re.Pattern = _ANCHOR) -> int:
    """Largest forced split a <= limit - 1 with a >= limit - span (widening until one is found)."""
    while True:
        lo = max(0, limit - span)
        last = None
        for last in anchor.finditer(text, lo, limit):  # noqa: B007 (keeps the last match)
            pass
        if last is not None and last.end() < limit:
            return last.end()
        if lo == 0:
            return 0
        span *= 2


def _right_anchor(text: str, after: int, span: int, anchor: re.Pattern = _ANCHOR) -> int:
    """Smallest forced split b with text[b - 1] at or after ``after`` (or the end of the text)."""
    while True:
        hi = min(len(text), after + span)
        match = anchor.search(text, after, hi)
        if match is not None and match.end() < len(text):
            return match.end()
        if hi == len(text):
            return len(text)
        span *= 2


def splice(
    adapter: TokenizerAdapter,
    old_text: str,
    old_ids: np.ndarray,
    old_starts: np.ndarray,
    start: int,
    end: int,
    new_text: str,
) -> Spliced:
    """Replace characters [start, end) of ``old_text`` by ``new_text``; re-encode only a window."""
    if not 0 <= start <= end <= len(old_text):
        raise ValueError(f"edit range [{start}, {end}) outside a document of {len(old_text)} characters")
    text = old_text[:start] + new_text + old_text[end:]
    delta = len(new_text) - (end - start)
    new_end = start + len(new_text)
    count = len(old_ids)
    left_limit, right_after, span = start, new_end, _FIRST_SPAN
    anchor = getattr(adapter, "split_anchor", _ANCHOR)
    while True:
        a = _left_anchor(text, left_limit, span, anchor) if start > 0 else 0
        b_new = _right_anchor(text, right_after, span, anchor)
        b_old = b_new - delta
        first = int(np.searchsorted(old_starts, a, side="left"))
        stop = int(np.searchsorted(old_starts, b_old, side="left"))
        aligned = (first < count and old_starts[first] == a or a == 0 or first == count and a == len(old_text)) and (
            stop < count and old_starts[stop] == b_old or b_old == len(old_text)
        )
        if a == 0:
            first = 0
        if b_old == len(old_text):
            stop = count
        if aligned:
            window = text[a:b_new]
            window_ids = adapter.encode_array(window)
            window_starts = adapter.char_starts(window, window_ids) + a
            if _ends_agree(old_ids, old_starts, first, stop, start, end, delta, window_ids, window_starts):
                break
        if a == 0 and b_new == len(text):  # whole text: nothing left to widen
            window_ids = adapter.encode_array(text)
            window_starts = adapter.char_starts(text, window_ids)
            first, stop = 0, count
            break
        left_limit, right_after, span = max(0, a), min(len(text), b_new + 1), span * 4
    token_ids = np.concatenate([old_ids[:first], window_ids, old_ids[stop:]]).astype(old_ids.dtype, copy=False)
    starts = np.concatenate([old_starts[:first], window_starts, old_starts[stop:] + delta])
    return Spliced(text, token_ids, starts, first, stop, len(window_ids))


def _ends_agree(old_ids, old_starts, first, stop, start, end, delta, window_ids, window_starts) -> bool:
    """Safety net: window tokens lying wholly outside the edit must equal the old ones there."""
    if first < stop and len(window_ids):
        first_end = old_starts[first + 1] if first + 1 < len(old_starts) else None
        if first_end is not None and first_end <= start:
            if window_ids[0] != old_ids[first] or len(window_ids) < 2 or window_starts[1] != first_end:
                return False
        last_start = old_starts[stop - 1]
        if last_start >= end:
            if window_ids[-1] != old_ids[stop - 1] or window_starts[-1] != last_start + delta:
                return False
    return True


def full_encode(adapter: TokenizerAdapter, text: str) -> tuple[np.ndarray, np.ndarray]:
    """The reference the incremental path must equal: tokens and starts of the whole text."""
    token_ids = adapter.encode_array(text)
    return token_ids, adapter.char_starts(text, token_ids)
