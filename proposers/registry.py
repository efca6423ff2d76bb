"""Proposers by name: one static table, so a reader's trail goes from a name straight to its class.

Classes are imported when a proposer is built, not when the table is read, so listing the names
(``codespec --help``) stays free of torch. ``none`` (plain decoding) is the engine's ``NoDraft``.
Every class builds itself with ``from_setup(setup)`` (``ProposerFactory``): the target, the
request's inputs and its own settings (``proposers.setup``).
"""

from __future__ import annotations

import importlib
from typing import Protocol

from codespec.draft import NoDraft, Proposer
from codespec.errors import CodespecError
from proposers.setup import ProposerSetup, RequestContext

__all__ = ["PROPOSERS", "ProposerSetup", "RequestContext", "available_proposers", "create_proposer"]

# name -> (module, class)
PROPOSERS: dict[str, tuple[str, str]] = {
    "context": ("proposers.context", "ContextLookup"),
    "reference": ("proposers.reference", "ReferenceLookup"),
    "index": ("proposers.index_lookup", "IndexLookup"),
    "draft": ("proposers.draft_model", "DraftModelProposer"),
    "early-exit": ("proposers.early_exit", "EarlyExitProposer"),
    "auto": ("proposers.auto", "AutoProposer"),
}


class ProposerFactory(Protocol):
    @classmethod
    def from_setup(cls, setup: ProposerSetup) -> Proposer: ...


def available_proposers() -> list[str]:
    return sorted({"none", *PROPOSERS})


def proposer_class(name: str) -> ProposerFactory:
    if name not in PROPOSERS:
        raise CodespecError(f"unknown proposer {name!r}; available: {', '.join(available_proposers())}")
    module, attribute = PROPOSERS[name]
    return getattr(importlib.import_module(module), attribute)


def create_proposer(name: str, setup: ProposerSetup | None = None) -> Proposer:
    if name == "none":
        return NoDraft()
    return proposer_class(name).from_setup(setup or ProposerSetup())
