"""Proposers put together for one request: the one place the engine service, ``codespec bench`` and
``codespec simulate`` assemble them, so each measures what the server runs (docs/architecture.md).

A request's lookups depend on the request (its reference text, its document and cursor for the
index), so they are built per request from the registry. The model proposers (draft model, early
exit) are costly to build (a draft model is loaded from disk) and keep per-request state (a draft KV
cache), so they live as long as the assembly and serve one request at a time. The ``auto`` policy's
statistics are what make later requests start informed: one :class:`PolicyState` per assembly and
candidate set (a server has one assembly; each bench configuration its own, so one configuration
never learns from another's requests).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from codespec.core.draft import Proposer
from codespec.core.errors import CodespecError
from codespec.proposers.auto import build_auto
from codespec.proposers.models import model_proposers
from codespec.proposers.policy import PolicyState
from codespec.proposers.registry import MODEL, create_proposer, proposer_names
from codespec.proposers.setup import ProposerConfig, ProposerSetup, RequestContext

log = logging.getLogger(__name__)

MODEL_NAMES = proposer_names(MODEL)


class ProposerAssembly:
    """Builds the proposer a request asks for, sharing what lives across requests.

    ``shipped_draft``: auto may fall back on the shipped draft model when it fits the target (the
    server); a benchmark that did not ask for one passes False. ``models``: the model proposers to
    build (None: every one the target supports).
    """

    def __init__(
        self,
        target,
        config: ProposerConfig | None = None,
        *,
        shipped_draft: bool = True,
        models: Sequence[str] | None = None,
    ) -> None:
        self.base = ProposerSetup(target, config=config or ProposerConfig())
        self.shipped_draft = shipped_draft
        self.model_names = tuple(MODEL_NAMES if models is None else models)
        self._models: list[Proposer] | None = None  # long-lived model proposers, built on first use
        self._models_owner: Proposer | None = None  # the request proposer now using them
        self._states: dict[tuple, PolicyState] = {}  # auto's statistics, by candidate set
        self._warned: set[str] = set()

    def create(self, name: str, request: RequestContext = RequestContext()) -> Proposer:
        """The proposer ``name`` ("none" for plain decoding) for one request."""
        setup = self.base.for_request(request)
        if name == "auto":
            # Model proposers keep per-request state (a draft KV cache): one request at a time uses them.
            models = self.models() if self._models_owner is None else []
            auto = build_auto(setup, models, states=self._states)
            if models:
                self._models_owner = auto
            return auto
        if name in MODEL_NAMES:
            shared = next((p for p in self.models() if p.name == name), None)
            if shared is None:
                raise CodespecError(
                    f"proposer {name!r} is unavailable for this target "
                    "(a draft needs a draft model; early exit a Llama-style layer stack)"
                )
            if self._models_owner is None:
                self._models_owner = shared
                return shared
        return create_proposer(name, setup)

    def create_with_fallback(self, names: Sequence[str], request: RequestContext) -> Proposer:
        """The first of ``names`` that can be built (a missing draft model, an option a proposer
        lacks: degrade and say so once), ending at plain decoding."""
        for name in dict.fromkeys([*names, "none"]):
            try:
                return self.create(name, request)
            except Exception as error:
                self._warn(name, error)
        raise CodespecError("no proposer could be created")

    def release(self, proposer: Proposer | None) -> None:
        """The request using ``proposer`` is over: the model proposers are free again."""
        if proposer is not None and proposer is self._models_owner:
            self._models_owner = None

    def models(self) -> list[Proposer]:
        """The long-lived model proposers (an unavailable one is left out, with a warning)."""
        if self._models is None:
            try:
                built = model_proposers(self.base, shipped_draft=self.shipped_draft, names=self.model_names)
            except Exception as error:  # a missing or incompatible draft model: lookups still work
                self._warn("draft", error)
                built = []
            self._models = built
        return self._models

    def policy_states(self) -> list[PolicyState]:
        """auto's statistics, one per candidate set it ran with (for reports)."""
        return list(self._states.values())

    def _warn(self, name: str, error: Exception) -> None:
        if name not in self._warned:
            self._warned.add(name)
            log.warning("proposer %r unavailable (%s); falling back", name, error)


def recorded_request(
    proposer: str,
    rewrite: bool,
    reference: str | None,
    reference_start: int = 0,
    uri: str | None = None,
    cursor: int | None = None,
    index=None,
) -> RequestContext:
    """What the server hands the proposers for a recorded request (bench, simulate): a rewrite's
    region is its reference; a completion has none (the server gives one only while the user types
    along a suggestion it showed, which a recording does not hold). The ``reference`` proposer asked
    by name alone is given a completion's document, to show what a copy pointer at the cursor would do.
    """
    if not rewrite and proposer != "reference":
        reference = None
    return RequestContext(reference, reference_start if reference is not None else 0, index, uri, cursor)
