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
That swap is a temporary change to the target, so it lives in the target's ``first_layers`` (the
``codespec.target.LayeredTarget`` capability; ``codespec.model.truncated_layers`` for transformers:
a context manager that restores the full stack also when the forward raises). The drafter keeps its own
KV cache, built from the full config, of which only the first E layers are ever written.
The target must not be run by another thread while a draft is being made (the engine is
sequential per model).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from codespec.core.errors import CodespecError
from codespec.core.target import Cache, LayeredTarget
from codespec.proposers.draft_model import ModelDrafter
from codespec.proposers.setup import ProposerSetup


def default_exit_layer(num_layers: int) -> int:
    """A quarter of the depth (at least 1): cheap enough that modest acceptance pays."""
    return max(1, num_layers // 4)


class EarlyExitProposer(ModelDrafter):
    name = "early-exit"

    def __init__(self, target, exit_layer: int | None = None, min_confidence: float = 0.0) -> None:
        if not isinstance(target, LayeredTarget) or target.num_layers < 2:
            raise CodespecError(
                "early exit needs a target whose first layers can run alone (a Llama-style layer stack)"
            )
        num_layers = target.num_layers
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

    def _new_cache(self) -> Cache:
        return self.target.new_cache()  # only layers [0, E) are written

    def _drafting(self):
        return self.target.first_layers(self.exit_layer)

    def _forward(self, input_ids: Sequence[int], cache: Cache) -> torch.Tensor:
        return self.target.forward(input_ids, cache, keep_last=1)[0]  # [V]
