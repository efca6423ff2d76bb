"""Proposers by name: one static table, so a reader's trail goes from a name straight to its class.

Classes are imported when a proposer is built, not when the table is read, so listing the names
(``codespec --help``) stays free of torch. ``none`` (plain decoding) is the engine's ``NoDraft``.
A class with ``from_setup(setup)`` builds itself from the setup; any other is called with no
arguments.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from codespec.draft import NoDraft, Proposer
from codespec.errors import CodespecError

# name -> (module, class)
PROPOSERS: dict[str, tuple[str, str]] = {
    "context": ("proposers.context", "ContextLookup"),
    "reference": ("proposers.reference", "ReferenceLookup"),
    "index": ("proposers.index_lookup", "IndexLookup"),
    "draft": ("proposers.draft_model", "DraftModelProposer"),
    "early-exit": ("proposers.early_exit", "EarlyExitProposer"),
    "auto": ("proposers.auto", "AutoProposer"),
}


@dataclass
class ProposerSetup:
    """What a proposer may need to build itself: the target, and proposer-specific options."""

    target: Any = None  # codespec.model.TargetModel
    options: dict = field(default_factory=dict)  # e.g. {"max_ngram": 8, "draft_model": "..."}


def available_proposers() -> list[str]:
    return sorted({"none", *PROPOSERS})


def proposer_class(name: str) -> type:
    if name not in PROPOSERS:
        raise CodespecError(f"unknown proposer {name!r}; available: {', '.join(available_proposers())}")
    module, attribute = PROPOSERS[name]
    return getattr(importlib.import_module(module), attribute)


def create_proposer(name: str, setup: ProposerSetup | None = None) -> Proposer:
    if name == "none":
        return NoDraft()
    factory = proposer_class(name)
    setup = setup or ProposerSetup()
    return factory.from_setup(setup) if hasattr(factory, "from_setup") else factory()
