"""Proposers for a long-running server: per-request lookups, long-lived models and policy state.

A request's lookups depend on the request (its reference text, its document and cursor for the
index), so they are built per request. The model proposers (draft model, early exit) are costly
to build (a draft model is loaded from disk) and the ``auto`` policy's statistics are what make
later requests start informed, so both live as long as the server: each request's ``auto``
proposer is ``proposers.auto.build_auto`` over fresh lookups plus the shared models, with the
shared policy state.
"""

from __future__ import annotations

import logging

from codespec.draft import Proposer
from proposers.auto import build_auto, model_proposers
from proposers.registry import ProposerSetup, RequestContext, create_proposer
from proposers.setup import ProposerConfig

log = logging.getLogger(__name__)


class ProposerFactory:
    def __init__(self, target, config: ProposerConfig | None = None) -> None:
        self.base = ProposerSetup(target, config=config or ProposerConfig())
        self._models: list[Proposer] | None = None  # long-lived model proposers, built on first use
        self._warned: set[str] = set()
        self._models_owner: Proposer | None = None  # the request proposer currently using the model proposers

    def create(self, name: str, request: RequestContext) -> Proposer:
        """The proposer ``name`` for one request."""
        setup = self.base.for_request(request)
        if name == "auto":
            # Model proposers keep per-request state (a draft KV cache): one request at a time uses them.
            models = self._model_proposers() if self._models_owner is None else []
            auto = build_auto(setup, models)
            if models:
                self._models_owner = auto
            return auto
        if name in ("draft", "early-exit") and self._models_owner is None:
            shared = next((p for p in self._model_proposers() if p.name == name), None)
            if shared is not None:
                self._models_owner = shared
                return shared
        return create_proposer(name, setup)

    def release(self, proposer) -> None:
        """The request using ``proposer`` is over."""
        if proposer is not None and proposer is self._models_owner:
            self._models_owner = None

    def _model_proposers(self) -> list[Proposer]:
        if self._models is None:
            try:
                self._models = model_proposers(self.base)
            except Exception as error:  # a missing or incompatible draft model: lookups still work
                self._warn("draft", error)
                self._models = []
        return self._models

    def _warn(self, name: str, error: Exception) -> None:
        if name not in self._warned:
            self._warned.add(name)
            log.warning("proposer %r unavailable (%s); continuing without it", name, error)
