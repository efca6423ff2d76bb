"""Where a traced vLLM server's time went: decoding steps, steps that also prefilled, and the
drafter's own time, from the step trace codespec's drafter writes (``CODESPEC_VLLM_TRACE``).

    python -m bench.vllm_trace TRACE [TRACE ...] [--out REPORT]

Each trace line is one call of the drafter: ``step_ms`` is the time since its last call returned
(vLLM's forward, sampling and scheduling: the step), ``propose_ms`` its own time, ``prefilled``
whether a prompt's chunk ran in that step. A step longer than ``--gap-ms`` is the server waiting
for requests (between a benchmark's slices), not work: it is left out of the busy time whole, with
the forward it ends in (a slice's first prefill; ``waits`` counts them). What
speculation can shorten is the decoding steps; the steps with a prefill cost what they cost
with or without drafts, and the drafter's time is added to every step.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

GAP_MS = 1000.0  # a step this long waited for requests


def busy_time(records: list[dict], gap_ms: float = GAP_MS) -> dict:
    """The busy time of one server's trace, split by what ran, and what its rows did."""
    worked = [r for r in records if r["step_ms"] < gap_ms]
    decode_ms = sum(r["step_ms"] for r in worked if not r["prefilled"])
    prefill = [r["step_ms"] for r in worked if r["prefilled"]]
    drafter_ms = sum(r["propose_ms"] for r in records)
    # the drafter's time in the calls after a prefill: new sequences' first plans happen there
    drafter_after_prefill_ms = sum(r["propose_ms"] for r in records if r["prefilled"])
    prefill_ms = sum(prefill)
    busy_ms = decode_ms + prefill_ms + drafter_ms
    row_steps = sum(len(r["rows"]) for r in records)
    rows: Counter = Counter()
    for record in records:
        for row in record["rows"]:
            how = "served" if row["served"] else ("drafted" if row["drafted"] > 0 else "plain")
            rows[how] += 1

    def share(ms: float) -> float:
        return round(ms / busy_ms, 3) if busy_ms else 0.0

    return {
        "steps": len(records),
        "busy_ms": round(busy_ms, 1),
        "decode_ms": round(decode_ms, 1),
        "decode_share": share(decode_ms),
        "prefill_steps": len(prefill),
        "prefill_ms": round(prefill_ms, 1),
        "prefill_share": share(prefill_ms),
        "drafter_ms": round(drafter_ms, 1),
        "drafter_share": share(drafter_ms),
        "drafter_after_prefill_ms": round(drafter_after_prefill_ms, 1),
        "drafter_us_per_row_step": round(1e3 * drafter_ms / row_steps, 1) if row_steps else 0.0,
        "waits": len(records) - len(worked),
        "row_steps": row_steps,
        "rows": dict(rows),
        "drafted_tokens": sum(row["drafted"] for record in records for row in record["rows"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--gap-ms", type=float, default=GAP_MS, help="a longer step waited for requests")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    report = {}
    for path in args.traces:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        report[path.name] = busy_time(records, args.gap_ms)
        print(json.dumps({"trace": path.name, **report[path.name]}))
    if args.out:
        args.out.write_text(json.dumps({"gap_ms": args.gap_ms, "traces": report}, indent=1) + "\n")


if __name__ == "__main__":
    main()
