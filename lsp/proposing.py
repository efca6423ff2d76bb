"""Proposers for a long-running server: per-request lookups, long-lived models and policy state.

A request's lookups depend on the request (its reference text, its document and cursor for the
index), so they are built per request. The model proposers (draft model, early exit) are costly
to build (a draft model is loaded from disk) and the ``auto`` policy's statistics are what make
later requests start informed, so both live as long as the server: each request's ``auto``
proposer is assembled from fresh lookups plus the shared models, with the shared policy state.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def _create(name: str, setup):
    from proposers.registry import create_proposer  # looks plugins up once per process

    return create_proposer(name, setup)


class ProposerFactory:
    def __init__(self, target, base_options: dict | None = None) -> None:
        self.target = target
        self.base_options = dict(base_options or {})
        self._models: list | None = None  # long-lived model proposers, built on first use
        self._warned: set[str] = set()
        self._models_owner = None  # the request proposer currently using the model proposers

    def create(self, name: str, options: dict):
        """The proposer ``name`` for one request (``options``: reference, index, uri, cursor)."""
        from proposers.registry import ProposerSetup

        merged = {**self.base_options, **options}
        if name == "auto":
            return self._auto(merged)
        if name in ("draft", "early-exit") and self._models_owner is None:
            shared = next((p for p in self._model_proposers() if p.name == name), None)
            if shared is not None:
                self._models_owner = shared
                return shared
        return _create(name, ProposerSetup(self.target, merged))

    def release(self, proposer) -> None:
        """The request using ``proposer`` is over."""
        if proposer is not None and proposer is self._models_owner:
            self._models_owner = None

    def _auto(self, options: dict):
        from proposers import auto as auto_module
        from proposers.registry import ProposerSetup

        setup = ProposerSetup(self.target, options)
        lookups = [_create("context", setup)]
        for name in ("reference", "index"):
            if options.get(name) is not None:
                try:
                    lookups.append(_create(name, setup))
                except Exception as error:  # e.g. not installed yet: draft without it
                    self._warn(name, error)
        # Model proposers keep per-request state (a draft KV cache): one request at a time uses them.
        models = self._model_proposers() if self._models_owner is None else []
        config = auto_module.PolicyConfig(**options.get("policy", {}))
        # The policy's statistics are shared by every auto with the same candidates (as auto's own
        # from_setup does), so later requests start informed.
        state = auto_module.shared_state(self.target, [*lookups, *models], config)
        auto = auto_module.AutoProposer(lookups, models, config, state)
        if models:
            self._models_owner = auto
        return auto

    def _model_proposers(self) -> list:
        if self._models is None:
            from proposers.auto import draft_for_auto, supports_early_exit
            from proposers.registry import ProposerSetup

            self._models = []
            setup = ProposerSetup(self.target, self.base_options)
            try:
                draft = draft_for_auto(setup)
                if draft is not None:
                    self._models.append(draft)
            except Exception as error:  # a missing or incompatible draft model: lookups still work
                self._warn("draft", error)
            if supports_early_exit(self.target):
                try:
                    self._models.append(_create("early-exit", setup))
                except Exception as error:
                    self._warn("early-exit", error)
        return self._models

    def _warn(self, name: str, error: Exception) -> None:
        if name not in self._warned:
            self._warned.add(name)
            log.warning("proposer %r unavailable (%s); continuing without it", name, error)
