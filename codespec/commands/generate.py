"""``codespec generate``: one generation from a prompt, with any proposer (``--proposer none`` is
plain decoding). Benchmarks and outside checks rely on its ``--json`` output (README, "Commands")."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from codespec.core.default_model import target_path
from codespec.core.errors import CodespecError
from codespec.core.stats import json_safe
from codespec.proposers.registry import available_proposers


def default_model_path() -> str:
    """The shipped default model (docs/default-model.md)."""
    return str(target_path())


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("generate", help="generate text from a prompt with speculative decoding")
    parser.add_argument(
        "--model",
        default=default_model_path(),
        help="local model directory, cached hub id, FILE.gguf or ollama:NAME[:TAG] (default: the shipped model)",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="prompt text")
    source.add_argument("--prompt-file", type=Path, help="read the prompt from this file")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--proposer",
        default="context",
        help="none (plain decoding, the baseline), context, or any installed proposer: "
        + ", ".join(available_proposers())
        + " (auto: a policy picks among the others "
        "and the draft length per step)",
    )
    parser.add_argument(
        "--draft-len",
        type=int,
        default=None,
        help="K: most draft tokens verified per forward (default 8; 64 for auto, whose policy sizes drafts)",
    )
    parser.add_argument(
        "--draft-model",
        default=None,
        help="draft model directory for --proposer draft/auto (same tokenizer; default: the shipped draft)",
    )
    parser.add_argument(
        "--reference-file",
        type=Path,
        default=None,
        help="text the output is expected to largely copy (a region being rewritten, a "
        "predicted output): drafted by --proposer reference and auto",
    )
    parser.add_argument(
        "--workspace",
        type=Path,
        action="append",
        default=[],
        help="directory to index for --proposer index and auto (repeatable; in memory, "
        ".gitignore respected, .venv / node_modules / __pycache__ left out)",
    )
    parser.add_argument(
        "--exit-layer",
        type=int,
        default=None,
        help="early exit: draft with the target's first E layers (default: a quarter of the depth)",
    )
    parser.add_argument(
        "--draft-min-confidence",
        type=float,
        default=None,
        help="draft model / early exit: stop drafting when the drafter's top probability falls "
        "below this (default 0.4, as transformers' assisted generation; 0 = full length)",
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--device", default="auto", help="auto (cuda, mps, cpu), or a torch device")
    parser.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 elsewhere), float32, bfloat16")
    parser.add_argument("--trust-remote-code", action="store_true")
    parser.add_argument(
        "--threads", type=int, default=None, help="llama.cpp threads for a GGUF model (default: the cores, at most 8)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    parser.set_defaults(run=run_generate)


def run_generate(args) -> int:
    from codespec.core.backends import load_target
    from codespec.core.config import GenerationLimits, SamplingParams
    from codespec.core.decode import Finished, TextDelta, generate
    from codespec.proposers.assembly import ProposerAssembly
    from codespec.proposers.setup import ProposerSetup

    prompt = args.prompt if args.prompt is not None else read_text_file(args.prompt_file, "--prompt-file")
    sampling = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
    draft_len = args.draft_len if args.draft_len is not None else (64 if args.proposer == "auto" else 8)
    limits = GenerationLimits(args.max_new_tokens, tuple(args.stop), max_draft_len=draft_len)
    target = load_target(
        args.model,
        device=args.device,
        dtype=args.dtype,
        threads=args.threads,
        trust_remote_code=args.trust_remote_code,
    )
    options = {}
    if args.draft_model:
        options["draft_model"] = args.draft_model
    if args.exit_layer is not None:
        options["exit_layer"] = args.exit_layer
    if args.draft_min_confidence is not None:
        options["draft_min_confidence"] = args.draft_min_confidence
    if args.reference_file is not None:
        options["reference"] = read_text_file(args.reference_file, "--reference-file")
    if args.workspace:
        options["index"] = index_roots(target, args.workspace)
    try:
        setup = ProposerSetup.from_options(target, options)
        proposer = ProposerAssembly(target, setup.config).create(args.proposer, setup.request)
    except (ValueError, TypeError, OSError) as error:  # a missing option, a draft model that does not fit
        raise CodespecError(f"--proposer {args.proposer}: {error}{option_hint(args.proposer)}") from None
    finished = None
    for event in generate(target, target.encode(prompt), proposer, sampling, limits):
        if isinstance(event, TextDelta) and not args.json:
            sys.stdout.write(event.text)
            sys.stdout.flush()
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None, "generate always ends with Finished"
    stats = finished.stats.summary()
    if args.json:
        print(
            json.dumps(
                {
                    "text": finished.text,
                    "token_ids": list(finished.token_ids),
                    "finish_reason": finished.reason,
                    "stats": json_safe(stats),
                }
            )
        )
    else:
        sys.stdout.write("\n")
        print(describe_stats(stats, args.proposer), file=sys.stderr)
    return 0


def option_hint(proposer: str) -> str:
    return {"reference": " (pass --reference-file)", "index": " (pass --workspace DIR)"}.get(proposer, "")


def index_roots(target, roots: list[Path]):
    """An in-memory workspace index of ``roots`` for one generation."""
    for root in roots:
        if not root.is_dir():
            raise CodespecError(f"--workspace {root}: not a directory")
    from codespec.index import WorkspaceIndex
    from codespec.index.discovery import DEFAULT_EXCLUDE

    workspace = WorkspaceIndex(target.tokenizer, None)
    report = workspace.index_workspace(list(roots), DEFAULT_EXCLUDE)
    print(
        f"[index] {report.files} files, {report.tokens} tokens in {report.seconds:.2f} s"
        f"{f', {len(report.skipped)} skipped' if report.skipped else ''}",
        file=sys.stderr,
    )
    return workspace


def read_text_file(path: Path, option: str) -> str:
    """A UTF-8 file named on the command line; a missing or unreadable one is a clear error."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise CodespecError(f"{option} {path}: cannot read it ({error})") from None


def describe_stats(stats: dict, proposer: str) -> str:
    return (
        f"[{proposer}] {stats['tokens']} tokens in {stats['target_forwards']} target forwards "
        f"({stats['tokens_per_forward']:.2f} tokens/forward; 1.00 for plain decoding), "
        f"coverage {stats['coverage']:.0%}, mean accepted length {stats['mean_accepted_length']:.2f}, "
        f"TTFT {stats['ttft_ms']:.1f} ms, decode {stats['tokens_per_s']:.1f} tokens/s"
    )
