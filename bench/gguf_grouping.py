"""How llama.cpp's logits depend on how a forward groups positions (docs/gguf.md, "Exactness").

For each prompt length P, 8 positions after a prompt of P tokens of a source file are computed
as one 8-position forward (the reference) and grouped otherwise: one position per forward (plain
decoding), 2 and 4 positions from the same start, 3 then 5 (a step after a verification), and one
position padded to two rows (the position again, removed after). Each grouping's largest absolute
logit difference from the reference, and how many greedy tokens it changes, are printed as JSON.

    python -m bench.gguf_grouping FILE.gguf [--lengths 50,200,333,1000] [--threads 2] [--keep]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).resolve().parents[1] / "codespec" / "core" / "decode.py"
POSITIONS = 8


def groupings(target, prompt: list[int], following: list[int], kept: list | None = None) -> dict[str, np.ndarray]:
    """Logits [8, V] of ``following`` after ``prompt``, per grouping. ``kept``: a list that keeps
    every sequence alive (as a busy server's other requests and cached documents stay in the shared
    KV buffer), so each grouping's sequence lands in other cells; None: each is freed after use."""

    def fresh():
        cache = target.new_cache()
        target.forward(prompt, cache)
        if kept is not None:
            kept.append(cache)
        return cache

    def split(sizes: list[int]) -> np.ndarray:
        cache, rows, start = fresh(), [], 0
        for size in sizes:
            chunk = following[start : start + size]
            rows.append(target.forward(chunk, cache, keep_last=size).numpy().copy())
            start += size
        return np.concatenate(rows)

    def padded() -> np.ndarray:
        cache, rows = fresh(), []
        for token in following:
            length = len(cache.token_ids)
            rows.append(target.forward([token, token], cache, keep_last=2)[0].numpy().copy())
            cache.rollback(length + 1)
        return np.stack(rows)

    return {
        "8": split([POSITIONS]),
        "1 each (plain decoding)": split([1] * POSITIONS),
        "2 each": split([2] * (POSITIONS // 2)),
        "4 each": split([4, 4]),
        "3 then 5": split([3, 5]),
        "1 padded to 2 rows": padded(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a GGUF file")
    parser.add_argument("--lengths", default="50,120,200,250,333,511,1000", help="prompt lengths, comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--keep", action="store_true", help="keep every sequence in the shared KV buffer (a busy server's cells)"
    )
    args = parser.parse_args(argv)
    from codespec.core.llama_cpp_target import LlamaCppTarget

    target = LlamaCppTarget(args.model, threads=args.threads)
    ids = target.encode(SOURCE.read_text(encoding="utf-8"))
    rows = []
    kept: list | None = [] if args.keep else None
    for length in (int(value) for value in args.lengths.split(",")):
        if length + POSITIONS > len(ids):
            continue
        logits = groupings(target, ids[:length], ids[length : length + POSITIONS], kept)
        reference = logits.pop("8")
        rows.append(
            {
                "prompt_tokens": length,
                **{
                    name: {
                        "max_abs_logit_difference": float(np.abs(other - reference).max()),
                        "greedy_tokens_changed": int((other.argmax(1) != reference.argmax(1)).sum()),
                    }
                    for name, other in logits.items()
                },
            }
        )
    report = {"model": args.model, "threads": args.threads, "positions": POSITIONS, "keep": args.keep, "rows": rows}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
