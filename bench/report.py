"""The bench's outputs for people: a terminal table, a markdown report, PNG plots.

Every speed figure says what it is compared with (the same run's codespec ``greedy``) and which
mode produced it. Plots need matplotlib (the optional ``bench`` extra); without it they are
skipped with a note, and everything else is written.
"""

from __future__ import annotations

from pathlib import Path

COLUMNS = (
    ("tokens_per_s", "tok/s", "{:.1f}"),
    ("speedup", "x greedy", "{:.2f}"),
    ("speedup_median", "median x", "{:.2f}"),
    ("tokens_per_forward", "tok/fwd", "{:.2f}"),
    ("mean_accepted_length", "MAL", "{:.2f}"),
    ("coverage", "coverage", "{:.0%}"),
    ("ttft_ms_p50", "TTFT p50 ms", "{:.0f}"),
    ("itl_ms_p50", "ITL p50", "{:.1f}"),
    ("itl_ms_p95", "ITL p95", "{:.1f}"),
    ("itl_ms_p99", "ITL p99", "{:.1f}"),
    ("proposal_ms_p50", "prop. ms", "{:.2f}"),
    ("verify_ms_p50", "verify ms", "{:.1f}"),
    ("peak_rss_mb", "RSS MB", "{:.0f}"),
    ("equivalence", "equiv.", "{:.0%}"),
)


def _fmt(value, pattern: str) -> str:
    if value is None:
        return "-"
    try:
        return pattern.format(value)
    except (ValueError, TypeError):
        return str(value)


def _rows(configs: dict) -> list[list[str]]:
    return [[name, *(_fmt(row.get(key), pattern) for key, _, pattern in COLUMNS)] for name, row in configs.items()]


def table_text(report: dict) -> str:
    lines = []
    for workload, body in report["workloads"].items():
        lines.append(
            f"{workload} ({report['mode']} mode, {body['records']} requests; x greedy = tokens/s over "
            f"codespec greedy, same run)"
        )
        header = ["config", *(title for _, title, _ in COLUMNS)]
        rows = [header, *_rows(body["configs"])]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines += ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in rows]
        lines.append("")
    return "\n".join(lines)


def markdown_table(configs: dict, columns=COLUMNS) -> str:
    header = "| config | " + " | ".join(title for _, title, _ in columns) + " |"
    rule = "|---|" + "---:|" * len(columns)
    body = ["| " + " | ".join(row) + " |" for row in _rows(configs)]
    return "\n".join([header, rule, *body])


def depth_table(configs: dict, depths: int = 8) -> str:
    header = "| config | " + " | ".join(f"d{i + 1}" for i in range(depths)) + " | proposed | accepted |"
    rule = "|---|" + "---:|" * (depths + 2)
    lines = [header, rule]
    for name, row in configs.items():
        values = row.get("acceptance_by_depth") or []
        if not values:
            continue
        cells = [f"{values[i]:.2f}" if i < len(values) else "-" for i in range(depths)]
        lines.append(
            f"| {name} | " + " | ".join(cells) + f" | {row.get('proposed_tokens')} | {row.get('accepted_tokens')} |"
        )
    return "\n".join(lines)


def cost_table(configs: dict) -> str:
    buckets = []
    for row in configs.values():
        for name in row.get("verify_ms_p50_by_draft_len") or {}:
            if name not in buckets:
                buckets.append(name)
    buckets.sort(key=lambda name: int(name.split("-")[0]))
    lines = ["| config | " + " | ".join(f"K {name}" for name in buckets) + " |", "|---|" + "---:|" * len(buckets)]
    for config, row in configs.items():
        values = row.get("verify_ms_p50_by_draft_len") or {}
        lines.append(f"| {config} | " + " | ".join(_fmt(values.get(name), "{:.1f}") for name in buckets) + " |")
    return "\n".join(lines)


