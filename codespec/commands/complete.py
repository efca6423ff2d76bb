"""`codespec complete FILE:LINE:COL`: one completion end to end, measured against plain decoding.

It goes through the same ``EngineService`` and the same prompt construction as the language
server (``service.inline``), then decodes the same prompt with no speculation, from a cold cache like
the first run, to report the speedup measured in the same process and check that the output is
identical (greedy speculative decoding is lossless).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from codespec.commands.serve import engine_options, model_arguments
from codespec.core.errors import CodespecError
from codespec.service.requests.positions import LineIndex, PositionError


def add_complete_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "complete",
        help="complete at FILE:LINE:COL once, end to end, with stats and speedup",
        description="Index the workspace, complete at the position through the same engine service the "
        "servers use, then decode the same prompt plainly to measure the speedup. "
        "LINE and COL count from 1; COL counts characters.",
    )
    parser.add_argument("location", help="FILE:LINE:COL (1-based)")
    model_arguments(parser)
    parser.add_argument(
        "--workspace",
        type=Path,
        default=None,
        help="folder to index first (default: none; the completion drafts from its context)",
    )
    parser.add_argument("--max-tokens", type=int, default=None, help="token budget (default: by context)")
    parser.add_argument(
        "--mode",
        choices=("auto", "line", "block"),
        default="auto",
        help="finish the line, write lines, or decide by the cursor's line (default)",
    )
    parser.add_argument("--no-baseline", action="store_true", help="skip the plain-decoding comparison")
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs of each configuration, alternating, cold caches; the median is reported",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run_complete)


def run_complete(args) -> int:
    return complete_once(args)


def parse_location(location: str) -> tuple[Path, int, int]:
    parts = location.rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        raise CodespecError(f"expected FILE:LINE:COL (1-based), got {location!r}")
    path, line, column = Path(parts[0]), int(parts[1]), int(parts[2])
    if line < 1 or column < 1:
        raise CodespecError(f"LINE and COL count from 1, got {line}:{column}")
    return path, line, column


def cursor_offset(text: str, line: int, column: int) -> int:
    """Code point offset of a 1-based line and column (columns count characters), read by the
    server's one position codec, so line breaks ("\r\n", "\r", "\n") mean what they mean there."""
    try:
        return LineIndex(text, "utf-32", first=1).offset(line, column)
    except PositionError as error:
        raise CodespecError(f"{line}:{column} is past the end of the file or of its line: {error}") from None


def complete_once(args) -> int:
    from codespec.service.engine.indexing import index_folders
    from codespec.service.engine.runtime import close_service, start_service
    from codespec.service.requests.inline import completion_request, trim_completion
    from codespec.service.requests.options import CompletionOptions, ServerOptions
    from codespec.service.requests.schema import GenerationRequest, Sampling

    path, line, column = parse_location(args.location)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise CodespecError(f"cannot read {path}: {error}") from None
    offset = cursor_offset(text, line, column)
    options = ServerOptions(engine=engine_options(args), completion=CompletionOptions(mode=args.mode))
    started = time.perf_counter()
    service = start_service(options)
    loaded_s = time.perf_counter() - started
    report: dict = {
        "model": service.target.name,
        "prompt_format": service.prompts.format.name,
        "model_load_s": round(loaded_s, 3),
    }
    try:
        if args.workspace is not None:
            started = time.perf_counter()
            index = index_folders(service, [args.workspace], options, quiet=args.json)
            report["index_s"] = round(time.perf_counter() - started, 3) if index is not None else None
        uri = path.resolve().as_uri()
        base, context = completion_request(
            text,
            offset,
            options,
            service.target,
            invoked=True,
            uri=uri,
            sampling=Sampling(max_tokens=args.max_tokens),
            deadline=False,
        )

        def request(proposer: str | None, key: str) -> GenerationRequest:
            return dataclasses.replace(base, cache_key=key, proposer=proposer)

        def stream(delta: str) -> None:
            if not args.json:
                sys.stdout.write(delta)
                sys.stdout.flush()

        # Alternate the two configurations, each from a cold cache, and keep the median run of each:
        # one run on a loaded machine can be off by 2x either way.
        speculative_runs, plain_runs = [], []
        for repeat in range(args.repeats):
            on_delta = stream if repeat == 0 else None
            speculative_runs.append(service.submit(request(None, f"speculative-{repeat}"), on_delta).wait())
            if repeat == 0 and not args.json:
                sys.stdout.write("\n")
            if not args.no_baseline:
                plain_runs.append(service.submit(request("none", f"plain-{repeat}")).wait())
        result = _median_run(speculative_runs)
        report.update(_describe(result, "speculative"))
        report["completion"] = trim_completion(result.text, context)
        report["multiline"] = context.multiline
        report["repeats"] = args.repeats
        if plain_runs:
            plain = _median_run(plain_runs)
            report.update(_describe(plain, "plain"))
            report["identical_output"] = all(run.text == result.text for run in (*speculative_runs, *plain_runs))
            report["speedup_wall"] = _ratio(plain.elapsed_s, result.elapsed_s)
            report["speedup_decode"] = _ratio(result.stats["tokens_per_s"], plain.stats["tokens_per_s"])
    finally:
        close_service(service)
    if args.json:
        print(json.dumps(report))
    else:
        print(_summary(report), file=sys.stderr)
    return 0


