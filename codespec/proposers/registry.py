"""Proposers by name: one static table of names (``proposers.names``) and the classes they build.

Classes are imported when a proposer is built, not when the table is read, so listing the names
(``codespec --help``) stays free of torch. ``none`` (plain decoding) is the engine's ``NoDraft``.
Every class builds itself with ``from_setup(setup)`` (``ProposerFactory``): the target, the
request's inputs and its own settings (``proposers.setup``).
"""

from __future__ import annotations

from typing import Protocol

from codespec.core.draft import NoDraft, Proposer
from codespec.core.errors import CodespecError
from codespec.proposers.names import LOOKUP, MODEL, POLICY, PROPOSERS, proposer_names
from codespec.proposers.setup import ProposerSetup, RequestContext

__all__ = [
    "LOOKUP",
    "MODEL",
    "POLICY",
    "PROPOSERS",
    "ProposerSetup",
    "RequestContext",
    "available_proposers",
    "create_proposer",
    "proposer_names",
]


class ProposerFactory(Protocol):
    @classmethod
    def from_setup(cls, setup: ProposerSetup) -> Proposer: ...


def available_proposers() -> list[str]:
    return sorted({"none", *PROPOSERS})


def proposer_class(name: str) -> ProposerFactory:
    if name not in PROPOSERS:
        raise CodespecError(f"unknown proposer {name!r}; available: {', '.join(available_proposers())}")
    return _classes()[name]


def _classes() -> dict[str, ProposerFactory]:
    from codespec.proposers.auto import AutoProposer
    from codespec.proposers.context import ContextLookup
    from codespec.proposers.draft_model import DraftModelProposer
    from codespec.proposers.early_exit import EarlyExitProposer
    from codespec.proposers.index_lookup import IndexLookup
    from codespec.proposers.next_edit import NextEditLookup
    from codespec.proposers.reference import ReferenceLookup

    classes: dict[str, ProposerFactory] = {
        "context": ContextLookup,
        "reference": ReferenceLookup,
        "index": IndexLookup,
        "next-edit": NextEditLookup,
        "draft": DraftModelProposer,
        "early-exit": EarlyExitProposer,
        "auto": AutoProposer,
    }
    assert classes.keys() == PROPOSERS.keys()
    return classes


def create_proposer(name: str, setup: ProposerSetup | None = None) -> Proposer:
    if name == "none":
        return NoDraft()
    return proposer_class(name).from_setup(setup or ProposerSetup())
