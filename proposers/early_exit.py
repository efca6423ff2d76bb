"""Early exit (self-speculation, LayerSkip-style): the target's first E layers + final norm + LM head.

No second model to ship or load: drafting costs about E/L of a target forward per token and shares
the target's vocabulary by construction. Acceptance depends on how well layer E's hidden state
already predicts the output (models trained with an early-exit loss do well; others less so; the
policy measures it and switches it off when it does not pay).

How: transformers' Llama, Qwen2 and Starcoder2 run ``self.layers[: config.num_hidden_layers]``
(Qwen2 picks each layer's mask from ``config.layer_types[i]``, right for the first E too), so
swapping in a ModuleList of the first E layers makes the normal forward compute exactly "E layers,
final norm, head", the head being the embedding matrix where it is tied (Qwen2.5-Coder up to 3B,
StarCoder2). Tested per family layout in tests/families (docs/families.md).
That swap is a temporary change to the target, so it lives in ``truncated_layers`` (a context
manager that restores the full stack also when the forward raises). The drafter keeps its own
KV cache, built from the full config, of which only the first E layers are ever written.
The target must not be run by another thread while a draft is being made (the engine is
sequential per model).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from codespec.errors import CodespecError
from codespec.kv import KVCache
from proposers.draft_model import ModelDrafter
from proposers.setup import ProposerSetup


def decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder layer stack of a Llama-style causal LM (``model.model.layers``)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise CodespecError(
            f"early exit needs a Llama-style model with model.model.layers; {type(model).__name__} has none"
        )
    return layers


@contextlib.contextmanager
def truncated_layers(model, exit_layer: int) -> Iterator[None]:
    """Run ``model`` with only its first ``exit_layer`` decoder layers; restore them on any exit."""
    full = decoder_layers(model)
    if not 1 <= exit_layer <= len(full):
        raise ValueError(f"exit layer must be in [1, {len(full)}], got {exit_layer}")
    model.model.layers = torch.nn.ModuleList(list(full)[:exit_layer])
    try:
        yield
    finally:
        model.model.layers = full


def default_exit_layer(num_layers: int) -> int:
    """A quarter of the depth (at least 1): cheap enough that modest acceptance pays."""
    return max(1, num_layers // 4)


class EarlyExitProposer(ModelDrafter):
    name = "early-exit"

    def __init__(self, target, exit_layer: int | None = None, min_confidence: float = 0.0) -> None:
        num_layers = len(decoder_layers(target.model))
        exit_layer = default_exit_layer(num_layers) if exit_layer is None else int(exit_layer)
        if not 1 <= exit_layer < num_layers:
            raise CodespecError(
                f"exit layer must be in [1, {num_layers - 1}] for this {num_layers}-layer target, got {exit_layer}"
            )
        super().__init__(target.vocab_size, target.max_context, min_confidence)
        self.target = target
        self.exit_layer = exit_layer

    @classmethod
    def from_setup(cls, setup: ProposerSetup) -> EarlyExitProposer:
        if setup.target is None:
            raise CodespecError("the early-exit proposer drafts with the target's own layers: it needs the target")
        config = setup.config.early_exit
        return cls(setup.target, config.exit_layer, config.min_confidence)

    def _new_cache(self) -> KVCache:
        return self.target.new_cache()  # only layers [0, E) are written

    def _drafting(self):
        return truncated_layers(self.target.model, self.exit_layer)

    def _forward(self, input_ids: Sequence[int], cache: KVCache) -> torch.Tensor:
        return self.target.forward(input_ids, cache, keep_last=1)[0]  # [V]
