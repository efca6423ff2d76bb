"""`codespec simulate`: model-free replay of recorded edits and completions through proposers.

No model runs: each record's output is replayed as if the target emitted exactly it (docs/design.md
§4, "simulate" mode), so coverage, mean accepted length, acceptance by depth and tokens per
target forward are measured in seconds. Every run also replays the same token streams through
transformers' prompt-lookup rule (``hf-rule``) and, for edits, reports the lookup ceiling.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from bench.sim_names import BASELINE, LOOKUP_PROPOSERS, MODEL_PROPOSERS
from codespec.core.config import SERVE_MAX_DRAFT
from codespec.core.errors import CodespecError


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "simulate", help="replay recorded edits/completions through proposers, without a model"
    )
    parser.add_argument("--workload", type=Path, required=True, help="JSONL of edit or completion records")
    parser.add_argument("--workspace", type=Path, help="JSONL of {path, text} files to index (completions)")
    parser.add_argument(
        "--proposer",
        nargs="+",
        action="extend",
        default=None,
        metavar="NAME",
        help=f"proposers to replay (default: {', '.join(LOOKUP_PROPOSERS)}); the {BASELINE} baseline is always added",
    )
    parser.add_argument(
        "--max-draft",
        type=int,
        default=SERVE_MAX_DRAFT,
        help=f"K: most draft tokens per step (default {SERVE_MAX_DRAFT}, the server's)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--tokenizer", help="model directory whose tokenizer to use (default: the shipped model's)")
    parser.add_argument("--max-records", type=int, help="replay only the first N records")
    parser.add_argument(
        "--verify-ms",
        type=float,
        nargs=2,
        default=[10.0, 0.05],
        metavar=("A", "B"),
        help="modelled target forward time, A + B x draft tokens ms (default 10 0.05: a "
        "small model on a GPU); only cost-aware proposers (auto) read it",
    )
    parser.set_defaults(run=run)


def run(args) -> int:
    from bench.sim_run import simulate_workload
    from bench.sim_workload import load_cases, load_workspace

    if args.max_draft < 1:
        raise CodespecError(f"--max-draft must be >= 1, got {args.max_draft}")
    if args.max_records is not None and args.max_records < 1:
        raise CodespecError(f"--max-records must be >= 1, got {args.max_records}")
    if args.json and (args.json.is_dir() or not args.json.parent.is_dir()):
        raise CodespecError(f"--json {args.json}: not a file in an existing directory")  # before the run, not after
    names = list(dict.fromkeys(args.proposer or _default_proposers()))
    for name in names:
        if name in MODEL_PROPOSERS:
            raise CodespecError(
                f"proposer {name!r} needs a model; simulate is model-free (use `codespec bench` for model proposers)"
            )
    if min(args.verify_ms) < 0:
        raise CodespecError(f"--verify-ms takes two non-negative numbers, got {args.verify_ms}")
    cases = load_cases(args.workload, args.max_records)  # bad input fails before the tokenizer loads
    workspace = load_workspace(args.workspace) if args.workspace else []
    tokenizer = load_tokenizer(args.tokenizer)
    extras: dict = {}
    bounds: dict = {}
    report = simulate_workload(
        cases,
        names,
        tokenizer,
        args.max_draft,
        workspace,
        workload=args.workload.stem,
        verify_cost=(args.verify_ms[0] / 1e3, args.verify_ms[1] / 1e3),
        extras=extras,
        bounds=bounds,
    )
    print(format_table(report, extras, bounds))
    if args.json:
        try:
            args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        except OSError as error:  # the table above is already printed
            raise CodespecError(f"--json {args.json}: cannot write it ({error.strerror or error})") from None
    return 0


def _default_proposers() -> list[str]:
    return ["context", "reference", "index"]


def load_tokenizer(path: str | None):
    from transformers import AutoTokenizer

    if path is None:
        from codespec.core.default_model import target_path

        path = str(target_path())
    if not Path(path).is_dir():
        raise CodespecError(f"--tokenizer {path}: not a directory (give a local model or tokenizer directory)")
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as error:  # OSError, ValueError: no tokenizer files there
        raise CodespecError(f"no tokenizer could be loaded from {path}: {error}") from None


def format_table(report: dict, extras: dict | None = None, bounds: dict | None = None) -> str:
    """A readable table: one row per proposer, the baseline ratio, the ceiling and bound for edits."""
    extras = extras or {}
    ceiling = report["ceiling"]["tokens_per_forward"]
    baseline = report["proposers"].get(BASELINE, {}).get("tokens_per_forward") or math.nan
    lines = [
        f"workload {report['workload']}: {report['records']} records, max draft {report['max_draft']} tokens, "
        f"model-free replay (tokens per forward: 1.00 = plain decoding)",
        f"{'proposer':<12} {'tok/fwd':>8} {'x ' + BASELINE:>10} {'of ceil':>8} {'coverage':>9} {'MAL':>7} "
        f"{'acc@1':>6} {'acc@8':>6} {'p50 ms':>8} {'p99 ms':>8} {'rej/tok':>8}",
    ]
    for name, row in report["proposers"].items():
        depth = row["acceptance_by_depth"]
        tpf = row["tokens_per_forward"]
        of_ceiling = f"{tpf / ceiling:8.0%}" if ceiling else f"{'-':>8}"
        lines.append(
            f"{name:<12} {tpf:8.2f} {tpf / baseline:10.2f} {of_ceiling} {row['coverage']:9.1%} "
            f"{row['mean_accepted_length']:7.2f} {_at(depth, 0):>6} {_at(depth, 7):>6} "
            f"{_ms(row['proposal_ms_p50']):>8} {_ms(row['proposal_ms_p99']):>8} "
            f"{extras.get(name, {}).get('rejected_per_token', math.nan):8.2f}"
        )
    if ceiling:
        lines.append(f"lookup ceiling (docs/design.md §3): {ceiling:.2f} tokens per forward")
    hindsight = (bounds or {}).get("hindsight_tokens_per_forward")
    if hindsight:
        lines.append(
            f"hindsight bound (every step drafts the longest next stretch of the output found in the "
            f"prompt, the reference or the output so far): {hindsight:.2f} tokens per forward = "
            f"{hindsight / baseline:.2f}x {BASELINE}"
        )
    lines.append(
        "MAL = mean accepted length + 1 per drafted step; acc@i = acceptance at draft depth i; "
        "p50/p99 = proposal time; rej/tok = rejected draft tokens per output token"
    )
    return "\n".join(lines)


def _at(values: list, index: int) -> str:
    return f"{values[index]:.2f}" if index < len(values) else "-"


def _ms(value) -> str:
    return "-" if value is None else f"{value:.3f}"


if __name__ == "__main__":  # pragma: no cover - `codespec simulate` is the entry point
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench.simulate")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["simulate", *sys.argv[1:]])
    sys.exit(args.run(args))
