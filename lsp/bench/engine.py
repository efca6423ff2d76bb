"""codespec configurations: ``greedy`` (plain decoding) and each proposer, as a server runs them.

Proposers come from the servers' ``ProposerFactory``: lookups are built per request (the request's
reference, index document and cursor), model proposers and the ``auto`` policy's statistics live
for the whole run, exactly as in ``codespec serve``. Each configuration has its own factory, so
one configuration's policy never learns from another's requests. Session history is not fed:
in replay every configuration emits the same text, and history from one would hand the next the
answer.
"""

from __future__ import annotations

from typing import Sequence

from codespec.config import GenerationLimits, SamplingParams
from lsp.bench.measure import MemoryProbe, RunResult

CODESPEC_CONFIGS = ("greedy", "context", "reference", "index", "draft", "early-exit", "auto")
PROPOSER_OF = {"greedy": "none"}


class CodespecConfig:
    def __init__(self, name: str, raw_target, draft_path: str | None, index=None,
                 candidates: Sequence[str] | None = None) -> None:
        from lsp.proposing import ProposerFactory

        self.name = name
        self.proposer_name = PROPOSER_OF.get(name, name)
        self.index = index
        options: dict = {}
        if draft_path is not None:
            options["draft_model"] = draft_path
        if candidates is not None:
            options["auto_candidates"] = list(candidates)
        # The raw target: a model proposer (early exit) must not see the replay bias.
        self.factory = ProposerFactory(raw_target, options)
        if draft_path is None:
            self.factory._models = self._models_without_draft(raw_target)

    @staticmethod
    def _models_without_draft(raw_target) -> list:
        """No draft model configured: auto falls back on early exit only (never on a shipped draft
        that the run did not ask for)."""
        from codespec.registry import ProposerSetup, create_proposer
        from proposers.auto import _supports_early_exit

        if not _supports_early_exit(raw_target):
            return []
        return [create_proposer("early-exit", ProposerSetup(raw_target, {}))]

    def run(self, target, case, prompt_ids: Sequence[int], limits: GenerationLimits,
            sampling: SamplingParams, probe: MemoryProbe) -> RunResult:
        from codespec.decode import generate_all
        from proposers.sim_run import case_document

        options = {"reference": case.reference, "reference_start": case.reference_start,
                   "uri": case.uri, "cursor": case.cursor}
        if self.index is not None:
            options["index"] = self.index
        with case_document(self.index, case):
            proposer = self.factory.create(self.proposer_name, options)
            probe.start()
            try:
                finished = generate_all(target, prompt_ids, proposer, sampling, limits)
            finally:
                self.factory.release(proposer)
            rss, cuda = probe.stop()
        return RunResult(tuple(finished.token_ids), finished.stats, rss, cuda, {"reason": finished.reason})
