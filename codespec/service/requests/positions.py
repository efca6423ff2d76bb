"""The one codec between editor positions and text offsets.

LSP positions are (line, character) where ``character`` counts UTF-16 code units (the default
``positionEncoding``; UTF-8 and UTF-32 when the client negotiates them); Python strings index
code points. Every conversion in lsp/ goes through
this module, so a character outside the Basic Multilingual Plane (an emoji: one code point, two
UTF-16 units) is handled in exactly one place. A position that lands between the two halves of
a surrogate pair is not a position in the text at all: it is an error, never silently rounded.

Lines end at "\\n", "\\r\\n" or "\\r" (LSP 3.17 §Text Documents).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


class PositionError(ValueError):
    """A position that does not exist in the document (out of range, or inside a surrogate pair)."""


@dataclass(frozen=True)
class Position:
    line: int
    character: int  # UTF-16 code units from the start of the line


def _units(ch: str, encoding: str) -> int:
    """Code units of one code point in the negotiated position encoding."""
    code = ord(ch)
    if encoding == "utf-16":
        return 2 if code > 0xFFFF else 1
    if encoding == "utf-32":
        return 1
    return 1 if code < 0x80 else 2 if code < 0x800 else 3 if code < 0x10000 else 4  # utf-8


ENCODINGS = ("utf-16", "utf-8", "utf-32")


def _unit_name(encoding: str, count: int) -> str:
    name = "character" if encoding == "utf-32" else f"{encoding.upper()} code unit"
    return name if count == 1 else f"{name}s"


class LineIndex:
    """Line starts of one text, computed once; converts positions both ways."""

    def __init__(self, text: str, encoding: str = "utf-16", first: int = 0) -> None:
        """``first``: the number of the first line and character, in positions and in error
        messages alike: 0 for the LSP and the websocket protocol, 1 for a user's FILE:LINE:COL."""
        if encoding not in ENCODINGS:
            raise ValueError(f"unknown position encoding {encoding!r}; expected one of {ENCODINGS}")
        self.text = text
        self.encoding = encoding
        self.first = first
        self.starts = [0] + [match.end() for match in _LINE_BREAK.finditer(text)]

    @property
    def line_count(self) -> int:
        return len(self.starts)

    def line_span(self, line: int) -> tuple[int, int]:
        """Code point offsets of a line's first character and of its end (before the line break)."""
        start = self.starts[line]
        if line + 1 < len(self.starts):
            end = self.starts[line + 1]
            end -= 2 if self.text.startswith("\r\n", end - 2) else 1
        else:
            end = len(self.text)
        return start, end

    def offset(self, line: int, character: int, clamp: bool = False) -> int:
        """Code point offset of an LSP position.

        ``clamp`` applies the LSP rule that a character past the end of its line means the end of
        the line (editors send such positions after deletions); without it that is an error. A
        line past the end and a position inside a surrogate pair are errors either way.
        """
        if (
            not isinstance(line, int)
            or not isinstance(character, int)
            or isinstance(line, bool)
            or isinstance(character, bool)
        ):
            raise PositionError(f"a position is two integers, got line={line!r}, character={character!r}")
        first = self.first
        column = "character" if first == 0 else "column"
        if line < first or character < first:
            raise PositionError(f"no such position (line {line}, {column} {character}): they count from {first}")
        last_line = len(self.starts) - 1 + first
        if line > last_line:
            raise PositionError(
                f"line {line} is out of range: the document's last line is {last_line} (lines count from {first})"
            )
        start, end = self.line_span(line - first)
        units = 0
        for offset in range(start, end):
            if units == character - first:
                return offset
            units += _units(self.text[offset], self.encoding)
            if units > character - first:
                raise PositionError(
                    f"{column} {character} on line {line} falls inside a character "
                    f"({'a surrogate pair' if self.encoding == 'utf-16' else 'a multi-byte sequence'}; "
                    f"positions count {self.encoding.upper()} code units)"
                )
        if units == character - first or clamp:
            return end
        raise PositionError(
            f"{column} {character} is out of range: line {line} ends at {column} {units + first} "
            f"({units} {_unit_name(self.encoding, units)}; {column}s count from {first})"
        )

    def position(self, offset: int) -> Position:
        """The LSP position of a code point offset (0 <= offset <= len(text))."""
        if not 0 <= offset <= len(self.text):
            raise PositionError(f"offset {offset} is outside the text (length {len(self.text)})")
        line = bisect.bisect_right(self.starts, offset) - 1
        units = sum(_units(ch, self.encoding) for ch in self.text[self.starts[line] : offset])
        return Position(line + self.first, units + self.first)


def position_at(text: str, offset: int, encoding: str = "utf-16") -> Position:
    return LineIndex(text, encoding).position(offset)


def range_offsets(
    text: str, start: tuple[int, int], end: tuple[int, int], clamp: bool = False, encoding: str = "utf-16"
) -> tuple[int, int]:
    """Code point offsets of an LSP range given as (line, character) pairs; start must not follow end."""
    index = LineIndex(text, encoding)
    start_offset = index.offset(*start, clamp=clamp)
    end_offset = index.offset(*end, clamp=clamp)
    if end_offset < start_offset:
        raise PositionError(f"range end {end} comes before its start {start}")
    return start_offset, end_offset


def changed_span(old: str, new: str) -> tuple[int, int, str]:
    """The smallest single replacement turning ``old`` into ``new``: (start, end in old, new text).

    Used to hand the index one update for a burst of debounced keystrokes, and to read a client's
    whole-text change as an edit; slices are compared by bisection (C-speed on megabyte texts).
    """
    limit = min(len(old), len(new))
    start = _common_length(limit, lambda size: old[:size] == new[:size])
    tail = _common_length(limit - start, lambda size: old[len(old) - size :] == new[len(new) - size :])
    return start, len(old) - tail, new[start : len(new) - tail]


def _common_length(limit: int, same) -> int:
    """The largest size in [0, limit] for which ``same(size)`` holds (it holds for every smaller one)."""
    low, high = 0, limit
    while low < high:
        middle = (low + high + 1) // 2
        if same(middle):
            low = middle
        else:
            high = middle - 1
    return low
