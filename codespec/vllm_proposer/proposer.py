"""The class vLLM loads through ``speculative_config = {"method": "custom_class", ...}``.

vLLM (0.32, ``vllm/v1/spec_decode/custom_class_proposer.py``) constructs it with its
``VllmConfig`` and, after every step, calls ``propose`` with the batch: the tokens sampled for
each row this step (empty: the row is not decoding, e.g. still prefilling), each row's length
and the token table. It verifies the returned drafts itself (rejection sampling against the
target), so what is returned here never changes the output, only how many tokens a step yields.
Nothing here imports vLLM: the config is read by its field names (docs/vllm.md).
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import numpy as np

from codespec.vllm_proposer.drafter import BatchDrafter
from codespec.vllm_proposer.options import DrafterOptions
from codespec.vllm_proposer.rows import Row
from codespec.vllm_proposer.runner import RunnerRequests

log = logging.getLogger("vllm.codespec")  # under vLLM's logger: its lines land in vLLM's log


class CodespecProposer:
    options: ClassVar[DrafterOptions] = DrafterOptions()  # a configured subclass carries others

    def __init__(self, vllm_config: Any) -> None:
        from transformers import AutoTokenizer

        model_config = vllm_config.model_config
        tokenizer = AutoTokenizer.from_pretrained(
            model_config.tokenizer,
            revision=getattr(model_config, "tokenizer_revision", None),
            trust_remote_code=bool(getattr(model_config, "trust_remote_code", False)),
        )
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(model_config.max_model_len)
        # the model runner building this proposer: where each row's request arguments are read
        self.requests = RunnerRequests.find()
        requests = None if self.requests is None else self.requests.request
        self.drafter = BatchDrafter(tokenizer, self.k, self.max_model_len, self.options, requests=requests)
        log.info(
            "codespec proposer: %s, K = %d, options %s, predictions %s",
            type(self).__name__,
            self.k,
            self.options.changed(),
            "read from each request's vllm_xargs" if self.requests else "unavailable (not built by a model runner)",
        )

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """vLLM asks every proposer to load its model; lookups have none."""

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """One draft per row of the batch (empty where the row does not decode this step)."""
        rows: list[Row | None] = []
        for index, sampled in enumerate(sampled_token_ids):
            length = int(num_tokens_no_spec[index])
            decoding = bool(sampled) and 0 < length < self.max_model_len
            rows.append(Row(token_ids_cpu[index, :length], len(sampled), index) if decoding else None)
        return self.drafter.step(rows)

    def stats(self) -> dict:
        return self.drafter.stats.summary()
