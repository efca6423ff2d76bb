"""`codespec vllm-config`: the JSON to pass as vLLM's ``speculative_config`` so that vLLM drafts
with codespec's proposer (docs/vllm.md). Its stdout is that JSON alone, for
``vllm serve MODEL --speculative-config "$(codespec vllm-config)"``."""

from __future__ import annotations

import json

from codespec.vllm_proposer.options import DEFAULT_K, PROPOSERS


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "vllm-config",
        help="print the speculative_config JSON that makes vLLM draft with codespec's proposer",
        description="Print vLLM's speculative_config for codespec's proposer (install codespec in vLLM's "
        'environment first: pip install -e ".[vllm]"). Every option travels inside the JSON, to every '
        "vLLM worker and node.",
    )
    parser.add_argument(
        "--k",
        type=int,
        default=DEFAULT_K,
        help=f"most draft tokens vLLM verifies per step (num_speculative_tokens; default {DEFAULT_K})",
    )
    parser.add_argument(
        "--proposer",
        default="auto",
        choices=PROPOSERS,
        help="auto (default: picks per step among the lookups and sizes each draft from vLLM's measured "
        "step cost), context, reference (the code the prompt carries) or index",
    )
    parser.add_argument(
        "--workspace",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder to index at vLLM's start for workspace lookup (repeatable; a path on the vLLM host)",
    )
    parser.add_argument(
        "--index", default=None, help="the codespec index store (default: <first folder>/.codespec/index.db)"
    )
    parser.add_argument("--index-max-tokens", type=int, default=None, help="resident index tokens at most")
    parser.set_defaults(run=run)


def run(args) -> int:
    from pathlib import Path

    from codespec.vllm_proposer.options import DrafterOptions, speculative_config

    options = DrafterOptions(
        proposer=args.proposer,
        workspace=tuple(str(Path(folder).expanduser().resolve()) for folder in args.workspace),
        index=str(Path(args.index).expanduser().resolve()) if args.index else None,
        index_max_tokens=args.index_max_tokens,
    )
    print(json.dumps(speculative_config(options, args.k)))
    return 0
