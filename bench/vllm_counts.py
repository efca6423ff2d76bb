"""What vLLM-CPU's first step of a new token count costs in its matrix multiplies, against a later step
of the same count: vLLM's own oneDNN linear (``vllm._custom_ops.create_onednn_mm`` / ``onednn_mm``,
what vLLM-CPU runs for an unquantized linear layer) at the shipped model's shapes, every linear layer
of every block and the output head, one step's worth per token count.

    <vLLM's python> -m bench.vllm_counts [--counts 40] [--model DIR]

oneDNN builds a kernel (a "primitive") per token count; vLLM keeps 32 per weight shape, oneDNN itself
1,024 in all. The drafter measures the same extra in vLLM's step times and cuts drafts to land on
counts already run (``codespec/vllm_proposer/shapes.py``, docs/vllm.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "codespec" / "models" / "default" / "target"


def linear_shapes(config: dict) -> list[tuple[int, int]]:
    """(in, out) of one block's linear layers (fused as vLLM fuses them) and of the output head."""
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    head = hidden // config["num_attention_heads"]
    qkv = hidden + 2 * config["num_key_value_heads"] * head
    return [(hidden, qkv), (hidden, hidden), (hidden, 2 * inner), (inner, hidden)]


def main() -> None:
    from vllm import _custom_ops as ops

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=SHIPPED)
    parser.add_argument("--counts", type=int, default=40, help="token counts timed (each new, then again)")
    args = parser.parse_args()
    config = json.loads((args.model / "config.json").read_text())
    torch.manual_seed(0)
    blocks = config["num_hidden_layers"]
    layers = [
        (ops.create_onednn_mm(torch.randn(out, inp).t(), 32), inp)
        for _ in range(blocks)
        for inp, out in linear_shapes(config)
    ]
    head = torch.randn(config["vocab_size"], config["hidden_size"])
    layers.append((ops.create_onednn_mm(head.t(), 32), config["hidden_size"]))

    def step(count: int) -> float:
        inputs = {width: torch.randn(count, width) for width in {width for _, width in layers}}
        began = time.perf_counter()
        for handler, width in layers:
            ops.onednn_mm(handler, inputs[width], None)
        return 1e3 * (time.perf_counter() - began)

    step(1)  # the first call's one-off setup
    counts = range(2, 2 + args.counts)
    first = [step(count) for count in counts]
    again = [step(count) for count in counts]
    print(
        json.dumps(
            {
                "model": "shipped" if args.model == SHIPPED else args.model.name,
                "linear_layers": len(layers),
                "counts": args.counts,
                "first_step_ms_p50": round(statistics.median(first), 3),
                "again_ms_p50": round(statistics.median(again), 3),
                "extra_ms_p50": round(statistics.median(f - a for f, a in zip(first, again)), 3),
            }
        )
    )


if __name__ == "__main__":
    main()
