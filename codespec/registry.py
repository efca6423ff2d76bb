"""Proposers by name. Implementations are plugins (entry point group ``codespec.proposers``), so the
engine never imports ``proposers/``; ``none`` (plain decoding) is built in.

A plugin is a class; if it has ``from_setup(setup)`` that builds it, else it is called with no
arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from importlib.metadata import entry_points
from typing import Any

from codespec.draft import NoDraft, Proposer
from codespec.errors import CodespecError

GROUP = "codespec.proposers"


@dataclass
class ProposerSetup:
    """What a proposer may need to build itself: the target, and proposer-specific options."""

    target: Any = None  # codespec.model.TargetModel
    options: dict = field(default_factory=dict)  # e.g. {"max_ngram": 8, "draft_model": "..."}


@lru_cache(maxsize=1)
def _plugins() -> dict[str, Any]:
    """Scanning installed distributions costs ~10 ms: do it once per process."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def available_proposers() -> list[str]:
    return sorted({"none", *_plugins()})


def create_proposer(name: str, setup: ProposerSetup | None = None) -> Proposer:
    if name == "none":
        return NoDraft()
    entry_point = _plugins().get(name)
    if entry_point is None:
        raise CodespecError(
            f"unknown proposer {name!r}; available: {', '.join(available_proposers())} "
            f"(proposers are registered when codespec is installed, e.g. pip install -e .)"
        )
    factory = entry_point.load()
    setup = setup or ProposerSetup()
    return factory.from_setup(setup) if hasattr(factory, "from_setup") else factory()
