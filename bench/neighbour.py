"""A CPU-bound neighbour for measurements under contention (docs/benchmarks.md, "The policy on a
busy machine"): what an editor user's machine runs beside codespec, until killed or for a time.

    python -m bench.neighbour python 2 --seconds 600      # two busy pure-Python processes
    python -m bench.neighbour torch 2 --seconds 600       # a small training loop on 2 threads
    python -m bench.neighbour torch 2 --on 2 --off 2      # the same, 2 s on and 2 s off
"""

from __future__ import annotations

import argparse
import multiprocessing
import time


def spin(seconds: float) -> None:
    """Integer arithmetic in the interpreter: one core, little memory traffic."""
    end = time.monotonic() + seconds
    total = 0
    while time.monotonic() < end:
        for i in range(100_000):
            total += i * i


def train(seconds: float, threads: int, on: float, off: float) -> None:
    """A model-building job: an MLP trained with AdamW, compute and memory bound, on ``threads``
    OpenMP threads; with ``on``/``off`` the load comes and goes."""
    import torch

    torch.set_num_threads(threads)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024))
    optimizer = torch.optim.AdamW(model.parameters())
    batch = torch.randn(256, 1024)
    end = time.monotonic() + seconds
    phase = time.monotonic()
    while time.monotonic() < end:
        if on and time.monotonic() - phase > on:
            time.sleep(off)
            phase = time.monotonic()
        loss = model(batch).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.neighbour", description=__doc__)
    parser.add_argument("kind", choices=("python", "torch"))
    parser.add_argument("width", type=int, help="processes (python) or threads (torch)")
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--on", type=float, default=0.0, help="torch: seconds of load per phase (0: always)")
    parser.add_argument("--off", type=float, default=0.0, help="torch: seconds of rest per phase")
    args = parser.parse_args()
    if args.kind == "torch":
        train(args.seconds, args.width, args.on, args.off)
        return
    workers = [multiprocessing.Process(target=spin, args=(args.seconds,)) for _ in range(args.width)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


if __name__ == "__main__":
    main()
