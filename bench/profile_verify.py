"""Where a verification forward's time goes: cost(K) at a model shape, by part, against its bound.

    python -m bench.profile_verify [--shape qwen2.5-coder-0.5b] [--context 1000] [--ks 0 1 2 4 8 16 32]
                                   [--kernels transformers gqa codespec] [--repeats 5] [--threads 1]
                                   [--prefill 512] [--json OUT.json] [--markdown OUT.md]

A verification forward scores K drafted tokens plus one (K + 1 positions, ``logits_to_keep = K + 1``)
after a cache of ``--context`` tokens; K = 0 is a plain decoding step. For each K and each kernel
set it reports the forward's time (median of ``--repeats``; on a CPU with one torch thread the
thread's CPU time, which other processes on a shared machine do not inflate) split into

- body linears: the decoder layers' projections (weights traffic + the GEMM arithmetic),
- LM head: the output projection over the K + 1 kept rows (the whole vocabulary per row),
- attention: the attention function (SDPA over the cache, with a mask when K > 0),
- mask: building the causal mask for K + 1 queries over the cache,
- KV cache: appending the K + 1 positions to the cache (transformers' concatenation),
- other: the rest (norms, RoPE, embedding lookup, activations, residuals, Python),

plus the rollback after it, prefill per token (one forward over ``--prefill`` tokens), and the
measured bound: what streaming the weights once (at this machine's measured read bandwidth) and the
forward's arithmetic (at the measured packed-GEMM rate) alone would cost. Kernel sets:
``transformers`` (transformers' sdpa and PyTorch's linear, as users run it), ``gqa`` (codespec's
native-GQA attention, PyTorch's linear: codespec before packed linears), ``codespec`` (native GQA and
oneDNN on packed weights: what codespec runs now). Variants run interleaved per repetition.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from bench.measure import cpu_model

PARTS = ("body linears", "LM head", "attention", "mask", "KV cache", "other")
KERNELS = ("transformers", "gqa", "codespec")


class Clock:
    """Thread CPU time on a one-thread CPU run (robust on a shared machine), wall time otherwise."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.cpu_time = device.type == "cpu" and torch.get_num_threads() == 1
        self.kind = "thread CPU time" if self.cpu_time else "wall time"

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.thread_time() if self.cpu_time else time.perf_counter()


class PartTimer:
    """Adds up the time spent inside each instrumented part during one forward."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.spent: dict[str, float] = defaultdict(float)
        self._depth = 0

    def wrap(self, part: str, function: Callable) -> Callable:
        def timed(*args, **kwargs):
            if self._depth:  # nested parts count once, in the outer one
                return function(*args, **kwargs)
            self._depth += 1
            start = self.clock()
            try:
                return function(*args, **kwargs)
            finally:
                self.spent[part] += self.clock() - start
                self._depth -= 1

        return timed


def _restore(owner, name: str, previous) -> None:
    """Put back what ``owner.name`` was: ``previous`` in the instance, or (None) the class's."""
    if previous is not None:
        setattr(owner, name, previous)
    else:
        delattr(owner, name)


