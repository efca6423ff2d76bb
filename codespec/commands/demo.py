"""`codespec demo`: what codespec is for, on the shipped model, measured in one run.

Two things a user asks an editor for, each through the same engine service and request builders
the servers use, each decoded twice (speculative, then plain, alternating, from cold caches) so the
speedup, the tokens per forward and the identical-output check come from the same process:

1. completions drawn from an indexed workspace: every line of the workspace's files, the cursor
   after the line's first word (the line's text is what the model should write); the report is
   over all of them, median and spread, plus the best and a typical one, so it cannot show a lucky
   case alone;
2. rewrites of regions with an instruction: every class and function of the workspace (3-30
   lines, from its first decorator), the region being the copy pointer's reference; again the median
   and spread over all of them, with a typical one's output shown as a diff.
"""

from __future__ import annotations

import argparse
import difflib
import html
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from codespec.commands.progress import Progress
from codespec.core.errors import CodespecError

DEFAULT_WORKSPACE = Path(__file__).with_name("demo_workspace")  # two small files, shipped in the package
REWRITE_INSTRUCTION = "add a docstring"
REWRITE_LINES = (3, 30)  # regions of this many lines are rewritten


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="completions from an indexed workspace and a rewrite, each against plain decoding",
        description="Index a workspace, complete at every line of its files and rewrite a region with an "
        "instruction, each decoded speculatively and plainly in the same run: speedups, tokens per "
        "forward, acceptance, and whether the outputs are identical.",
    )
    parser.add_argument(
        "--workspace",
        type=Path,
        default=None,
        help="folder to index and complete in (default: the example workspace shipped with codespec)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="local model directory, FILE.gguf or ollama:NAME[:TAG] (default: the shipped model)",
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each configuration; medians are reported")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--plot", type=Path, default=None, help="write the speedup of every case to FILE.svg")
    parser.set_defaults(run=run)


@dataclass(frozen=True)
class Pair:
    """One request decoded speculatively and plainly (medians of the repeats)."""

    where: str
    text: str
    speculative_s: float
    plain_s: float
    tokens: int
    tokens_per_forward: float
    coverage: float
    acceptance_by_depth: list
    accepted_prediction_tokens: int
    rejected_prediction_tokens: int
    identical: bool
    speedup_range: tuple[float, float]  # over the repeats: each speculative run against the plain one beside it
    tokens_per_forward_range: tuple[float, float]

    @property
    def speedup(self) -> float:
        return self.plain_s / self.speculative_s if self.speculative_s > 0 else float("nan")

    def as_dict(self) -> dict:
        return {**self.__dict__, "speedup": round(self.speedup, 3)}


