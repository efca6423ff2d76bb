"""The one module that reads vLLM's internals: the arguments of the request each batch row holds
(its prediction, and how many tokens it may generate: a draft past that is verified for nothing).

vLLM (0.32) calls a custom proposer with token rows only, and its one per-request hook, a
logits processor, is refused while speculative decoding is on
(``STR_SPEC_DEC_REJECTS_LOGITSPROCS``). A request's ``vllm_xargs`` do reach the worker, as
``SamplingParams.extra_args`` in the model runner's ``requests`` (by request id), and the runner's
``input_batch.req_ids`` says which request each row holds. The proposer is built by that runner
(``create_custom_proposer(self.vllm_config)`` in its ``__init__``), so it is found once, on the
stack that constructs the proposer, and read only when a new sequence is met. If vLLM changes any
of this, the drafter logs it once and drafts without predictions or a request's end
(tests/vllm_proposer/test_real_vllm.py fails by name).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Any

from codespec.core.draft import REFERENCE_ARG

log = logging.getLogger("vllm.codespec")
SEARCH_FRAMES = 8  # frames above the proposer's constructor searched for the runner that builds it


@dataclass(frozen=True)
class RowRequest:
    """What the request a batch row holds asked for, as far as drafting is concerned."""

    prediction: str | None = None  # the text it sent to draft from (``vllm_xargs``)
    max_tokens: int | None = None  # the most tokens it may generate (None: up to the context window)


UNKNOWN = RowRequest()


class RunnerRequests:
    """``request(row)``: what the request in that batch row asked for (its prediction, its
    ``max_tokens``)."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self._broken = False

    @classmethod
    def find(cls) -> RunnerRequests | None:
        """The model runner constructing the caller (None: not built by a vLLM model runner)."""
        frame = sys._getframe(1)
        for _ in range(SEARCH_FRAMES):
            frame = frame.f_back  # type: ignore[assignment]
            if frame is None:
                return None
            candidate = frame.f_locals.get("self")
            if callable(getattr(candidate, "propose_draft_token_ids", None)) and hasattr(candidate, "vllm_config"):
                return cls(candidate)
        return None

    def request(self, row: int) -> RowRequest:
        if self._broken:
            return UNKNOWN
        try:
            request_id = self.runner.input_batch.req_ids[row]
            state = self.runner.requests.get(request_id) if request_id is not None else None
            params = None if state is None else state.sampling_params
            args = None if params is None else params.extra_args
            max_tokens = None if params is None else params.max_tokens
        except (AttributeError, IndexError, TypeError) as error:
            self._broken = True
            log.warning(
                "codespec: this vLLM does not show a row's request (%s); drafting without predictions "
                "or a request's max_tokens",
                error,
            )
            return UNKNOWN
        value = (args or {}).get(REFERENCE_ARG)
        return RowRequest(
            value if isinstance(value, str) and value else None,
            max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else None,
        )
