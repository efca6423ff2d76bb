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

__all__ = [
    "PROPOSERS",
    "ProposerSetup",
    "RequestContext",
    "available_proposers",
    "create_proposer",
    "proposer_names",
]

LOOKUP, MODEL, POLICY = "lookup", "model", "policy"  # built per request; long-lived; picks among them

# name -> (module, class, kind): the one list of proposer names
PROPOSERS: dict[str, tuple[str, str, str]] = {
    "context": ("proposers.context", "ContextLookup", LOOKUP),
    "reference": ("proposers.reference", "ReferenceLookup", LOOKUP),
    "index": ("proposers.index_lookup", "IndexLookup", LOOKUP),
    "next-edit": ("proposers.next_edit", "NextEditLookup", LOOKUP),
    "draft": ("proposers.draft_model", "DraftModelProposer", MODEL),
    "early-exit": ("proposers.early_exit", "EarlyExitProposer", MODEL),
    "auto": ("proposers.auto", "AutoProposer", POLICY),
}


class ProposerFactory(Protocol):
    @classmethod
    def from_setup(cls, setup: ProposerSetup) -> Proposer: ...


def available_proposers() -> list[str]:
    return sorted({"none", *PROPOSERS})


def proposer_names(kind: str) -> tuple[str, ...]:
    """The proposers of one kind (``LOOKUP``, ``MODEL``, ``POLICY``), in table order."""
    return tuple(name for name, (_, _, of_kind) in PROPOSERS.items() if of_kind == kind)


def proposer_class(name: str) -> ProposerFactory:
    if name not in PROPOSERS:
        raise CodespecError(f"unknown proposer {name!r}; available: {', '.join(available_proposers())}")
    module, attribute, _ = PROPOSERS[name]
    return getattr(importlib.import_module(module), attribute)


def create_proposer(name: str, setup: ProposerSetup | None = None) -> Proposer:
    if name == "none":
        return NoDraft()
    return proposer_class(name).from_setup(setup or ProposerSetup())
