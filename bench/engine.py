"""codespec configurations: ``greedy`` (plain decoding) and each proposer, as a server runs them.

Each configuration has its own ``proposers.assembly.ProposerAssembly``, the one the server uses:
lookups built per request with the inputs the server would give (``recorded_request``: an edit's
region as the reference; a completion none, except for the ``reference`` configuration itself),
model proposers (draft model, early exit) built once and living across requests, and the ``auto``
policy's state (acceptance by depth, cost fits) carried from request to request. One configuration
never learns from another's requests. Session history is not fed: in replay every configuration emits
the same text, and history from one would hand the next the answer.

Model proposers get the raw target (``setup.target``), never the replay wrapper: early exit runs
the target's own first layers, and a draft told the recorded answer would fake its acceptance.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.measure import MemoryProbe, RunResult
from codespec.core.config import GenerationLimits, SamplingParams
from codespec.proposers.registry import MODEL, PROPOSERS, proposer_names

CODESPEC_CONFIGS = ("greedy", *PROPOSERS)  # plain decoding, then each proposer of the registry
MODELS = proposer_names(MODEL)


class CodespecConfig:
    """One configuration's proposers, from ``proposers.assembly`` as the server builds them."""

    def __init__(self, name: str, raw_target, draft_path: str | None, index=None) -> None:
        from codespec.proposers.assembly import ProposerAssembly
        from codespec.proposers.setup import ProposerSetup

        if name not in CODESPEC_CONFIGS:
            raise ValueError(f"unknown codespec configuration {name!r}")
        self.name = name
        self.index = index
        config = ProposerSetup.from_options(raw_target, {"draft_model": draft_path} if draft_path else {}).config
        # The model proposers this configuration uses (auto falls back on these; never on a shipped
        # draft the run did not ask for); early exit when the target has a Llama-style layer stack.
        models = [model for model in MODELS if name in (model, "auto")]
        self.assembly = ProposerAssembly(raw_target, config, shipped_draft=False, models=models)

    def proposer(self, request):
        """The proposer of one request (a ``proposers.setup.RequestContext``); ``release`` it after."""
        return self.assembly.create("none" if self.name == "greedy" else self.name, request)

    def policy_summary(self) -> dict | None:
        """auto's learned verification cost fit (ms = a + b k) and acceptance, for the report."""
        states = self.assembly.policy_states()
        if not states:
            return None
        from codespec.proposers.costs import cost_points

        state = states[-1]
        fit = state.verify_cost.fit()
        plain = state.verify_cost.plain_measured
        curve = cost_points(state.verify_cost)
        return {
            "verify_fit_ms": None if fit is None else [round(fit[0] * 1e3, 3), round(fit[1] * 1e3, 4)],
            "plain_step_ms": None if plain is None else round(plain * 1e3, 3),
            "cost_curve_ms": None if curve is None else {str(k): round(s * 1e3, 2) for k, s in curve.items()},
        }

    def request_context(self, case):
        """The proposers' inputs of one request, as the server would give them (``recorded_request``)."""
        from codespec.proposers.assembly import recorded_request

        return recorded_request(
            self.name, case.kind == "edit", case.reference, case.reference_start, case.uri, case.cursor, self.index
        )

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
        from codespec.core.decode import generate_all

        with case_document(self.index, case):
            proposer = self.proposer(self.request_context(case))
            try:
                probe.start()
                finished = generate_all(target, prompt_ids, proposer, sampling, limits)
                rss, cuda = probe.stop()
            finally:
                self.assembly.release(proposer)
        return RunResult(tuple(finished.token_ids), finished.stats, rss, cuda, {"reason": finished.reason})