@contextlib.contextmanager
def instrumented(model, cache, timer: PartTimer) -> Iterator[None]:
    """Time the parts of ``model``'s forward (module forwards, the attention and mask functions, the
    cache update) for as long as the context lasts; everything is restored afterwards."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    head = model.get_output_embeddings()
    undo: list[Callable[[], None]] = []
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            part = "LM head" if module is head else "body linears"
            had = "forward" in vars(module)
            previous = module.forward
            module.forward = timer.wrap(part, previous)  # type: ignore[method-assign]  # undone below
            undo.append(functools.partial(_restore, module, "forward", previous if had else None))
    implementation = model.config._attn_implementation
    attention = ALL_ATTENTION_FUNCTIONS[implementation]
    masks = AttentionMaskInterface._global_mapping
    AttentionInterface.register("codespec_profiled", timer.wrap("attention", attention))
    AttentionMaskInterface.register("codespec_profiled", masks.get(implementation, masks["sdpa"]))  # type: ignore[arg-type]  # transformers types the map by value
    model.config._attn_implementation = "codespec_profiled"
    undo.append(lambda: setattr(model.config, "_attn_implementation", implementation))
    modeling = sys.modules[type(model).__module__]
    for name in ("create_causal_mask", "create_sliding_window_causal_mask"):
        if hasattr(modeling, name):
            original = getattr(modeling, name)
            setattr(modeling, name, timer.wrap("mask", original))
            undo.append(functools.partial(setattr, modeling, name, original))
    update = cache.hf_cache.update
    cache.hf_cache.update = timer.wrap("KV cache", update)
    undo.append(lambda: delattr(cache.hf_cache, "update"))
    try:
        yield
    finally:
        for step in reversed(undo):
            step()


@contextlib.contextmanager
def kernels(target, name: str) -> Iterator[None]:
    from codespec.core.attention import stock_attention
    from codespec.core.linear import stock_linears

    attention = stock_attention(target.model) if name == "transformers" else contextlib.nullcontext()
    linear = stock_linears(target.model) if name in ("transformers", "gqa") else contextlib.nullcontext()
    with attention, linear:
        yield


# -- the bound -------------------------------------------------------------------------------------
def forward_work(model, context: int, k: int) -> dict:
    """Bytes of weights a forward streams and its arithmetic (FLOPs) for K + 1 positions."""
    config = model.config
    positions = k + 1
    linear_params = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    norm_params = sum(p.numel() for name, p in model.named_parameters() if "norm" in name)
    element = next(model.parameters()).element_size()
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    keys = context + positions
    attention_flops = 2 * 2 * positions * keys * head_dim * heads * config.num_hidden_layers  # QK^T and PV
    return {
        "weight_bytes": (linear_params + norm_params) * element,
        "flops": 2 * positions * linear_params + attention_flops,
        "attention_flops": attention_flops,
    }


def machine_rates(clock: Clock, device: torch.device, dtype: torch.dtype, repeats: int = 5) -> dict:
    """Measured read bandwidth (a one-row GEMM over a 512 MB weight, as a one-token LM head does, and
    a plain sum) and arithmetic rate (a packed GEMM of 256 rows on a cache-resident weight)."""
    from codespec.core.linear import onednn_available

    def best(run: Callable[[], object]) -> float:
        run()
        times = []
        for _ in range(repeats):
            start = clock()
            run()
            times.append(clock() - start)
        return min(times)

    rates: dict = {}
    element = torch.empty((), dtype=dtype).element_size()
    big = torch.randn((512 * 2**20) // (896 * element), 896, dtype=dtype, device=device)  # 512 MB, past any cache
    row = torch.randn(1, 896, dtype=dtype, device=device)
    nbytes = big.numel() * big.element_size()
    rates["read_GBps_sum"] = nbytes / best(lambda: big.sum()) / 1e9
    if device.type == "cpu" and onednn_available():
        packed = torch.ops.mkldnn._reorder_linear_weight(big, None)
        rates["read_GBps_gemv"] = (
            nbytes / best(lambda: torch.ops.mkldnn._linear_pointwise(row, packed, None, "none", [], "")) / 1e9
        )
        weight = torch.randn(4864, 896, dtype=dtype)
        packed_small = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        rows = torch.randn(256, 896, dtype=dtype)
        flops = 2 * 256 * weight.numel()
        rates["gemm_GFLOPs_packed"] = (
            flops / best(lambda: torch.ops.mkldnn._linear_pointwise(rows, packed_small, None, "none", [], "")) / 1e9
        )
        rates["gemm_GFLOPs_mkl"] = flops / best(lambda: torch.nn.functional.linear(rows, weight)) / 1e9
    else:
        rates["read_GBps_gemv"] = nbytes / best(lambda: row @ big.t()) / 1e9
        weight = torch.randn(8192, 8192, dtype=dtype, device=device)
        rows = torch.randn(4096, 8192, dtype=dtype, device=device)
        rates["gemm_GFLOPs_packed"] = 2 * 4096 * weight.numel() / best(lambda: rows @ weight.t()) / 1e9
    rates["read_GBps"] = max(rates["read_GBps_sum"], rates["read_GBps_gemv"])
    return {key: round(value, 2) for key, value in rates.items()}


def bound_ms(work: dict, rates: dict) -> dict:
    traffic = work["weight_bytes"] / (rates["read_GBps"] * 1e9) * 1e3
    arithmetic = work["flops"] / (rates["gemm_GFLOPs_packed"] * 1e9) * 1e3
    return {
        "traffic_ms": round(traffic, 2),
        "arithmetic_ms": round(arithmetic, 2),
        "bound_ms": round(max(traffic, arithmetic), 2),
        "no_overlap_ms": round(traffic + arithmetic, 2),
    }


# -- the profile -----------------------------------------------------------------------------------
def profile(
    target, context: int, ks: list[int], variants: list[str], repeats: int, prefill: int, seed: int = 0
) -> dict:
    clock = Clock(target.device)
    generator = torch.Generator().manual_seed(seed)
    vocabulary = min(len(target.tokenizer), target.vocab_size)
    prompt = torch.randint(0, vocabulary, (context,), generator=generator).tolist()
    drafts = {k: torch.randint(0, vocabulary, (k + 1,), generator=generator).tolist() for k in ks}
    cache = target.new_cache()
    target.forward(prompt, cache)
    samples: dict[str, dict[int, list[dict]]] = {v: {k: [] for k in ks} for v in variants}
    for variant in variants:  # warm every path once
        with kernels(target, variant):
            for k in ks:
                target.forward(drafts[k], cache, keep_last=k + 1)
                cache.rollback(context)
    for _ in range(repeats):
        for variant in variants:  # interleaved: drift spreads over every variant
            with kernels(target, variant):
                for k in ks:
                    timer = PartTimer(clock)
                    with instrumented(target.model, cache, timer):
                        start = clock()
                        target.forward(drafts[k], cache, keep_last=k + 1)
                        total = clock() - start
                    start = clock()
                    cache.rollback(context)
                    rollback = clock() - start
                    parts = {part: timer.spent.get(part, 0.0) for part in PARTS[:-1]}
                    parts["other"] = max(total - sum(parts.values()), 0.0)
                    samples[variant][k].append({"total": total, "rollback": rollback, **parts})
    result: dict = {"clock": clock.kind, "variants": {}}
    for variant in variants:
        rows = {}
        for k in ks:
            runs = samples[variant][k]
            median = {key: statistics.median(run[key] for run in runs) * 1e3 for key in runs[0]}
            rows[k] = {key: round(value, 2) for key, value in median.items()}
        base = rows[ks[0]]["total"] if ks[0] == 0 else None
        for k in ks:
            rows[k]["x_plain"] = round(rows[k]["total"] / base, 3) if base else None
        result["variants"][variant] = rows
    if prefill:
        ids = torch.randint(0, vocabulary, (prefill,), generator=generator).tolist()
        result["prefill"] = {}
        for variant in variants:
            with kernels(target, variant):
                times = []
                for _ in range(max(2, repeats // 2)):
                    fresh = target.new_cache()
                    start = clock()
                    target.forward(ids, fresh)
                    times.append(clock() - start)
            result["prefill"][variant] = {
                "tokens": prefill,
                "ms": round(min(times) * 1e3, 1),
                "ms_per_token": round(min(times) * 1e3 / prefill, 3),
            }
    return result


def markdown(report: dict) -> str:
    lines = [
        f"cost(K) at `{report['shape']}`, {report['device']} {report['dtype']}, {report['threads']} torch "
        f"thread(s), cache of {report['context']} tokens; {report['clock']}, median of {report['repeats']}; "
        f"ms (x = over the same kernels' K = 0)",
        "",
    ]
    variants = list(report["variants"])
    ks = list(next(iter(report["variants"].values())))
    header = "| K | " + " | ".join(f"{v} ms | x" for v in variants) + " | bound ms (traffic / arithmetic) |"
    lines += [header, "|---:|" + "---:|---:|" * len(variants) + "---:|"]
    for k in ks:
        bound = report["bound"][str(k)]
        cells = " | ".join(
            f"{report['variants'][v][k]['total']:.1f} | {report['variants'][v][k]['x_plain'] or 0:.2f}"
            for v in variants
        )
        lines.append(
            f"| {k} | {cells} | {bound['bound_ms']:.1f} ({bound['traffic_ms']:.1f} / {bound['arithmetic_ms']:.1f}) |"
        )
    for variant in variants:
        lines += [
            "",
            f"`{variant}`: where the time goes (ms)",
            "",
            "| K | total | " + " | ".join(PARTS) + " | rollback |",
            "|---:|" + "---:|" * (len(PARTS) + 2),
        ]
        for k in ks:
            row = report["variants"][variant][k]
            lines.append(
                f"| {k} | {row['total']:.1f} | "
                + " | ".join(f"{row[p]:.1f}" for p in PARTS)
                + f" | {row['rollback']:.2f} |"
            )
    if report.get("prefill"):
        lines += [
            "",
            "prefill: "
            + "; ".join(
                f"{v} {p['ms_per_token']:.2f} ms/token ({p['tokens']} tokens)" for v, p in report["prefill"].items()
            ),
        ]
    rates = report["rates"]
    lines += [
        "",
        f"machine: read {rates['read_GBps']:.1f} GB/s, packed GEMM {rates['gemm_GFLOPs_packed']:.0f} GFLOP/s"
        + (f" (MKL {rates['gemm_GFLOPs_mkl']:.0f})" if "gemm_GFLOPs_mkl" in rates else "")
        + f"; weights {report['work']['0']['weight_bytes'] / 1e9:.2f} GB",
    ]
    return "\n".join(lines) + "\n"


def build_target(shape: str, device: str, dtype: str, model: str | None = None):
    from bench.models import bench_tokenizer, random_target
    from codespec.core.model import TargetModel

    if model:
        return TargetModel.load(model, device=device, dtype=dtype)
    tokenizer, _ = bench_tokenizer()
    return random_target(shape, tokenizer, device, dtype, max_context=32768)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen2.5-coder-0.5b")
    parser.add_argument("--model", help="a model directory instead of a random shape")
    parser.add_argument("--context", type=int, default=1000, help="tokens already in the cache")
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2, 4, 8, 16, 32])
    parser.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prefill", type=int, default=512, help="prefill length for the per-token figure (0: skip)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    target = build_target(args.shape, args.device, args.dtype, args.model)
    if "codespec" in args.kernels and not target.packed_linears:  # CODESPEC_CPU_LINEAR=stock turned it off
        from codespec.core.linear import pack_linears

        target.packed_linears = pack_linears(target.model)
    ks = sorted(set(args.ks))
    with torch.inference_mode():
        measured = profile(target, args.context, ks, args.kernels, args.repeats, args.prefill)
        rates = machine_rates(Clock(target.device), target.device, target.dtype)
    work = {str(k): forward_work(target.model, args.context, k) for k in ks}
    report = {
        "shape": args.model or args.shape,
        "device": str(target.device),
        "dtype": str(target.dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
        "context": args.context,
        "repeats": args.repeats,
        "packed_linears": target.packed_linears,
        **measured,
        "rates": rates,
        "work": work,
        "bound": {k: bound_ms(w, rates) for k, w in work.items()},
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    text = markdown(report)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
