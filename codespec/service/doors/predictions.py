"""Prediction tokens as OpenAI counts them, the same at every door.

A client's ``prediction`` (OpenAI Predicted Outputs) is counted against the final text: the
prediction's tokens that appear in it, aligned in order as a diff aligns them, are accepted, the
rest rejected (``accepted + rejected`` = the prediction's token count; both 0 without one). That
is what ``usage.accepted_prediction_tokens`` / ``rejected_prediction_tokens`` mean on the HTTP and
websocket doors alike (docs/http.md, "Usage"). How the engine's drafting used the prediction
(the steps whose reference draft it verified) is a different count, reported beside it as
``speculation`` (:func:`speculation`).
"""

from __future__ import annotations

import asyncio
import copy
import difflib
import threading
from collections.abc import Callable
from typing import TypeVar

from codespec.service.engine.service import EngineService

T = TypeVar("T")


def prediction_counts(tokenizer, prediction: str, text: str) -> tuple[int, int]:
    """(accepted, rejected): the prediction's tokens found in ``text`` in order, and the others."""
    predicted = tokenizer.encode(prediction, add_special_tokens=False)
    produced = tokenizer.encode(text, add_special_tokens=False) if text else []
    matcher = difflib.SequenceMatcher(None, predicted, produced, autojunk=False)
    accepted = sum(block.size for block in matcher.get_matching_blocks())
    return accepted, len(predicted) - accepted


class DoorTokenizer:
    """A door's private copy of the target's tokenizer (a fast tokenizer must not be shared across
    threads), made once on the engine thread and used off the event loop, one call at a time."""

    def __init__(self, service: EngineService) -> None:
        self.service = service
        self._tokenizer = None
        self._lock = threading.Lock()
        self._copying: asyncio.Lock | None = None

    async def run(self, work: Callable[..., T]) -> T:
        """``work(tokenizer)`` in a worker thread."""
        if self._tokenizer is None:
            if self._copying is None:
                self._copying = asyncio.Lock()
            async with self._copying:
                if self._tokenizer is None:
                    tokenizer = self.service.target.tokenizer
                    self._tokenizer = await self.service.acall(lambda: copy.deepcopy(tokenizer))
        tokenizer = self._tokenizer

        def locked() -> T:
            with self._lock:
                return work(tokenizer)

        return await asyncio.to_thread(locked)

    async def prediction_counts(self, prediction: str, text: str) -> tuple[int, int]:
        return await self.run(lambda tokenizer: prediction_counts(tokenizer, prediction, text))
