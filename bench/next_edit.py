"""Next-edit rewrites measured (docs/next-edit.md, "Measured"): the copy pointer alone against
edit-aware drafting, on the next-edit workload built from real commits (bench/next_edit_workload.py).

    python -P bench/next_edit.py replay --model shipped --out docs/bench/next-edit-replay-shipped.json
    python -P bench/next_edit.py replay --shape qwen2.5-coder-0.5b --out docs/bench/next-edit-replay-0.5b.json
    python -P bench/next_edit.py real --out docs/bench/next-edit-real-shipped.json
    python -P bench/next_edit.py replay --model MODEL.gguf --out docs/bench/next-edit-replay-gguf.json
    python -P bench/next_edit.py replay --cross-file --out docs/bench/next-edit-replay-cross-file-shipped.json

``replay``: the target is forced to emit the true next edit (bench/replay.py: every forward runs
for real), so each configuration emits the same tokens and only the drafting differs:
``none`` (plain decoding), ``reference`` (the copy pointer over the window), ``next-edit`` (the
pointer over the window as the user's edit predicts it, with the plain pointer beside it) and
``auto`` (its choice among every lookup, next-edit included). Configurations run interleaved, case
by case. ``real``: the shipped model chooses; how often its suggestion is the true edit, and
greedy output checked identical for every proposer against plain decoding.

Also reported: how often the editable window the service picks (``service.next_edit``)
contains the true next site, and how often the rules alone predict the whole edit.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

SHARED = Path(__file__).resolve().parents[2] / "shared" / "workloads"
CONFIGS = ("none", "reference", "next-edit", "auto")


def load_target(args):
    from bench.shapes import save_shape
    from codespec.core.default_model import target_path
    from codespec.core.model import TargetModel

    if args.shape:
        directory = Path(args.cache) / args.shape
        if not (directory / "config.json").is_file():
            save_shape(args.shape, directory, dtype="float32", seed=0)
        return TargetModel.load(str(directory), device="cpu")
    if args.model != "shipped":  # a directory, FILE.gguf or ollama:NAME: the backend that reads it
        from codespec.core.backends import load_target as load_backend

        return load_backend(args.model, device="cpu", threads=args.threads)
    return TargetModel.load(str(target_path()), device="cpu")


def case_request(case, renderer):
    """The prompt ids' text, the reference and the edits the service would send for this case."""
    from codespec.core.next_edit_prompts import EditEvent, edits_instruction
    from codespec.core.prompts import Rewrite

    event = EditEvent(case.edit_path or case.id.split("/")[0], case.edit_before, case.edit_after)
    prompt = renderer.render(Rewrite(case.window, edits_instruction([event]))).text
    return prompt


def window_stats(cases) -> dict:
    from codespec.proposers.edit_rules import predict
    from codespec.service.requests.next_edit import choose_window

    if any(case.edit_path for case in cases):
        return site_stats(cases)
    found = predicted = 0
    for case in cases:
        start, end, _ = choose_window(case.document, case.cursor, case.edits)
        found += start < case.window_end and end > case.window_start
        predicted += predict(case.window, case.edits) == case.output
    return {"cases": len(cases), "window_contains_site": found, "rules_predict_whole_edit": predicted}


def site_stats(cases) -> dict:
    """Cross-file cases: whether the search finds the true site in the other file (the window it
    picks there overlaps the true one), and whether a file of the workspace snapshot
    (workspace-httpx.jsonl, the other paths) has a site for the same edit, so that a search
    reaching it first would answer there."""
    from codespec.proposers.edit_rules import predict
    from codespec.service.requests.next_edit import OtherDocument, find_site, site_in

    with open(SHARED / "workspace-httpx.jsonl", encoding="utf-8") as handle:
        workspace = [json.loads(line) for line in handle if line.strip()]
    found = predicted = alone = 0
    for case in cases:
        window = site_in(case.document, case.edits)
        found += window is not None and window[0] < case.window_end and window[1] > case.window_start
        predicted += predict(case.window, case.edits) == case.output
        path = case.id.split(":", 1)[1].split("/from:")[0]
        others = [OtherDocument(w["path"], w["text"], None) for w in workspace if not path.endswith(w["path"])]
        alone += find_site(others, case.edits) is None
    return {
        "cases": len(cases),
        "site_found_in_the_file": found,
        "no_other_workspace_file_has_a_site": alone,
        "workspace_files": len(workspace),
        "rules_predict_whole_edit": predicted,
    }


