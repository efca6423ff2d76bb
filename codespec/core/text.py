"""Incremental detokenisation with stop strings.

Text is streamed as tokens are accepted, but never past a stop string, even one that spans
tokens: the tail of the text that could still become a stop string is held back until the next
token decides it. Decoding uses the prefix/read-offset technique (as in vLLM and TGI) so each
token costs a decode of a few tokens, and a token that ends inside a UTF-8 character (byte-level
BPE) waits for the rest of the character.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

_CONTEXT_TOKENS = 5  # tokens of left context decoded with each new token (leading-space tokenizers)


class TextStream:
    """Feed token ids one at a time; read back text that is safe to show."""

    def __init__(
        self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = (), context_ids: Sequence[int] = ()
    ) -> None:
        self._decode = decode
        self._stop = tuple(stop)
        self._longest_stop = max((len(s) for s in self._stop), default=0)
        self._ids: list[int] = list(context_ids[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self.text = ""  # all decoded output text (cut at the stop string once one is found)
        self._shown = 0  # characters of ``text`` already returned
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Add one token; return newly safe text ("" if held back or already stopped)."""
        if self.stopped:
            return ""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""  # an incomplete character: wait for the next token
        searched_from = max(0, len(self.text) - self._longest_stop + 1)
        self.text += new_text[len(prefix_text) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        if self._stop:
            hits = [i for i in (self.text.find(s, searched_from) for s in self._stop) if i >= 0]
            if hits:
                self.text = self.text[: min(hits)]
                self.stopped = True
                return self._take(len(self.text))
        return self._take(len(self.text) - self._held_back())

    def flush(self) -> str:
        """At the end of a request: whatever was held back is final text now."""
        if not self.stopped and self._read_offset < len(self._ids):  # a trailing partial character
            prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
            self.text += self._decode(self._ids[self._prefix_offset :])[len(prefix_text) :]
            self._read_offset = len(self._ids)
        return self._take(len(self.text))

    def _held_back(self) -> int:
        """Length of the longest text suffix that is a proper prefix of some stop string."""
        longest = 0
        for stop in self._stop:
            for size in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if self.text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def _take(self, end: int) -> str:
        end = max(end, self._shown)
        delta = self.text[self._shown : end]
        self._shown = end
        return delta
