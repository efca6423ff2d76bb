"""The ``Target`` contract: what the engine, the proposers, the service and bench need of the
model that verifies drafts (docs/architecture.md, "The Target contract").

``codespec.model.TargetModel`` (transformers) is the one backend today; bench's ``ReplayTarget``
and ``TimedTarget`` wrap one. A backend that is not transformers (llama.cpp, a served engine)
implements these members and plugs in without the service or the proposers changing. Everything
here is structural (``typing.Protocol``): a backend does not import or subclass anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from codespec.core.prompts import PromptFormat


@runtime_checkable
class Cache(Protocol):
    """One sequence's KV state and the token ids it covers (``codespec.model.KVCache``, ``codespec.llama_cpp_target.LlamaCache``).

    The invariant every backend keeps: the state is exactly what a fresh prefill of ``token_ids``
    would give, so ``rollback(n)`` followed by a forward equals prefilling ``token_ids[:n]`` then
    that forward (docs/design.md §2).
    """

    token_ids: list[int]

    def __len__(self) -> int: ...

    def rollback(self, length: int) -> None:
        """Keep the first ``length`` positions, drop the rest."""
        ...

    def reset(self) -> None: ...


def common_prefix_len(left: Sequence[int], right: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    limit = min(len(left), len(right))
    index = 0
    while index < limit and left[index] == right[index]:
        index += 1
    return index


@runtime_checkable
class Target(Protocol):
    """A causal LM behind the few calls speculative decoding needs."""

    name: str
    tokenizer: Any  # a transformers tokenizer (prompt formats read its special tokens)
    prompt_format: PromptFormat  # how this family spells FIM and rewrites (codespec.prompts)
    max_context: int  # positions a sequence may hold, prompt and output together
    vocab_size: int  # rows of the logits (may exceed the tokenizer's vocabulary)
    eos_token_ids: frozenset[int]
    device: torch.device  # where logits live (sampling generators are made for it)

    @property
    def parameter_count(self) -> int:
        """The model's weights (0 where unknown): CPU prompt chunks and windows follow it."""
        ...

    @property
    def kv_capacity(self) -> int | None:
        """KV cells all sequences share (a fixed buffer: llama.cpp); None where caches grow."""
        ...

    @property
    def threads(self) -> int | None:
        """CPU threads the backend runs on (a draft model beside it takes the same); None: torch's."""
        ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def new_cache(self) -> Cache: ...

    def forward(self, input_ids: Sequence[int], cache: Any, keep_last: int = 1) -> torch.Tensor:
        """Run ``input_ids`` after what ``cache`` holds (and record them in it); return float32
        logits [keep_last, V]: row i scores the token after input position T - keep_last + i."""
        ...

    def forward_many(
        self, inputs: Sequence[Sequence[int]], caches: Sequence[Any], keep_last: Sequence[int]
    ) -> list[torch.Tensor]:
        """``forward`` for several sequences in one scheduler cycle: item i is what
        ``forward(inputs[i], caches[i], keep_last[i])`` returns. A backend may batch them."""
        ...


@runtime_checkable
class LayeredTarget(Target, Protocol):
    """A target whose first layers can run alone: early exit drafts with them (self-speculation)."""

    @property
    def num_layers(self) -> int: ...

    def first_layers(self, count: int) -> AbstractContextManager[None]:
        """While entered, ``forward`` runs only the first ``count`` layers, then the final norm and head."""
        ...


def forward_each(
    target: Target, inputs: Sequence[Sequence[int]], caches: Sequence[Any], keep_last: Sequence[int]
) -> list[torch.Tensor]:
    """``forward_many`` as one forward per sequence: a backend with no batched kernel uses this."""
    if not len(inputs) == len(caches) == len(keep_last):
        raise ValueError(f"forward_many got {len(inputs)} inputs, {len(caches)} caches, {len(keep_last)} keep_last")
    return [target.forward(ids, cache, keep) for ids, cache, keep in zip(inputs, caches, keep_last, strict=True)]


@dataclass
class TokenizerTarget:
    """What a lookup proposer's ``from_setup`` reads from a target, without the model (model-free
    replay in bench; codespec's proposer inside vLLM, where vLLM runs the model)."""

    tokenizer: Any
    name: str = "tokenizer-only"

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, token_ids) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return frozenset() if eos is None else frozenset([eos])
