"""Linear layers on CPU through oneDNN with weights packed once (the forwards codespec runs).

PyTorch's CPU ``linear`` goes to MKL's GEMM. On the AMD EPYC (Zen 5, AVX-512) CPUs this project
runs on, MKL picks slow kernels for the shapes speculative decoding lives on: a few rows (the K+1
verified positions) against a large weight. Measured on one core (bench/profile_verify.py,
docs/benchmarks.md "Where a verification forward's time goes"): the qwen2.5-coder-0.5b LM head
(151,936 x 896) takes 32 ms for 1 row and 106 ms for 17 rows with MKL (44 GFLOP/s), 14 ms and 29 ms
with oneDNN on a weight reordered once into its blocked layout (150+ GFLOP/s). A whole
0.5b verification forward over 17 positions drops from 363 ms to ~150 ms and a one-token forward
from 119 ms to ~73 ms.

``pack_linears(model)`` reorders every ``nn.Linear`` weight of a CPU model (fp32 or bf16) once and
gives the module a forward that calls oneDNN's linear on the packed weight (PyTorch's for products
too small to amortise oneDNN's fixed cost per call, ``MIN_WORK``). The dense weight stays
(state dicts, transformers' own generate under ``stock_linears``, tied embeddings read it), so a
packed model holds its linear weights twice: +2.0 GB for the 0.5b in fp32. Anywhere else (CUDA,
MPS, fp16, a torch without the oneDNN ops, autograd wanting weight gradients) a module keeps
PyTorch's linear. ``TargetModel`` packs only with ``CODESPEC_CPU_LINEAR=onednn`` (off by default:
twice the linear weights in memory, and oneDNN's primitive cache grows with every new input length,
about 0.4 MiB per new prompt length in a long-running server); ``stock`` forces packing off here too.

A weight written in place after packing (its tensor version moves) is packed again on the next
forward. Results differ from MKL's in the last bits (another summation order), as a K+1-row GEMM differs from
a one-row one; exactness of speculative decoding is unaffected (both sides run the same kernels).
"""

from __future__ import annotations

import os
import types
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

ENV = "CODESPEC_CPU_LINEAR"  # "stock": leave PyTorch's linear in place
# rows x weight elements below which MKL's call is cheaper than oneDNN's (~10 us fixed per call),
# measured on this CPU class: 256x256 is faster in MKL for 1-2 rows, in oneDNN from ~16 rows;
# 896x896 from 2 rows; 4096x256 and larger at every row count.
MIN_WORK = 1 << 20
_PACKED = "_codespec_packed_weight"


def onednn_available() -> bool:
    ops = getattr(torch.ops, "mkldnn", None)
    return (
        torch.backends.mkldnn.is_available()
        and ops is not None
        and hasattr(ops, "_linear_pointwise")
        and hasattr(ops, "_reorder_linear_weight")
    )


def _packed_forward(self, input: torch.Tensor) -> torch.Tensor:
    """``nn.Linear.forward`` on the packed weight: input [..., in] -> [..., out]."""
    if torch.is_grad_enabled() and (input.requires_grad or self.weight.requires_grad):
        return F.linear(input, self.weight, self.bias)  # training: gradients need PyTorch's op
    if input.dtype != self.weight.dtype or input.device.type != "cpu":
        return F.linear(input, self.weight, self.bias)
    rows = input.reshape(-1, input.shape[-1])  # [N, in]
    if rows.shape[0] * self.weight.numel() < MIN_WORK:  # too small: oneDNN's ~10 us per call would dominate
        return F.linear(input, self.weight, self.bias)
    packed = getattr(self, _PACKED).of(self.weight)
    output = torch.ops.mkldnn._linear_pointwise(rows, packed, self.bias, "none", [], "")  # [N, out]
    return output.reshape(*input.shape[:-1], output.shape[-1])


def _version(weight: torch.Tensor) -> int:
    """The tensor's in-place write counter (an inference tensor keeps none: -2, never repacked)."""
    return -2 if weight.is_inference() else weight._version


class Packed:
    """A module's weight in oneDNN's layout, packed again whenever the weight was written in place
    (its tensor version moved). Copies and pickles carry no packed tensor (an opaque oneDNN tensor has
    no storage to copy): they pack on first use."""

    def __init__(self, weight: torch.Tensor | None = None) -> None:
        self.tensor: torch.Tensor | None = None
        self.version = -1
        if weight is not None:
            self.of(weight)

    def of(self, weight: torch.Tensor) -> torch.Tensor:
        version = _version(weight)
        if self.tensor is None or self.version != version:
            with torch.no_grad():
                self.tensor = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
            self.version = version
        return self.tensor

    def __deepcopy__(self, memo) -> Packed:
        return Packed()

    def __getstate__(self) -> dict:
        return {"tensor": None, "version": -1}


def pack_linears(model) -> int:
    """Pack every CPU fp32 / bf16 ``nn.Linear`` of ``model``; returns how many were packed."""
    if os.environ.get(ENV, "").lower() == "stock" or not onednn_available():
        return 0
    packed = 0
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear) or hasattr(module, _PACKED):
            continue
        weight = module.weight
        if weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16):
            continue
        if module.bias is not None and module.bias.dtype != weight.dtype:
            continue
        setattr(module, _PACKED, Packed(weight))
        module.forward = types.MethodType(_packed_forward, module)  # type: ignore[method-assign]
        packed += 1
    return packed


def is_packed(module) -> bool:
    return hasattr(module, _PACKED) and "forward" in vars(module)


@contextmanager
def stock_linears(*models) -> Iterator[None]:
    """Run ``models`` with PyTorch's own linear for a while (the benchmark's transformers peers)."""
    switched = [module for model in models if model is not None for module in model.modules() if is_packed(module)]
    for module in switched:
        del module.forward  # the class's forward again
    try:
        yield
    finally:
        for module in switched:
            module.forward = types.MethodType(_packed_forward, module)
