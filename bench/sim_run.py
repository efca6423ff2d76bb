"""One simulation run: every case through every named proposer and the hf-rule baseline.

Each proposer is built per case by ``proposers.assembly``, the server's own assembly, with what
the server would give that request (``recorded_request``: an edit's region as the reference, a
completion none; the index, the document uri and cursor), so what is measured is the installed
proposer, not a copy of it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from bench.hf_rule import PromptLookupRule
from bench.sim_names import BASELINE, LOOKUP_PROPOSERS
from bench.sim_workload import SimCase
from codespec.core.errors import CodespecError
from codespec.core.prompts import PromptRenderer, detect_format
from codespec.core.stats import RequestStats, json_safe, percentile
from codespec.core.target import TokenizerTarget
from codespec.proposers.assembly import ProposerAssembly, recorded_request
from codespec.proposers.lookup_sim import ceiling_forwards, hindsight_forwards, replay
from codespec.proposers.registry import ProposerSetup
from codespec.proposers.token_bytes import TokenBytes

INDEX_USERS = ("index", "auto")


def simulate_workload(
    cases: Sequence[SimCase],
    names: Sequence[str],
    tokenizer,
    max_draft: int,
    workspace: Sequence[tuple[str, str]] = (),
    workload: str = "workload",
    verify_cost: tuple[float, float] = (0.0, 0.0),
    extras: dict | None = None,
    bounds: dict | None = None,
) -> dict:
    """The report of `codespec simulate --json` (keys fixed by issue 4). What the JSON leaves out
    goes to the dicts given: ``extras`` per proposer (rejected draft tokens per output token),
    ``bounds`` the hindsight bound of edit records (``hindsight_tokens_per_forward``)."""
    codec = TokenBytes(tokenizer)
    prompts = prompt_renderer(codec.tokenizer)
    streams = [(case, codec.encode(case_prompt(case, prompts)), codec.encode(case.output)) for case in cases]
    target = TokenizerTarget(codec.tokenizer)
    index = build_index(codec.tokenizer, workspace) if any(name in INDEX_USERS for name in names) else None
    if index is not None:  # which bulk-encoding path the index took (index.tokens), on stderr
        adapter = index.adapter
        print(
            f"[index] {len(workspace)} workspace files; bulk encoding: {adapter.encoding} "
            f"({adapter.encoding_reason}); {adapter.dtype.name} token arrays",
            file=sys.stderr,
        )
    rows = {}
    for name in [*[n for n in names if n != BASELINE], BASELINE]:
        stats = RequestStats()
        assembly = assembly_for(target, index)  # auto learns across this run's cases, as a server does
        for case, prompt_ids, output_ids in streams:
            with case_document(index, case):
                proposer = make_proposer(name, assembly, case, index)
                stats.steps.extend(replay(proposer, prompt_ids, output_ids, max_draft, verify_cost).steps)
        rows[name] = summary_row(stats)
        if extras is not None:
            extras[name] = {"rejected_per_token": (stats.drafted_tokens - stats.accepted_tokens) / max(stats.tokens, 1)}
    edits = [
        (codec.encode(case.reference), prompt_ids, output_ids)
        for case, prompt_ids, output_ids in streams
        if case.kind == "edit"
    ]
    ceiling = None
    if edits:
        tokens = sum(len(output_ids) for _, _, output_ids in edits)
        ceiling = tokens / sum(ceiling_forwards(ref, out, max_draft) for ref, _, out in edits)
        if bounds is not None:
            bounds["hindsight_tokens_per_forward"] = tokens / sum(
                hindsight_forwards(prompt, out, max_draft, [ref]) for ref, prompt, out in edits
            )
    return {
        "workload": workload,
        "records": len(cases),
        "max_draft": max_draft,
        "ceiling": {"tokens_per_forward": ceiling},
        "proposers": rows,
    }


def prompt_renderer(tokenizer) -> PromptRenderer:
    """The replay tokenizer's prompt format (detected from its special tokens, as a target's is)."""
    return PromptRenderer(tokenizer, detect_format(tokenizer))


def case_prompt(case: SimCase, prompts: PromptRenderer) -> str:
    """The text before the output: an edit's rewrite prompt in this tokenizer's format (its chat
    template when it has one), a completion's prefix as recorded."""
    return prompts.render(case.request).text if case.request is not None else case.prompt


def make_proposer(name: str, assembly, case: SimCase, index):
    """``name`` for one case, from the run's assembly, with what the server would give it."""
    if name == BASELINE:
        return PromptLookupRule()
    request = recorded_request(
        name, case.kind == "edit", case.reference, case.reference_start, case.uri, case.cursor, index
    )
    try:
        return assembly.create(name, request)
    except CodespecError:
        raise
    except Exception as error:  # a proposer that needs a model, or a missing option
        raise CodespecError(f"proposer {name!r} cannot run model-free: {error}") from error


def assembly_for(target: TokenizerTarget, index) -> ProposerAssembly:
    """One run's proposers, assembled as the server assembles them (no model proposers: model-free)."""
    candidates = [n for n in LOOKUP_PROPOSERS if n != "index" or index is not None]
    config = ProposerSetup.from_options(target, {"auto_candidates": candidates}).config
    return ProposerAssembly(target, config, shipped_draft=False, models=())


def summary_row(stats: RequestStats) -> dict:
    summary = stats.summary()
    proposal_ms = [step.proposal_s * 1e3 for step in stats.steps]
    return {
        "coverage": summary["coverage"],
        "mean_accepted_length": summary["mean_accepted_length"],
        "tokens_per_forward": summary["tokens_per_forward"],
        "acceptance_by_depth": summary["acceptance_by_depth"],
        "proposal_ms_p50": json_safe(percentile(proposal_ms, 50)),
        "proposal_ms_p99": json_safe(percentile(proposal_ms, 99)),
    }


def build_index(tokenizer, workspace: Sequence[tuple[str, str]]):
    from codespec.index import WorkspaceIndex

    index = WorkspaceIndex(tokenizer, db_path=None)
    # One batch, as the server indexes a workspace (index_workspace): one level, where a document
    # at a time leaves the overlay of recent changes full and each lookup scans it (4x slower).
    index.add_documents(dict(workspace), version=1)
    return index


@contextmanager
def case_document(index, case: SimCase) -> Iterator[None]:
    """The case's own document is indexed for this case only (another case's document may hold
    this case's answer: completion cases are cut from the same held-out files)."""
    if index is None:
        yield
        return
    index.add_document(case.uri, case.document, 1)
    try:
        yield
    finally:
        remove = getattr(index, "remove_document", None)
        if remove is not None:
            remove(case.uri)
        else:
            index.update_document(case.uri, 0, len(case.document), "", 2)