def measure(service, request, where: str, repeats: int, finish=lambda text: text) -> Pair:
    """``request`` speculatively (the service's default proposer) and plainly, alternating. Each
    speculative run starts with the session's history cleared: it would otherwise draft the
    answer its earlier runs wrote (proposers/outputs.py), which a first request cannot."""
    speculative, plain = [], []
    for repeat in range(repeats):
        service.clear_history().result()
        speculative.append(service.submit(replace(request, cache_key=f"demo-s-{where}-{repeat}")).wait())
        plain.append(service.submit(replace(request, cache_key=f"demo-p-{where}-{repeat}", proposer="none")).wait())
    fast = sorted(speculative, key=lambda r: r.elapsed_s)[len(speculative) // 2]
    slow = sorted(plain, key=lambda r: r.elapsed_s)[len(plain) // 2]
    speedups = [p.elapsed_s / s.elapsed_s for s, p in zip(speculative, plain, strict=True) if s.elapsed_s > 0]
    forwards = [r.stats["tokens_per_forward"] for r in speculative]
    return Pair(
        where,
        finish(fast.text),
        fast.elapsed_s,
        slow.elapsed_s,
        fast.stats["tokens"],
        fast.stats["tokens_per_forward"],
        fast.stats["coverage"],
        fast.stats["acceptance_by_depth"],
        fast.usage.accepted_prediction_tokens,
        fast.usage.rejected_prediction_tokens,
        all(r.text == fast.text for r in (*speculative, *plain)),
        (round(min(speedups), 3), round(max(speedups), 3)) if speedups else (0.0, 0.0),
        (round(min(forwards), 3), round(max(forwards), 3)),
    )


def demo_workspace(given: Path | None) -> Path:
    """The folder the demo works in: the one given, else the example workspace shipped in the package,
    so `codespec demo` runs from any folder of any install."""
    if given is None:
        return DEFAULT_WORKSPACE
    if not given.is_dir():
        raise CodespecError(f"--workspace {given}: not a directory")
    return given


def completion_spots(workspace: Path) -> list[tuple[Path, str, int]]:
    """(file, text, offset): every line with code, the cursor after its first word."""
    spots = []
    for path in sorted(workspace.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        offset = 0
        for line in text.split("\n"):
            stripped = line.lstrip()
            first = stripped.split(" ", 1)[0]
            cursor = len(line) - len(stripped) + len(first) + 1
            if stripped and cursor < len(line):
                spots.append((path, text, offset + cursor))
            offset += len(line) + 1
    return spots


def rewrite_regions(workspace: Path) -> list[tuple[Path, str, str]]:
    """(file, what, region): every class and function of 3-30 lines, from its first decorator."""
    import ast

    regions = []
    for path in sorted(workspace.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno:
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
                region = "".join(lines[first : node.end_lineno])
                if REWRITE_LINES[0] <= region.count("\n") <= REWRITE_LINES[1]:
                    kind = "class" if isinstance(node, ast.ClassDef) else "def"
                    regions.append((path, f"{path.name}:{first + 1} {kind} {node.name}", region))
    return regions


def run(args) -> int:
    from codespec.service.engine.indexing import index_folders
    from codespec.service.engine.runtime import close_service, start_service
    from codespec.service.requests.edit import edit_request, plan_text_edit
    from codespec.service.requests.inline import completion_request, trim_completion
    from codespec.service.requests.options import EngineOptions, ServerOptions

    args.workspace = demo_workspace(args.workspace)
    if args.repeats < 1:
        raise CodespecError(f"--repeats must be >= 1, got {args.repeats}")
    if args.plot is not None and args.plot.suffix != ".svg":
        raise CodespecError(f"--plot {args.plot}: writes an SVG picture; name it FILE.svg")
    started = time.perf_counter()
    progress = Progress()
    progress.say(f"loading the model ({args.model or 'the shipped default'})")
    options = ServerOptions(engine=EngineOptions(model=args.model, device=args.device, threads=args.threads))
    service = start_service(options)
    report: dict = {
        "model": service.target.name,
        "prompt_format": service.prompts.format.name,
        "shipped_model": args.model is None,
        "batch_invariant": bool(getattr(service.target, "batch_invariant", False)),
        "backend": "llama.cpp" if type(service.target).__name__ == "LlamaCppTarget" else "torch",
    }
    try:
        progress.say(f"indexing {args.workspace}")
        index_folders(service, [args.workspace], options, quiet=True)
        completions = []
        spots = completion_spots(args.workspace)
        progress.phase(f"completions (x{args.repeats} speculative and plain)", len(spots))
        for path, text, offset in spots:
            request, context = completion_request(
                text, offset, options, service.target, invoked=True, uri=path.resolve().as_uri(), deadline=False
            )
            line = text.count("\n", 0, offset) + 1
            column = offset - text.rfind("\n", 0, offset)
            completions.append(
                measure(
                    service,
                    request,
                    f"{path.name}:{line}:{column}",
                    args.repeats,
                    lambda out, context=context: trim_completion(out, context),
                )
            )
            progress.step(_progress_detail(completions[-1]))
        rewrites, originals = [], {}
        regions = rewrite_regions(args.workspace)
        progress.phase(f"rewrites (x{args.repeats} speculative and plain)", len(regions))
        for path, where, region in regions:
            plan = plan_text_edit(region, REWRITE_INSTRUCTION, None, options.completion.edit_tokens)
            rewrites.append(measure(service, edit_request(plan, uri=path.resolve().as_uri()), where, args.repeats))
            originals[where] = region
            progress.step(_progress_detail(rewrites[-1]))
    finally:
        close_service(service)
    if not rewrites:
        raise CodespecError(f"--workspace {args.workspace}: no class or function of 3-30 lines to rewrite")
    report["completions"] = summarize(completions)
    report["rewrites"] = summarize(rewrites)
    report["rewrites"]["instruction"] = REWRITE_INSTRUCTION
    report["rewrites"]["typical"]["original"] = originals[report["rewrites"]["typical"]["where"]]
    report["seconds"] = round(time.perf_counter() - started, 1)
    report["repeats"] = args.repeats
    if args.plot is not None:
        args.plot.write_text(speedup_svg(completions, rewrites), encoding="utf-8")
        progress.say(f"wrote {args.plot}")
    if args.json:
        import json

        print(json.dumps(report))
    else:
        print(describe(report))
    return 0


def summarize(pairs: list[Pair]) -> dict:
    speedups = sorted(pair.speedup for pair in pairs)
    ordered = sorted(pairs, key=lambda pair: pair.speedup)
    return {
        "positions": len(pairs),
        "speedup_median": round(statistics.median(speedups), 3),
        "speedup_p10": round(speedups[len(speedups) // 10], 3),
        "speedup_p90": round(speedups[(9 * len(speedups)) // 10], 3),
        "faster": sum(s > 1.0 for s in speedups),
        "tokens_per_forward_median": round(statistics.median(pair.tokens_per_forward for pair in pairs), 3),
        # run to run: how far apart one position's fastest and slowest repeat were (median over positions)
        "repeat_spread": round(statistics.median(_spread_of(pair) for pair in pairs), 3),
        "identical": all(pair.identical for pair in pairs),
        "differing": sum(not pair.identical for pair in pairs),
        "typical": ordered[len(ordered) // 2].as_dict(),
        "best": ordered[-1].as_dict(),
    }


def describe(report: dict) -> str:
    summary, rewrites = report["completions"], report["rewrites"]
    typical, best = summary["typical"], summary["best"]
    example = rewrites["typical"]
    lines = [
        f"codespec demo: model {report['model']} ({report['prompt_format']} prompts), {report['seconds']} s in all",
        f"Each case ran {report['repeats']}x speculatively and {report['repeats']}x plainly, alternating, each "
        "speculative run as a first request (the session's history cleared, so it cannot draft an earlier run's "
        "answer); figures vary from run to run because the auto policy plans every step with costs it measures on this machine "
        "(other work on the cores changes its drafts and timings, never its output).",
        "",
        f"1. Completions from the indexed workspace, at {summary['positions']} positions (each line's text after "
        f"its first word), speculative vs plain decoding in the same run:",
        *_spread(summary, report["repeats"]),
        f"   typical: {typical['where']} -> {typical['text']!r}: {typical['speedup']:.2f}x, "
        f"{typical['tokens_per_forward']:.2f} tokens/forward",
        f"   best:    {best['where']} -> {best['text']!r}: {best['speedup']:.2f}x, "
        f"{best['tokens_per_forward']:.2f} tokens/forward",
        f"   outputs identical to plain greedy decoding: {identity(summary, report)}",
        "",
        f"2. Rewrites of {rewrites['positions']} regions (every class and function of 3-30 lines), instruction "
        f"{rewrites['instruction']!r}, the region as the copy pointer's reference:",
        *_spread(rewrites, report["repeats"]),
        f"   outputs identical to plain greedy decoding: {identity(rewrites, report)}",
        f"   typical: {example['where']}: {example['speedup']:.2f}x ({example['plain_s'] * 1e3:.0f} -> "
        f"{example['speculative_s'] * 1e3:.0f} ms), {example['tokens']} tokens at "
        f"{example['tokens_per_forward']:.2f} tokens/forward; the model's output, as a diff:",
    ]
    diff = difflib.unified_diff(example["original"].split("\n"), example["text"].split("\n"), lineterm="", n=0)
    lines += ["   " + line for line in list(diff)[2:]] or ["   (unchanged)"]
    if report["shipped_model"]:
        lines += [
            "",
            "The shipped model is a 5M-parameter toy trained on the standard library: its text is its own "
            "(speculation never changes it), not a useful assistant. Point --model at a real code model.",
        ]
    return "\n".join(lines)


def identity(summary: dict, report: dict) -> str:
    """'yes', or how many cases differ and why: never a bare 'no'."""
    if summary["identical"]:
        return "yes"
    cases = f"no, {summary['differing']} of {summary['positions']} differ"
    if report.get("batch_invariant", False):
        return (
            f"{cases}. This target's kernels give a position the same logits however many positions a "
            "forward holds, so speculation must not change a token: that is a bug, please report it "
            "with this run's --json output"
        )
    if report.get("backend") == "llama.cpp":
        return (
            f"{cases}. On llama.cpp a position's logits move with where its sequence's cells lie in the "
            "shared KV buffer, beside other requests' (up to ~0.1 in a Q8_0 file); the speculative and "
            "the plain run are separate sequences in different cells, so where the top two tokens are "
            "that close they can pick different ones. Each output is greedy under the kernels that "
            'computed it (docs/gguf.md, "Exactness")'
        )
    return (
        f"{cases}. This target's kernels (bf16, or a GPU's) round a many-position forward differently "
        "from a one-position one, so near-ties can go either way; fp32 on a CPU is exact "
        '(docs/design.md, "Exactness")'
    )


def _spread(summary: dict, repeats: int) -> list[str]:
    return [
        f"   speedup median {summary['speedup_median']:.2f}x (10th-90th percentile {summary['speedup_p10']:.2f}-"
        f"{summary['speedup_p90']:.2f}x; faster at {summary['faster']} of {summary['positions']}), "
        f"tokens per forward median {summary['tokens_per_forward_median']:.2f}",
        f"   run to run: a position's speedup over its {repeats} repeats spans a median "
        f"+-{summary['repeat_spread'] * 50:.0f}%"
        if repeats > 1
        else "   run to run: not measured with one repeat (--repeats 3 shows the spread)",
    ]


def _spread_of(pair: Pair) -> float:
    """(fastest - slowest) / median speedup over one position's repeats."""
    low, high = pair.speedup_range
    return (high - low) / pair.speedup if pair.speedup > 0 else 0.0


def _progress_detail(pair: Pair) -> str:
    low, high = pair.speedup_range
    return f"{pair.where}: {pair.speedup:.2f}x ({low:.2f}-{high:.2f}), {pair.tokens_per_forward:.2f} tokens/forward" + (
        "" if pair.identical else "  OUTPUT DIFFERS"
    )


def speedup_svg(completions: list[Pair], rewrites: list[Pair]) -> str:
    """A bar per case (its median speedup, a whisker over its repeats), 1x marked: a picture with no
    plotting library to install."""
    cases = [("completion", pair) for pair in completions] + [("rewrite", pair) for pair in rewrites]
    top = max([2.0, *(pair.speedup_range[1] for _, pair in cases)])
    width, height, left, bottom, bar = 40 + 14 * len(cases), 260, 40, 230, 10
    scale = (bottom - 20) / top

    def y(value: float) -> float:
        return bottom - value * scale

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="10">',
        f'<text x="{left}" y="12">codespec demo: speedup over plain decoding per case (bar: median; line: repeats)</text>',
        f'<line x1="{left}" x2="{width - 5}" y1="{y(1):.1f}" y2="{y(1):.1f}" stroke="#999" stroke-dasharray="3 3"/>',
        f'<text x="4" y="{y(1) + 3:.1f}">1x</text>',
        f'<text x="4" y="{y(top) + 3:.1f}">{top:.1f}x</text>',
    ]
    for number, (kind, pair) in enumerate(cases):
        x = left + 14 * number
        colour = "#3a7bd5" if kind == "completion" else "#e07b39"
        low, high = pair.speedup_range
        parts += [
            f'<rect x="{x}" y="{y(pair.speedup):.1f}" width="{bar}" height="{pair.speedup * scale:.1f}" fill="{colour}">'
            f"<title>{html.escape(f'{kind} {pair.where}')}: {pair.speedup:.2f}x, "
            f"{pair.tokens_per_forward:.2f} tokens/forward</title></rect>",
            f'<line x1="{x + bar / 2}" x2="{x + bar / 2}" y1="{y(low):.1f}" y2="{y(high):.1f}" stroke="#222"/>',
        ]
    parts += [
        f'<text x="{left}" y="{bottom + 15}" fill="#3a7bd5">completions ({len(completions)})</text>',
        f'<text x="{left + 130}" y="{bottom + 15}" fill="#e07b39">rewrites ({len(rewrites)})</text>',
        "</svg>",
    ]
    return "\n".join(parts) + "\n"


if __name__ == "__main__":  # python -m commands.demo
    parser = argparse.ArgumentParser(prog="codespec")
    add_parser(parser.add_subparsers(dest="command", required=True))
    arguments = parser.parse_args(["demo", *sys.argv[1:]])
    sys.exit(arguments.run(arguments))
