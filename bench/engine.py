"""codespec configurations: ``greedy`` (plain decoding) and each proposer, as a server runs them.

Lookups (context, reference, index) are built per request from the registry, with the request's
reference text (an edit's region; a completion has none, as in the server, except for the
``reference`` configuration itself), index document and cursor. Model proposers (draft model, early exit) are built once
per configuration and live across requests, as in ``codespec serve``; so does the ``auto`` policy's
state (acceptance by depth, cost fits): each request's ``AutoProposer`` gets fresh lookups, the
long-lived model proposers and the configuration's one ``PolicyState``. One configuration never
learns from another's requests. Session history is not fed: in replay every configuration emits
the same text, and history from one would hand the next the answer.

Model proposers get the raw target (``setup.target``), never the replay wrapper: early exit runs
the target's own first layers, and a draft told the recorded answer would fake its acceptance.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.measure import MemoryProbe, RunResult
from codespec.config import GenerationLimits, SamplingParams

CODESPEC_CONFIGS = ("greedy", "context", "reference", "index", "draft", "early-exit", "auto")
LOOKUPS = ("context", "reference", "index")
MODELS = ("draft", "early-exit")


class CodespecConfig:
    def __init__(self, name: str, raw_target, draft_path: str | None, index=None) -> None:
        if name not in CODESPEC_CONFIGS:
            raise ValueError(f"unknown codespec configuration {name!r}")
        self.name = name
        self.raw_target = raw_target
        self.index = index
        self.base_options: dict = {"draft_model": draft_path} if draft_path else {}
        self._models: list | None = None
        self._state = None  # auto's PolicyState, shared by this configuration's requests

    def models(self) -> list:
        """Long-lived model proposers: the draft model when one is configured, early exit when the
        target has a Llama-style layer stack (auto falls back on these; never on a shipped draft
        the run did not ask for)."""
        if self._models is None:
            from proposers.auto import model_proposers
            from proposers.registry import ProposerSetup

            wanted = [n for n in MODELS if self.name in (n, "auto")]
            setup = ProposerSetup.from_options(self.raw_target, {**self.base_options, "auto_candidates": wanted})
            self._models = model_proposers(setup, shipped_draft=False)
        return self._models

    def proposer(self, options: dict):
        from codespec.draft import NoDraft
        from proposers.registry import ProposerSetup, create_proposer

        if self.name == "greedy":
            return NoDraft()
        setup = ProposerSetup.from_options(self.raw_target, {**self.base_options, **options})
        if self.name in LOOKUPS:
            return create_proposer(self.name, setup)
        if self.name in MODELS:
            found = [p for p in self.models() if p.name == self.name]
            if not found:
                raise ValueError(
                    f"configuration {self.name!r} is unavailable for this target "
                    f"(draft needs --draft; early exit a Llama-style layer stack)"
                )
            return found[0]
        from proposers.auto import PolicyState, build_auto

        if self._state is None:
            self._state = PolicyState.fresh(setup.config.auto.policy)
        return build_auto(setup, self.models(), self._state)

    def policy_summary(self) -> dict | None:
        """auto's learned verification cost fit (ms = a + b k) and acceptance, for the report."""
        if self._state is None:
            return None
        from proposers.auto import cost_points

        fit = self._state.verify_cost.fit()
        plain = self._state.verify_cost.plain_measured
        curve = cost_points(self._state.verify_cost)
        return {
            "verify_fit_ms": None if fit is None else [round(fit[0] * 1e3, 3), round(fit[1] * 1e3, 4)],
            "plain_step_ms": None if plain is None else round(plain * 1e3, 3),
            "cost_curve_ms": None if curve is None else {str(k): round(s * 1e3, 2) for k, s in curve.items()},
        }

    def request_options(self, case) -> dict:
        """The proposer options of one request, as the server would set them. A completion carries
        no reference there (lsp/requests.completion_request), so auto gets none; the reference
        configuration alone is given the document, to show what a copy pointer at the cursor would do."""
        reference = case.reference if case.kind == "edit" or self.name == "reference" else None
        options = {
            "reference": reference,
            "reference_start": case.reference_start,
            "uri": case.uri,
            "cursor": case.cursor,
        }
        if self.index is not None:
            options["index"] = self.index
        return options

    def run(
        self,
        target,
        case,
        prompt_ids: Sequence[int],
        limits: GenerationLimits,
        sampling: SamplingParams,
        probe: MemoryProbe,
    ) -> RunResult:
        from bench.sim_run import case_document
        from codespec.decode import generate_all

        options = self.request_options(case)
        with case_document(self.index, case):
            proposer = self.proposer(options)
            probe.start()
            finished = generate_all(target, prompt_ids, proposer, sampling, limits)
            rss, cuda = probe.stop()
        return RunResult(tuple(finished.token_ids), finished.stats, rss, cuda, {"reason": finished.reason})
