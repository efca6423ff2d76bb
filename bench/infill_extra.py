"""What llama.vim's ``input_extra`` chunks add to drafting: the completions workload replayed through
the proposers the server builds for an ``/infill``, with and without chunks of the files each
completion copies from, in the same run.

Model-free replay (``proposers.lookup_sim.replay``, the method of ``codespec simulate``): the target
is taken to emit each case's recorded text, so tokens per forward is what greedy decoding would get if
the model wrote what the author wrote. The prompt is the one the server renders for the /infill
(``service.inline.completion_request`` with the shipped model's windows and FIM format); the proposer
is ``auto`` over the lookups (the context lookup, and the material lookup when chunks come), as
``proposers.assembly`` builds it for the server.

The chunks are what llama.vim's ring buffer would hold after the user looked at the files the
completion copies from: for each workspace file sharing 20-character stretches with the case's target
(the most shared first, at most ``--files``), the ``--chunk-lines`` lines around the first shared one
(llama.vim's ``ring_chunk_size`` is 64). A case whose target shares no such stretch with any file gets
no chunks, so its two runs are the same request.

    python -m bench.infill_extra --json docs/bench/infill-extra-httpx.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import cast

from codespec.core.stats import RequestStats
from codespec.proposers.lookup_sim import replay

WORKLOADS = Path("/work/shared/workloads")
SHARED_CHARS = 20  # a stretch of the target this long found in a file: the completion copies from it


def shingles(text: str) -> dict[str, int]:
    """Every ``SHARED_CHARS``-character stretch of ``text`` -> where it first starts."""
    found: dict[str, int] = {}
    for start in range(len(text) - SHARED_CHARS + 1):
        found.setdefault(text[start : start + SHARED_CHARS], start)
    return found


def chunks_for(
    target: str, workspace: Sequence[tuple[str, str, dict[str, int]]], files: int, chunk_lines: int
) -> list[dict]:
    """``input_extra`` for a case: a chunk of each file the target copies from (the files sharing
    the most ``SHARED_CHARS``-character stretches with it, at most ``files``), the ``chunk_lines``
    lines around the first stretch shared."""
    wanted = {target[start : start + SHARED_CHARS] for start in range(len(target) - SHARED_CHARS + 1)}
    scored = []
    for path, text, stretches in workspace:
        starts = [stretches[piece] for piece in wanted if piece in stretches]
        if starts:
            scored.append((len(starts), path, text, min(starts)))
    scored.sort(key=lambda item: -item[0])
    chunks = []
    for _, path, text, first in scored[:files]:
        file_lines = text.splitlines(keepends=True)
        first_line = text.count("\n", 0, first)
        start = max(0, first_line - chunk_lines // 2)
        chunks.append({"filename": path, "text": "".join(file_lines[start : start + chunk_lines])})
    return chunks[::-1]  # the ring buffer's newest (the best) last


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, default=WORKLOADS / "completions-httpx.jsonl")
    parser.add_argument("--workspace", type=Path, default=WORKLOADS / "workspace-httpx.jsonl")
    parser.add_argument("--files", type=int, default=2, help="files a case's chunks come from, at most")
    parser.add_argument("--chunk-lines", type=int, default=64)
    parser.add_argument("--max-draft", type=int, default=32)
    parser.add_argument("--verify-ms", type=float, nargs=2, default=[10.0, 0.05], metavar=("A", "B"))
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from codespec.core.default_model import target_path
    from codespec.core.prompts import PromptRenderer, detect_format
    from codespec.core.target import Target, TokenizerTarget
    from codespec.proposers.assembly import ProposerAssembly
    from codespec.proposers.setup import ProposerSetup, RequestContext
    from codespec.service.requests.inline import completion_request
    from codespec.service.requests.options import ServerOptions

    tokenizer = AutoTokenizer.from_pretrained(str(target_path()))
    prompts = PromptRenderer(tokenizer, detect_format(tokenizer))
    config = json.loads((target_path() / "config.json").read_text())
    max_context = int(config.get("max_position_embeddings", 1024))
    options = ServerOptions()
    # what the windows read of a target (no model is loaded here: the replay is model-free)
    sizing = cast(
        Target, SimpleNamespace(device=SimpleNamespace(type="cpu"), max_context=max_context, parameter_count=0)
    )
    cases = [json.loads(line) for line in args.cases.read_text().splitlines() if line.strip()]
    rows = [json.loads(line) for line in args.workspace.read_text().splitlines() if line.strip()]
    workspace = [(row["path"], row["text"], shingles(row["text"])) for row in rows]

    target = TokenizerTarget(tokenizer)
    verify_cost = (args.verify_ms[0] / 1e3, args.verify_ms[1] / 1e3)
    candidates = {"auto_candidates": ("context", "material")}
    assemblies = {
        mode: ProposerAssembly(
            target, ProposerSetup.from_options(target, candidates).config, shipped_draft=False, models=()
        )
        for mode in ("without", "with")
    }
    stats = {mode: RequestStats() for mode in assemblies}
    given = {mode: RequestStats() for mode in assemblies}  # the cases that got chunks
    material_tokens: list[int] = []
    for case in cases:
        document = case["prefix"] + case["suffix"]
        request, _ = completion_request(document, len(case["prefix"]), options, sizing, invoked=True, deadline=False)
        prompt_ids = tokenizer.encode(prompts.render(request.prompt).text, add_special_tokens=False)
        output_ids = tokenizer.encode(case["target"], add_special_tokens=False)
        chunks = chunks_for(case["target"], workspace, args.files, args.chunk_lines)
        material = tuple(tuple(tokenizer.encode(chunk["text"], add_special_tokens=False)) for chunk in chunks)
        if material:
            material_tokens.append(sum(map(len, material)))
        for mode, assembly in assemblies.items():
            context = RequestContext(material=material if mode == "with" else ())
            proposer = assembly.create("auto", context)
            steps = replay(proposer, prompt_ids, output_ids, args.max_draft, verify_cost).steps
            stats[mode].steps.extend(steps)
            if material:
                given[mode].steps.extend(steps)

    def row(of: RequestStats) -> dict:
        summary = of.summary()
        keys = ("tokens", "target_forwards", "tokens_per_forward", "coverage", "mean_accepted_length")
        return {key: summary[key] for key in keys}

    report = {
        "workload": f"{args.cases.name} + {args.workspace.name}",
        "method": "model-free replay of each case's recorded target (lookup_sim.replay), auto over lookups",
        "tokenizer": "shipped default target",
        "records": len(cases),
        "records_with_chunks": len(material_tokens),
        "chunk_lines": args.chunk_lines,
        "files_per_case": args.files,
        "material_tokens_mean": sum(material_tokens) / max(1, len(material_tokens)),
        "max_draft": args.max_draft,
        "verify_ms": args.verify_ms,
        "all_cases": {mode: row(of) for mode, of in stats.items()},
        "cases_with_chunks": {mode: row(of) for mode, of in given.items()},
    }
    for scope in ("all_cases", "cases_with_chunks"):
        without = report[scope]["without"]["tokens_per_forward"]
        report[scope]["ratio"] = report[scope]["with"]["tokens_per_forward"] / without if without else None
    text = json.dumps(report, indent=2)
    print(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