def replay(args) -> dict:
    from bench.gguf import codespec_run
    from bench.next_edit_workload import load
    from bench.replay import Recording, ReplayTarget
    from codespec.core.prompts import PromptRenderer
    from codespec.proposers.assembly import ProposerAssembly
    from codespec.proposers.setup import RequestContext

    raw = load_target(args)
    target = ReplayTarget(raw, vocab_limit=raw.tokenizer.vocab_size if args.shape else None)
    renderer = PromptRenderer(raw.tokenizer, raw.prompt_format)
    cases = load(SHARED / "edits-httpx.jsonl", args.cases, cross_file=args.cross_file)
    end_id = min(raw.eos_token_ids)
    assembly = ProposerAssembly(target, shipped_draft=False, models=())  # auto: lookups only
    rows: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    for number, case in enumerate(cases):
        prompt_ids = raw.encode(case_request(case, renderer))
        output_ids = raw.encode(case.output)
        target.recordings = type(target.recordings)()
        target.recordings.add(Recording(tuple(prompt_ids), tuple(output_ids), end_id))
        request = RequestContext(reference=case.window, edits=case.edits)
        shift = number % len(CONFIGS)
        for name in [*CONFIGS[shift:], *CONFIGS[:shift]]:
            proposer = None if name == "none" else assembly.create(name, request)
            start = time.perf_counter()
            output, times, stats = codespec_run(target, prompt_ids, proposer, len(output_ids) + 1, args.max_draft)
            end = time.perf_counter()
            if output[: len(output_ids)] != list(output_ids):
                raise SystemExit(f"{case.id}: {name} did not emit the recorded edit (replay is broken)")
            decode_s = times[-1] - times[0] if len(times) > 1 else 0.0
            rows[name].append(
                {
                    "id": case.id,
                    "kind": case.kind,
                    "tokens": len(output),
                    "prompt_tokens": len(prompt_ids),
                    "tokens_per_forward": stats.get("tokens_per_forward"),
                    "decode_s": decode_s,
                    "e2e_s": end - start,
                }
            )
        print(f"case {number + 1}/{len(cases)} {case.kind}: {len(output_ids)} tokens", file=sys.stderr, flush=True)
    return {
        "mode": "replay",
        "setup": setup(args, raw),
        **window_stats(cases),
        "summary": summarize(rows),
        "rows": rows,
    }


def summarize(rows: dict[str, list[dict]]) -> dict:
    """Per kind and over all: tokens per forward (all tokens over all forwards), the median of the
    per-case speedups against plain decoding (decode: the time after the first token; end to end:
    prefill included) and the total end-to-end speedup, same-run ratios."""
    out: dict[str, dict] = {}
    kinds = sorted({row["kind"] for row in rows["none"]})
    for kind in ["all", *kinds]:
        chosen = {name: [r for r in rows[name] if kind in ("all", r["kind"])] for name in rows}
        plain = chosen["none"]
        section: dict[str, Any] = {}
        for name, items in chosen.items():
            section[name] = {
                "cases": len(items),
                "tokens_per_forward": round(
                    sum(r["tokens"] for r in items)
                    / max(1, sum(r["tokens"] / (r["tokens_per_forward"] or 1) for r in items)),
                    2,
                ),
                "decode_speedup_median": _median_ratio(plain, items, "decode_s"),
                "e2e_speedup_median": _median_ratio(plain, items, "e2e_s"),
                # all cases' time against plain decoding's: robust where the per-case ratios spread
                "e2e_speedup_total": round(
                    sum(r["e2e_s"] for r in plain) / max(1e-9, sum(r["e2e_s"] for r in items)), 2
                ),
            }
        ref, edit = section["reference"]["tokens_per_forward"], section["next-edit"]["tokens_per_forward"]
        section["next_edit_over_reference_tokens_per_forward"] = round(edit / ref, 3) if ref else None
        out[kind] = section
    return out


