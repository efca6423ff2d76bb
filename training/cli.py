"""``codespec train-default``: rebuild the shipped default model pair from the standard library."""

from __future__ import annotations

from pathlib import Path


def add_parser(subparsers) -> None:
    from training import DEFAULT_COMPLETIONS  # not evaluate: it imports torch, and --help stays instant

    parser = subparsers.add_parser(
        "train-default", help="train the shipped default target + draft models (CPU, deterministic)"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="model directory root (default: the package's codespec/models/default)"
    )
    parser.add_argument(
        "--work", type=Path, default=Path("train-default-work"), help="checkpoints and the training log go here"
    )
    parser.add_argument(
        "--mix-steps",
        type=int,
        default=3200,
        help="optimizer steps on the mixture after the copy curriculum and the bridge",
    )
    parser.add_argument(
        "--finish-steps",
        type=int,
        default=None,
        help="steps of the FIM finishing phase after the main run (0: skip; default: FinishConfig's)",
    )
    parser.add_argument(
        "--rescue-steps",
        type=int,
        default=0,
        help="steps of the (previous recipe's) copy-rescue fine-tune after the main run (0: skip)",
    )
    parser.add_argument(
        "--rescue-decay",
        type=float,
        default=None,
        help="fraction of the fine-tune's steps spent in its final linear LR decay (default: RescueConfig's)",
    )
    parser.add_argument(
        "--probe-functions",
        type=int,
        default=None,
        help="held-out functions in the fine-tune's copy probe (default: RescueConfig's)",
    )
    parser.add_argument(
        "--context-steps",
        type=int,
        default=None,
        help="steps of the context-copy phase after the finishing phase (0: skip; default: ContextCopyConfig's)",
    )
    parser.add_argument(
        "--from-shipped",
        action="store_true",
        help="run only the context-copy phase, from the finish weights in --start (a full run "
        "exports exactly those before the phase), write the result to --out, and write the card",
    )
    parser.add_argument(
        "--start",
        type=Path,
        default=None,
        help="with --from-shipped: a directory with target/ and draft/ holding the finish weights the phase "
        "starts from (the shipped pair before the phase, commit 0fb9784; checked against "
        "training/runs/shipped-finish.json); the result goes to --out",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="skip the main run: restore its checkpoint in --work, then run the phases after it",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--device",
        default="cpu",
        help="torch device to train on (cuda works; the recipe is sized for the 90-minute CPU budget)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (1 is fastest on a shared 2-core machine: measured 2.0k vs "
        "0.2-0.6k tokens/s with 2 threads under load)",
    )
    parser.add_argument(
        "--export-only",
        action="store_true",
        help="export + evaluate the last checkpoint in --work (the finished one if there is one)",
    )
    parser.add_argument("--no-eval", action="store_true", help="skip evaluation and the model card")
    parser.add_argument("--card", type=Path, default=Path("docs/default-model.md"))
    parser.add_argument(
        "--completions",
        type=Path,
        default=DEFAULT_COMPLETIONS,
        help="completion records (JSONL: prefix, suffix, target) for the card's first-line exact "
        "match (default: shared/workloads/completions-httpx.jsonl beside the checkout, if there)",
    )
    parser.set_defaults(run=run)


def run(args) -> int:
    from training.context_copy import ContextCopyConfig
    from training.evaluate import read_records
    from training.finish import FinishConfig
    from training.pipeline import Pipeline

    pipeline = Pipeline(args.seed, args.threads, args.work, args.out, args.device)
    pipeline.prepare()
    context_steps = ContextCopyConfig.steps if args.context_steps is None else args.context_steps
    if args.from_shipped:
        result = pipeline.load_shipped(args.start)
        pipeline.context_copy(result, context_steps)
        pipeline.export()
        if not args.no_eval:
            pipeline.evaluate_and_write_card(result, args.card, read_records(args.completions))
        return 0
    if args.export_only:
        result = pipeline.restore(prefer_finished=True)
    else:
        result = pipeline.restore() if args.resume else pipeline.train(args.mix_steps)
        result.resumed = args.resume
        if args.rescue_steps > 0:
            rescued = pipeline.rescue(args.rescue_steps, args.rescue_decay, args.probe_functions)
            result.rescue_steps, result.rescue_tokens = rescued.steps, rescued.tokens_seen
            result.rescue_warm_steps = rescued.warm_steps
            result.rescue_wall_s, result.rescue_probes = rescued.wall_s, rescued.probes
            result.tokens_seen += rescued.tokens_seen
            pipeline.save(result)
        finish_steps = FinishConfig.steps if args.finish_steps is None else args.finish_steps
        if finish_steps > 0:
            pipeline.finish(result, finish_steps)
        if context_steps > 0:
            pipeline.export()  # rounds the in-memory weights as the shipped ones are: the phase starts alike
            pipeline.context_copy(result, context_steps)
    pipeline.export()
    if not args.no_eval:
        pipeline.evaluate_and_write_card(result, args.card, read_records(args.completions))
    return 0
