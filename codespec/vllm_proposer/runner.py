"""The one module that reads vLLM's internals: the arguments of the request each batch row holds.

vLLM (0.32) calls a custom proposer with token rows only, and its one per-request hook, a
logits processor, is refused while speculative decoding is on
(``STR_SPEC_DEC_REJECTS_LOGITSPROCS``). A request's ``vllm_xargs`` do reach the worker, as
``SamplingParams.extra_args`` in the model runner's ``requests`` (by request id), and the runner's
``input_batch.req_ids`` says which request each row holds. The proposer is built by that runner
(``create_custom_proposer(self.vllm_config)`` in its ``__init__``), so it is found once, on the
stack that constructs the proposer, and read only when a new sequence is met. If vLLM changes any
of this, the drafter logs it once and drafts without predictions (tests/vllm_proposer/test_real_vllm.py
fails by name).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from codespec.core.draft import REFERENCE_ARG

log = logging.getLogger("vllm.codespec")
SEARCH_FRAMES = 8  # frames above the proposer's constructor searched for the runner that builds it


class RunnerRequests:
    """``reference(row)``: the prediction the request in that batch row sent, if any."""

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

    def reference(self, row: int) -> str | None:
        if self._broken:
            return None
        try:
            request_id = self.runner.input_batch.req_ids[row]
            state = self.runner.requests.get(request_id) if request_id is not None else None
            args = None if state is None or state.sampling_params is None else state.sampling_params.extra_args
        except (AttributeError, IndexError, TypeError) as error:
            self._broken = True
            log.warning("codespec: this vLLM does not show a row's request (%s); drafting without predictions", error)
            return None
        value = (args or {}).get(REFERENCE_ARG)
        return value if isinstance(value, str) and value else None