def _median_ratio(plain: list[dict], items: list[dict], key: str) -> float | None:
    ratios = [p[key] / r[key] for p, r in zip(plain, items) if r[key] > 0 and p[key] > 0]
    return round(statistics.median(ratios), 2) if ratios else None


def real(args) -> dict:
    """The shipped model chooses: the suggestion against the true edit, every proposer against plain."""
    from bench.next_edit_workload import load
    from codespec.core.config import GenerationLimits, SamplingParams
    from codespec.core.decode import generate_all
    from codespec.core.draft import NoDraft
    from codespec.core.prompts import PromptRenderer
    from codespec.proposers.assembly import ProposerAssembly
    from codespec.proposers.setup import RequestContext

    raw = load_target(args)
    renderer = PromptRenderer(raw.tokenizer, raw.prompt_format)
    cases = load(SHARED / "edits-httpx.jsonl", args.cases, cross_file=args.cross_file)
    assembly = ProposerAssembly(raw, shipped_draft=False, models=())
    rows = []
    for number, case in enumerate(cases):
        prompt_ids = raw.encode(case_request(case, renderer))
        budget = len(raw.encode(case.window)) + 64
        limits = GenerationLimits(budget, (), max_draft_len=0)
        plain = generate_all(raw, prompt_ids, NoDraft(), SamplingParams(), limits)
        row = {
            "id": case.id,
            "kind": case.kind,
            "equals_true_edit": plain.text == case.output,
            "changed": plain.text != case.window,
        }
        request = RequestContext(reference=case.window, edits=case.edits)
        for name in ("reference", "next-edit", "auto"):
            proposer = assembly.create(name, request)
            got = generate_all(
                raw, prompt_ids, proposer, SamplingParams(), GenerationLimits(budget, (), max_draft_len=args.max_draft)
            )
            row[f"{name}_identical"] = list(got.token_ids) == list(plain.token_ids)
            assembly.release(proposer)
        rows.append(row)
        print(f"case {number + 1}/{len(cases)}: {'=' if row['equals_true_edit'] else 'x'}", file=sys.stderr, flush=True)
    return {
        "mode": "real",
        "setup": setup(args, raw),
        **window_stats(cases),
        "suggestion_equals_true_edit": sum(r["equals_true_edit"] for r in rows),
        "suggestion_changed_window": sum(r["changed"] for r in rows),
        "greedy_identical": {
            name: sum(r[f"{name}_identical"] for r in rows) for name in ("reference", "next-edit", "auto")
        },
        "rows": rows,
    }


def setup(args, raw) -> dict:
    import torch

    gguf = hasattr(raw, "kv_capacity")  # codespec.llama_cpp_target.LlamaCppTarget
    return {
        "model": args.shape or args.model,
        "backend": "llama.cpp (cpu)" if gguf else "pytorch fp32 (cpu)",
        "threads": raw.threads if gguf else torch.get_num_threads(),
        "batch": 1,
        "max_draft": args.max_draft,
        "machine": platform.processor() or platform.machine(),
        "workload": "edits-httpx next-edit pairs (bench/next_edit_workload.py)"
        + (", cross-file" if args.cross_file else ""),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("replay", "real"))
    parser.add_argument("--model", default="shipped", help="a model directory, FILE.gguf, or 'shipped'")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads for a GGUF model")
    parser.add_argument("--shape", default=None, help="a random checkpoint of this shape (bench/shapes.py)")
    parser.add_argument("--cache", default="/tmp/codespec-shapes", help="where --shape checkpoints are kept")
    parser.add_argument("--cases", type=int, default=None, help="the first N cases (default: all)")
    parser.add_argument("--cross-file", action="store_true", help="the user's edit in one file, the site in another")
    parser.add_argument("--max-draft", type=int, default=64, help="K: the most draft tokens one forward verifies")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    report = replay(args) if args.mode == "replay" else real(args)
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    raise SystemExit(main())