def markdown(
    report: dict, command: str = "", plots_note: str | None = None, title: str = "codespec bench", level: int = 1
) -> str:
    setup = report.get("setup", {})
    h1, h2 = "#" * level, "#" * (level + 1)
    out = [
        f"{h1} {title}",
        "",
        f"- date: {setup.get('date_utc')}; machine: {setup.get('cpu_model')} ({setup.get('machine')})"
        + (f"; CUDA: {setup['cuda']}" if setup.get("cuda") else ""),
        f"- mode: **{report['mode']}**; model: {setup.get('model')}"
        + (f"; draft: {setup.get('draft')}" if setup.get("draft") else ""),
        f"- max new tokens {setup.get('max_new_tokens')}, draft length K = {setup.get('draft_len')}, temperature "
        f"{setup.get('temperature')}, top-p {setup.get('top_p')}; profile {setup.get('profile')}; "
        f"torch {setup.get('torch')} ({setup.get('threads')} CPU threads), transformers {setup.get('transformers')}; wall {setup.get('wall_s')} s",
        f"- reproduce: `{command}`" if command else "",
        "",
        "tok/s is the decode rate (tokens after the first / first-to-last-token time; TTFT separate); "
        "x greedy = tok/s over codespec `greedy` in the same run (aggregate), median x = median over requests "
        "of the per-request ratio; equiv. = requests whose output is token-identical to codespec `greedy`.",
        "",
    ]
    for workload, body in report["workloads"].items():
        out += [
            f"{h2} {workload} ({report['mode']}, {body['records']} {body.get('kind', '')} requests)",
            "",
            markdown_table(body["configs"]),
            "",
            "Acceptance by depth (P(draft i accepted | 1..i-1 accepted)):",
            "",
            depth_table(body["configs"]),
            "",
            "Verification time by draft length (p50 ms; the first step of each request, with the prefill, left out):",
            "",
            cost_table(body["configs"]),
            "",
        ]
        if body.get("auto_policy"):
            auto = body["configs"].get("auto", {})
            sources = auto.get("drafts_by_proposer")
            out += [
                (f"`auto`: drafts by source {sources}; " if sources else "`auto`: ")
                + f"fitted verification cost at the end (ms = a + b k for k >= 1 drafted tokens): "
                f"{body['auto_policy'].get('verify_fit_ms')}, plain step "
                f"{body['auto_policy'].get('plain_step_ms')} ms; planned cost(k) ms "
                f"{body['auto_policy'].get('cost_curve_ms')}",
                "",
            ]
    if len(report["workloads"]) > 1:
        out += [f"{h2} all workloads together", "", markdown_table(report["configs"]), ""]
    if report.get("sweeps"):
        out += [
            f"{h2} sweeps",
            "",
            "| parameter | value | workload | config | tok/s | x greedy | tok/fwd | equiv. |",
            "|---|---:|---|---|---:|---:|---:|---:|",
        ]
        for point in report["sweeps"]:
            for name, row in point["configs"].items():
                out.append(
                    f"| {point['parameter']} | {point['value']} | {point['workload']} | {name} | "
                    f"{_fmt(row['tokens_per_s'], '{:.1f}')} | {_fmt(row['speedup'], '{:.2f}')} | "
                    f"{_fmt(row['tokens_per_forward'], '{:.2f}')} | {_fmt(row['equivalence'], '{:.0%}')} |"
                )
        out.append("")
    load = report.get("load")
    if load:
        out += [
            f"{h2} offered load (websocket, {load['proposer']} proposer, {load['mode']} mode)",
            "",
            f"SLO: p95 time to first token <= {load['slo_ttft_ms']:.0f} ms; largest concurrency meeting it: "
            f"**{load['max_concurrency_within_slo']}**.",
            "",
            "| clients | requests | req/s | latency p50 ms | latency p95 ms | TTFT p50 ms | TTFT p95 ms | errors |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in load["levels"]:
            out.append(
                f"| {row['concurrency']} | {row['requests']} | {_fmt(row['requests_per_s'], '{:.2f}')} | "
                f"{_fmt(row['latency_ms_p50'], '{:.0f}')} | {_fmt(row['latency_ms_p95'], '{:.0f}')} | "
                f"{_fmt(row['ttft_ms_p50'], '{:.0f}')} | {_fmt(row['ttft_ms_p95'], '{:.0f}')} | {row['errors']} |"
            )
        ran: dict[str, int] = {}
        for row in load["levels"]:
            for name, count in (row.get("proposers") or {}).items():
                ran[name] = ran.get(name, 0) + count
        out += ["", f"Requests per proposer, as the server reported them: {ran}.", ""]
    if plots_note:
        out += [plots_note, ""]
    return "\n".join(out)


def write_plots(report: dict, directory: Path) -> str:
    """Acceptance by depth per configuration, speedup per workload, ITL distribution."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plots skipped: matplotlib is not installed (pip install 'codespec[bench]')"
    directory.mkdir(parents=True, exist_ok=True)
    written = []

    figure, axes = plt.subplots(figsize=(7, 4))
    for name, row in report["configs"].items():
        depth = row.get("acceptance_by_depth") or []
        if depth:
            axes.plot(range(1, len(depth) + 1), depth, marker=".", label=name)
    axes.set(
        xlabel="draft depth i",
        ylabel="P(accepted | previous accepted)",
        title=f"acceptance by depth ({report['mode']})",
    )
    axes.legend(fontsize=8)
    written.append(_save(figure, directory / "acceptance_by_depth.png"))

    figure, axes = plt.subplots(figsize=(7, 4))
    workloads = list(report["workloads"])
    names = list(report["configs"])
    width = 0.8 / max(len(names), 1)
    for offset, name in enumerate(names):
        values = [report["workloads"][w]["configs"].get(name, {}).get("speedup") or 0 for w in workloads]
        axes.bar([i + offset * width for i in range(len(workloads))], values, width, label=name)
    axes.set_xticks([i + 0.4 - width / 2 for i in range(len(workloads))], workloads)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set(ylabel="tokens/s over codespec greedy (same run)", title=f"speedup per workload ({report['mode']})")
    axes.legend(fontsize=7, ncol=2)
    written.append(_save(figure, directory / "speedup_per_workload.png"))

    figure, axes = plt.subplots(figsize=(7, 4))
    series = {name: row.get("itl_ms") or [] for name, row in report["configs"].items()}
    series = {name: values for name, values in series.items() if values}
    if series:
        axes.boxplot(list(series.values()), showfliers=False)
        axes.set_xticks(range(1, len(series) + 1), list(series), rotation=30, fontsize=8)
    axes.set(ylabel="inter-token latency (ms)", title="ITL distribution (between streamed steps)")
    written.append(_save(figure, directory / "itl_distribution.png"))
    return "plots: " + ", ".join(str(path) for path in written)


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(figure)
    return path