def _median_run(runs: list):
    return sorted(runs, key=lambda run: run.elapsed_s)[len(runs) // 2]


def _describe(result, label: str) -> dict:
    stats = result.stats
    return {
        f"{label}_ms": round(result.elapsed_s * 1e3, 2),
        f"{label}_tokens": stats["tokens"],
        f"{label}_target_forwards": stats["target_forwards"],
        f"{label}_tokens_per_forward": round(stats["tokens_per_forward"], 3),
        f"{label}_ttft_ms": stats["ttft_ms"],
        f"{label}_tokens_per_s": stats["tokens_per_s"],
        f"{label}_coverage": stats["coverage"],
        f"{label}_proposer": result.proposer,
        f"{label}_finish_reason": result.reason,
    }


def _ratio(numerator, denominator) -> float | None:
    if not numerator or not denominator:
        return None
    return round(numerator / denominator, 3)


def _summary(report: dict) -> str:
    lines = [
        f"codespec [{report['speculative_proposer']}, median of {report['repeats']}]: "
        f"{report['speculative_tokens']} tokens in "
        f"{report['speculative_ms']:.0f} ms ({report['speculative_target_forwards']} target forwards, "
        f"{report['speculative_tokens_per_forward']:.2f} tokens/forward vs 1.00 for plain decoding; "
        f"coverage {report['speculative_coverage']:.0%}; TTFT {report['speculative_ttft_ms'] or 0:.0f} ms; "
        f"finish: {report['speculative_finish_reason']})",
    ]
    if "plain_ms" in report:
        wall = report["speedup_wall"]
        decode = report["speedup_decode"]
        lines.append(
            f"plain decoding, same prompt, same run: {report['plain_tokens']} tokens in {report['plain_ms']:.0f} ms"
            f" -> speedup {wall:.2f}x wall time"
            if wall
            else "plain decoding: no tokens"
        )
        if decode:
            lines[-1] += (
                f", {decode:.2f}x decode rate ({report['speculative_tokens_per_s']:.0f} vs "
                f"{report['plain_tokens_per_s']:.0f} tokens/s)"
            )
        lines.append(f"output identical to plain greedy decoding: {'yes' if report['identical_output'] else 'NO'}")
    index = f"; index built in {report['index_s']:.2f} s" if report.get("index_s") is not None else ""
    lines.append(f"model {report['model']} loaded in {report['model_load_s']:.2f} s{index}")
    return "\n".join(lines)
