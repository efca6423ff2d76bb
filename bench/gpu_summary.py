"""The summary of a ``bench/gpu.sh`` run: ``python -m bench.gpu_summary OUT`` prints markdown.

Every step's exit status and seconds, greedy equivalence per dtype (with the largest logit gap at a
mismatch), the replay bench per shape and workload (tok/s, x greedy, auto over hf-pld, equivalence,
CUDA peak memory per configuration) and the inline latencies through the language server.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _fmt(value, pattern: str = "{:.2f}") -> str:
    return "-" if value is None else pattern.format(value)


def summary(out: Path) -> str:
    lines = [f"# bench/gpu.sh: {out}", ""]
    env = out / "env.txt"
    if env.is_file():
        lines += ["```", env.read_text().strip(), "```", ""]
    lines += ["| step | exit | seconds |", "|---|---:|---:|"]
    status = out / "status.tsv"
    for row in status.read_text().splitlines() if status.is_file() else []:
        name, code, seconds = row.split("\t")
        lines.append(f"| {name} | {code}{' (timed out)' if code in ('124', '137') else ''} | {seconds} |")
    equivalence = _load(out / "equivalence.json")
    if equivalence:
        lines += [
            "",
            f"greedy equivalence at {equivalence['shape']} ({equivalence['prompts']} prompts x "
            f"{equivalence['max_new_tokens']} tokens, draft lengths {equivalence['draft_lens']}, "
            f"always-right / right-then-wrong / random drafts):",
            "",
            "| dtype | identical | max logit gap at a mismatch | CUDA peak MB |",
            "|---|---:|---:|---:|",
        ]
        for dtype, result in equivalence["dtypes"].items():
            lines.append(
                f"| {dtype} | {result['identical']}/{result['runs']} | "
                f"{_fmt(result['max_gap_at_mismatch'], '{:.3g}')} | {result.get('cuda_max_allocated_mb', '-')} |"
            )
    for name in ("bench-1.5b", "bench-7b"):
        report = _load(out / f"{name}.json")
        if not report:
            continue
        setup = report.get("setup", {})
        lines += [
            "",
            f"## {name}: {setup.get('model')}",
            "",
            f"{setup.get('cuda') or setup.get('machine')}; wall {setup.get('wall_s')} s",
            "",
        ]
        for workload, body in report["workloads"].items():
            configs = body["configs"]
            auto, pld = configs.get("auto", {}), configs.get("hf-pld", {})
            ratio = (auto.get("tokens_per_s") or 0) / pld["tokens_per_s"] if pld.get("tokens_per_s") else None
            lines += [
                f"{workload} ({body['records']} requests): auto / hf-pld = {_fmt(ratio)}x",
                "",
                "| config | tok/s | x greedy | tok/fwd | equiv. | CUDA peak MB |",
                "|---|---:|---:|---:|---:|---:|",
            ]
            for config, row in configs.items():
                lines.append(
                    f"| {config} | {_fmt(row.get('tokens_per_s'), '{:.1f}')} | {_fmt(row.get('speedup'))} | "
                    f"{_fmt(row.get('tokens_per_forward'))} | {_fmt(row.get('equivalence'), '{:.0%}')} | "
                    f"{_fmt(row.get('cuda_max_allocated_mb'), '{:.0f}')} |"
                )
            lines.append("")
    inline = _load(out / "inline-1.5b.json")
    if inline:
        lines += [
            "",
            f"inline completion through the language server ({inline.get('cases')} cases, mode "
            f"{inline.get('mode')}, model {inline.get('model')}), ms:",
            "",
            "| phase | item p50 | item p95 | TTFT p50 | TTFT p95 |",
            "|---|---:|---:|---:|---:|",
        ]
        for phase in ("cold", "opened", "keystroke"):
            if f"{phase}_item_ms_p50" in inline:
                lines.append(
                    f"| {phase} | {inline[f'{phase}_item_ms_p50']} | {inline[f'{phase}_item_ms_p95']} | "
                    f"{inline.get(f'{phase}_ttft_ms_p50', '-')} | {inline.get(f'{phase}_ttft_ms_p95', '-')} |"
                )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m bench.gpu_summary OUT", file=sys.stderr)
        return 2
    print(summary(Path(argv[0])), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
