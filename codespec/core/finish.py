"""Why a generation ended: one typed value from the decode loop to every door's wire format."""

from __future__ import annotations

import enum


class FinishReason(enum.StrEnum):
    """A string enum: each member is its own wire name in codespec's protocols and logs."""

    EOS = "eos"  # the model's end token
    STOP = "stop"  # a stop string the request gave
    REPETITION = "repetition"  # a completion caught repeating itself (the stop_repeats guard)
    LENGTH = "length"  # the request's max_tokens
    CONTEXT = "context"  # the model's context is full
    DEADLINE = "deadline"  # the request's time budget
    CANCELLED = "cancelled"  # the client cancelled it, or the server is stopping

    @property
    def finished_text(self) -> bool:
        """The model ended the text itself (an end token or a stop string), not a budget."""
        return self in (FinishReason.EOS, FinishReason.STOP)
