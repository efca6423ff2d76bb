"""Resident memory of a loaded target over many distinct prompt lengths (a benchmark, not a test).

    python -m bench.kernel_memory --model DIR [--lengths 120] [--threads 1]
    CODESPEC_CPU_LINEAR=stock python -m bench.kernel_memory --model DIR   # PyTorch's linear

A long-running server meets a new prompt length with nearly every request. oneDNN builds and caches
a kernel per product shape, so packed linears must not add memory per new length
(codespec/linear.py ``row_blocks``). This loads the model the product's way, prefills prompts of
``--lengths`` distinct lengths (40, 43, 46, ...), each followed by four verification-sized steps
(1, 5, 9 and 17 positions), and prints anonymous / file-backed resident memory after loading and at
a few points along the way: growth after the first lengths is what a server would accumulate.
"""

from __future__ import annotations

import argparse
import gc
import json
import time

from bench.measure import status_mb


def resident_mib() -> dict[str, float | None]:
    """VmRSS, RssAnon and RssFile of this process in MiB (Linux /proc/self/status)."""
    return {key: status_mb(key) for key in ("VmRSS", "RssAnon", "RssFile")}


def measure(model: str, lengths: int, device: str = "cpu") -> dict:
    import torch

    from codespec.core.model import TargetModel

    started = time.perf_counter()
    target = TargetModel.load(model, device=device)
    report: dict = {"model": model, "packed_linears": target.packed_linears, "load_s": time.perf_counter() - started}
    report["after_load"] = resident_mib()
    marks = {max(1, lengths // 10), lengths // 3, 2 * lengths // 3, lengths}
    report["after_lengths"] = {}
    with torch.inference_mode():
        for done, length in enumerate(range(40, 40 + 3 * lengths, 3), 1):
            cache = target.new_cache()
            target.forward(list(range(5, 5 + length)), cache, keep_last=1)
            for rows in (1, 5, 9, 17):
                target.forward(list(range(7, 7 + rows)), cache, keep_last=rows)
            if done in marks:
                gc.collect()
                report["after_lengths"][done] = resident_mib()
    report["wall_s"] = time.perf_counter() - started
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kernel_memory", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="model directory (e.g. python -m bench.shapes save ...)")
    parser.add_argument("--lengths", type=int, default=120, help="distinct prompt lengths")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    print(json.dumps(measure(args.model, args.lengths, args.device), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
