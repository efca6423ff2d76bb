"""The issue's performance targets, checked against bench JSON, and a combined markdown document.

    python -m bench.targets OUT.md RUN.json [RUN.json ...] [--note TEXT]

writes one document: a targets table (met / not met, with the measured same-run ratios, aggregate
and per-request median; repeated runs of a workload widen it to a range) followed by each run's
report (the first run of each workload and mode). Targets (issue 6), each on one workload:
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Target:
    workload: str
    mode: str
    config: str
    versus: str  # a configuration name, compared by tokens/s
    ratio: float
    needs_equivalence: bool = False
    report_only: bool = False  # the issue asks for the comparison, not for a threshold


TARGETS = (
    Target("edits-httpx", "replay", "auto", "hf-pld", 2.0),
    Target("edits-httpx", "replay", "auto", "greedy", 4.0, needs_equivalence=True),
    Target("completions-httpx", "replay", "auto", "hf-pld", 1.3),
    Target("editeval", "real", "auto", "greedy", 1.0),
    Target("editeval", "real", "draft", "hf-assisted", 0.0, report_only=True),
    Target("editeval", "real", "early-exit", "hf-early-exit", 0.0, report_only=True),
)


def check(target: Target, report: dict) -> dict | None:
    """The measured ratios for ``target`` in ``report`` (None when the run does not cover it)."""
    body = report.get("workloads", {}).get(target.workload)
    if body is None or report.get("mode") != target.mode:
        return None
    configs = body["configs"]
    if target.config not in configs or target.versus not in configs:
        return None
    mine, theirs = configs[target.config], configs[target.versus]
    ratio = mine["tokens_per_s"] / theirs["tokens_per_s"] if theirs["tokens_per_s"] else None
    if target.versus == "greedy":
        median = mine.get("speedup_median")
    else:
        a, b = mine.get("speedup_median"), theirs.get("speedup_median")
        median = a / b if a and b else None  # ratio of medians of per-request speedups over greedy
    met = ratio is not None and ratio >= target.ratio
    if target.needs_equivalence:
        met = met and mine.get("equivalence") == 1.0
    return {"ratio": ratio, "median_ratio": median, "equivalence": mine.get("equivalence"), "met": met}


def targets_table(reports: list[dict]) -> str:
    """One row per target: the first report that covers it, and the range over every report that
    does (repeated runs of the same command show how stable a verdict is)."""
    lines = [
        "| target | measured: aggregate tok/s ratio | per-request medians (x greedy) ratio | equivalence | met |",
        "|---|---:|---:|---:|:---:|",
    ]
    for target in TARGETS:
        found = [result for report in reports if (result := check(target, report)) is not None]
        if target.report_only:
            name = f"{target.workload} ({target.mode}): `{target.config}` against `{target.versus}` (reported)"
        else:
            name = f"{target.workload} ({target.mode}): `{target.config}` >= {target.ratio:g}x `{target.versus}`" + (
                " with 100% equivalence" if target.needs_equivalence else ""
            )
        if not found:
            lines.append(f"| {name} | not run | - | - | - |")
            continue
        first = found[0]
        ratio = _with_range(first["ratio"], [r["ratio"] for r in found])
        median = _with_range(first["median_ratio"], [r["median_ratio"] for r in found])
        equivalence = f"{first['equivalence']:.0%}" if first["equivalence"] is not None else "-"
        if target.report_only:
            verdict = "-"
        elif len(found) > 1 and len({r["met"] for r in found}) > 1:
            verdict = f"{'yes' if first['met'] else '**no**'} in this run; **not in every run** ({len(found)} runs)"
        else:
            verdict = "yes" if first["met"] else "**no**"
        lines.append(f"| {name} | {ratio} | {median} | {equivalence} | {verdict} |")
    return "\n".join(lines)


def _with_range(value, values) -> str:
    if value is None:
        return "-"
    text = f"{value:.2f}x"
    known = [v for v in values if v is not None]
    if len(known) > 1:
        text += f" ({len(known)} runs: {min(known):.2f}x–{max(known):.2f}x)"
    return text


def main(argv: list[str]) -> int:
    from bench.report import markdown

    note = None
    if "--note" in argv:
        at = argv.index("--note")
        note, argv = argv[at + 1], argv[:at] + argv[at + 2 :]
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out, paths = Path(argv[0]), [Path(p) for p in argv[1:]]
    reports = [json.loads(path.read_text()) for path in paths]
    parts = ["# codespec bench: quick profile", ""]
    if note:
        parts += [note, ""]
    parts += ["## targets (issue 6), same-run ratios", "", targets_table(reports), ""]
    shown: set[str] = set()
    for report in reports:
        key = ",".join(report["workloads"]) + report["mode"]
        if key in shown:  # a repeated run: counted in the targets table, not printed again
            continue
        shown.add(key)
        command = report.get("setup", {}).get("command", "")
        title = f"{', '.join(report['workloads'])} ({report['mode']} mode)"
        parts.append(markdown(report, command=command, title=title, level=2))
    out.write_text("\n".join(parts) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
