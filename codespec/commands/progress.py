"""Progress on stderr for the commands that run a while (`codespec demo`): one line rewritten in
place on a terminal, plain lines elsewhere (a log, CI), so the user sees the work as it happens and
stdout keeps only the result (a report, or JSON)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

BAR = 20  # characters of the progress bar on a terminal


class Progress:
    def __init__(self, stream: TextIO | None = None, live: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live  # a terminal: rewrite one line
        self.started = time.perf_counter()
        self._phase, self._total, self._done = "", 0, 0
        self._open = False  # a live line is on screen without its newline

    def say(self, text: str) -> None:
        """A line of its own (a phase starting, the model loading)."""
        self._end_line()
        self.stream.write(f"codespec: {text}\n")
        self.stream.flush()

    def phase(self, name: str, total: int) -> None:
        self._end_line()
        self._phase, self._total, self._done = name, total, 0

    def step(self, detail: str) -> None:
        """One item of the phase done; ``detail`` says what and how it went."""
        self._done += 1
        text = (
            f"codespec: {self._phase} {self._done}/{self._total} ({time.perf_counter() - self.started:.0f} s)  {detail}"
        )
        if self.live:
            filled = BAR * self._done // max(self._total, 1)
            bar = "[" + "#" * filled + "." * (BAR - filled) + "] "
            self.stream.write("\r\x1b[2K" + bar + text)
            self._open = True
            if self._done == self._total:
                self._end_line()
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def _end_line(self) -> None:
        if self._open:
            self.stream.write("\n")
            self._open = False
