"""The model proposers ``auto`` may fall back on: the draft model that fits the target, and early
exit where the target has a Llama-style layer stack (docs/design.md). Built once per assembly
(``proposers.assembly``) and shared by its requests, one at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from codespec.core.draft import Proposer
from codespec.core.errors import CodespecError
from codespec.core.target import LayeredTarget
from codespec.proposers import draft_model
from codespec.proposers.early_exit import EarlyExitProposer
from codespec.proposers.names import MODEL, proposer_names
from codespec.proposers.setup import ProposerSetup

log = logging.getLogger(__name__)


def model_proposers(
    setup: ProposerSetup, shipped_draft: bool = True, names: Sequence[str] = proposer_names(MODEL)
) -> list[Proposer]:
    """The draft model (the configured one; else, with ``shipped_draft``, the shipped one when it fits
    the target) and early exit (a Llama-style layer stack), of ``names``; none for a tokenizer-only
    target."""
    if not _is_model_target(setup.target):  # model-free simulate
        return []
    wanted = [name for name in names if setup.config.auto.candidates is None or name in setup.config.auto.candidates]
    models: list[Proposer] = []
    if "draft" in wanted:
        draft = draft_for_auto(setup) if shipped_draft or setup.config.draft.path else None
        if draft is not None:
            models.append(draft)
    if "early-exit" in wanted:
        if supports_early_exit(setup.target):
            models.append(EarlyExitProposer.from_setup(setup))
        else:  # said once per assembly: the model proposers are built once per assembly
            log.info(
                "auto: no early exit for %s (its backend cannot run the first layers alone)",
                getattr(setup.target, "name", "this target"),
            )
    return models


def _is_model_target(target) -> bool:
    return target is not None and hasattr(target, "new_cache") and hasattr(target, "forward")


def draft_for_auto(setup) -> Proposer | None:
    """A draft model named in the options (errors are the user's to see), else the shipped one if it
    shares the target's tokenizer (a different target simply runs without it)."""
    if setup.config.draft.path:
        return draft_model.DraftModelProposer.from_setup(setup)
    if draft_model.default_draft_path() is None:  # looked up on the module: tests replace it
        return None
    try:
        return draft_model.DraftModelProposer.from_setup(setup)
    except CodespecError as error:
        log.info("auto: the shipped draft model does not fit this target (%s)", error)
        return None


def supports_early_exit(target) -> bool:
    return isinstance(target, LayeredTarget) and target.num_layers >= 2
