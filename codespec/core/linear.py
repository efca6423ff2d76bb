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
gives the module a forward that calls oneDNN's linear on the packed weight (in bf16, PyTorch's for
products too small to amortise oneDNN's fixed cost per call, ``MIN_WORK``; in fp32 always oneDNN,
so that a row's result never depends on how many rows share the call: batch invariance,
codespec/ragged.py). The dense weight stays
(state dicts, transformers' own generate under ``stock_linears``, tied embeddings read it), so a
packed model holds its linear weights twice (+2.0 GB for the 0.5b in fp32), unless
``release_dense`` frees the dense copies that the packed ones replace (``TargetModel.load`` does:
then only a tied LM head is held twice, +0.5 GB at 0.5b). Anywhere else (CUDA,
MPS, fp16, a torch without the oneDNN ops, autograd wanting weight gradients) a module keeps
PyTorch's linear. ``TargetModel`` packs by default; ``CODESPEC_CPU_LINEAR=stock`` leaves PyTorch's
linear everywhere. oneDNN builds and caches a kernel per product shape; with every new prompt length
that cache grew by ~0.4 MiB in a long-running server, so inputs longer than one step's rows run in
blocks of a few fixed row counts (``row_blocks``): over 120 distinct prompt lengths at 0.5b the
resident size then grows as much as with PyTorch's linear (+51 vs +63 MiB, allocator noise).

A weight written in place after packing (its tensor version moves) is packed again on the next
forward. Results differ from MKL's in the last bits (another summation order). In fp32 oneDNN gives a
row the same bits in a product of any 2+ rows, and a one-row product runs as two, so a position's
logits are the same whether it is verified in a K+1-row step, decoded plainly, or batched with other
requests (measured over 2-256 rows at the 0.5b widths; tests/test_ragged.py).
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
    state: Packed = getattr(self, _PACKED)
    if torch.is_grad_enabled() and (input.requires_grad or self.weight.requires_grad):
        return F.linear(input, state.dense(self.weight), self.bias)  # training: gradients need PyTorch's op
    if input.dtype != state.dtype or input.device.type != "cpu":
        return F.linear(input, state.dense(self.weight), self.bias)
    rows = input.reshape(-1, input.shape[-1])  # [N, in]
    if state.dtype != torch.float32 and rows.shape[0] * state.numel < MIN_WORK:
        # too small: oneDNN's ~10 us per call would dominate (bf16 is not batch invariant anyway)
        return F.linear(input, state.dense(self.weight), self.bias)
    packed = state.of(self.weight)
    output = _bounded_rows(rows, packed, self.bias, state.one_row_differs(packed, self.bias))  # [N, out]
    return output.reshape(*input.shape[:-1], output.shape[-1])


# oneDNN builds (and caches) a kernel per product shape. Row counts up to EXACT_ROWS (one step's K+1
# verified positions) run as they are; longer inputs (a prefill: every prompt length is new) run in
# blocks of BLOCK_ROWS rows, the last one padded to a multiple of PAD_ROWS, so a weight meets at most
# EXACT_ROWS + BLOCK_ROWS / PAD_ROWS shapes whatever the prompt lengths (a server's cache stays small).
EXACT_ROWS = 64
BLOCK_ROWS = 256
PAD_ROWS = 64


def row_blocks(count: int) -> list[tuple[int, int, int]]:
    """(start, rows, padded rows) of each block a product of ``count`` rows runs in."""
    if count <= EXACT_ROWS:
        return [(0, count, count)]
    blocks = []
    for start in range(0, count, BLOCK_ROWS):
        size = min(BLOCK_ROWS, count - start)
        blocks.append((start, size, size if size == BLOCK_ROWS else -(-size // PAD_ROWS) * PAD_ROWS))
    return blocks


def _bounded_rows(
    rows: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, pad_one: bool = False
) -> torch.Tensor:
    """rows [N, in] -> [N, out] through kernels of a bounded set of row counts (``row_blocks``).

    ``pad_one``: run one row as two (the second zero, dropped). For some weights (wide inputs:
    the 0.5b's MLP down projection) oneDNN's one-row fp32 kernel sums in another order than its
    kernels for 2+ rows, which give each row the same bits whatever the other rows (measured over
    2-256 rows and row offsets, docs/architecture.md "Batching"); ``Packed`` finds out which weights
    once, so the rest keep the one-row kernel (padding every product cost 8% of a one-token forward
    at 0.5b). So a sequence's logits do not depend on what shares its batch, nor on whether it drafted."""
    if pad_one and rows.shape[0] == 1:
        return _bounded_rows(F.pad(rows, (0, 0, 0, 1)), packed, bias)[:1]
    outputs = []
    for start, size, padded in row_blocks(rows.shape[0]):
        block = rows[start : start + size]  # [size, in]
        if padded != size:
            block = F.pad(block, (0, 0, 0, padded - size))  # zero rows, dropped below
        outputs.append(torch.ops.mkldnn._linear_pointwise(block, packed, bias, "none", [], "")[:size])
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs)


def _version(weight: torch.Tensor) -> int:
    """The tensor's in-place write counter (an inference tensor keeps none: -2, never repacked)."""
    return -2 if weight.is_inference() else weight._version


class Packed:
    """A module's weight in oneDNN's layout, packed again whenever the weight was written in place
    (its tensor version moved). Copies and pickles carry no packed tensor (an opaque oneDNN tensor has
    no storage to copy): they pack on first use.

    ``release(module)`` frees the module's dense weight (the Parameter keeps its place, empty): the
    packed tensor is then the only copy, ``dense()`` rebuilds the dense one where a caller needs it
    (autograd, another dtype, transformers' own linear under ``stock_linears``, a copy)."""

    def __init__(self, weight: torch.Tensor | None = None) -> None:
        self.tensor: torch.Tensor | None = None
        self.version = -1
        self._one_row_differs: bool | None = None
        self._probed_version = -1
        self.released = False
        self.numel = 0
        self.dtype = torch.float32
        if weight is not None:
            self.numel, self.dtype = weight.numel(), weight.dtype
            self.of(weight)

    def one_row_differs(self, packed: torch.Tensor, bias: torch.Tensor | None) -> bool:
        """Whether oneDNN's one-row kernel gives a row other bits than a 2+-row product does for
        this weight (then one row runs as two): probed once on random rows, re-probed after a repack."""
        if self._one_row_differs is None or self._probed_version != self.version:
            generator = torch.Generator().manual_seed(0)
            width = packed.size(1) if packed.dim() == 2 else None
            if width is None:
                return True
            rows = torch.randn(3, width, generator=generator, dtype=torch.float32).to(self.dtype)
            with torch.no_grad():
                together = torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")
                alone = [
                    torch.ops.mkldnn._linear_pointwise(rows[i : i + 1], packed, bias, "none", [], "") for i in range(3)
                ]
            self._one_row_differs = not all(torch.equal(together[i : i + 1], alone[i]) for i in range(3))
            self._probed_version = self.version
        return self._one_row_differs

    def of(self, weight: torch.Tensor) -> torch.Tensor:
        if self.released:
            assert self.tensor is not None
            return self.tensor
        version = _version(weight)
        if self.tensor is None or self.version != version:
            with torch.no_grad():
                self.tensor = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
            self.version = version
            self.numel, self.dtype = weight.numel(), weight.dtype
        return self.tensor

    def dense(self, weight: torch.Tensor) -> torch.Tensor:
        """The dense weight: the module's own, or rebuilt from the packed one once released."""
        if not self.released:
            return weight
        assert self.tensor is not None
        return self.tensor.to_dense()

    def release(self, module: torch.nn.Linear) -> None:
        self.of(module.weight)
        with torch.no_grad():
            module.weight.data = torch.empty(0, dtype=self.dtype)
        self.released = True

    def restore(self, module: torch.nn.Linear) -> None:
        """Give the module its dense weight back for a while (``stock_linears``)."""
        if self.released:
            with torch.no_grad():
                module.weight.data = self.dense(module.weight)

    def free(self, module: torch.nn.Linear) -> None:
        if self.released:
            with torch.no_grad():
                module.weight.data = torch.empty(0, dtype=self.dtype)

    def __deepcopy__(self, memo) -> Packed:
        if not self.released:
            return Packed()
        twin = Packed()
        with torch.no_grad():
            twin.tensor = torch.ops.mkldnn._reorder_linear_weight(self.dense(torch.empty(0)), None)
        twin.released, twin.numel, twin.dtype = True, self.numel, self.dtype
        return twin

    def __getstate__(self) -> dict:
        if self.released:
            raise TypeError(
                "a module whose dense weight was released cannot be pickled; load it with "
                f"{ENV}=stock to save or train it"
            )
        return {
            "tensor": None,
            "version": -1,
            "released": False,
            "numel": self.numel,
            "dtype": self.dtype,
            "_one_row_differs": None,
            "_probed_version": -1,
        }


def pack_linears(model, release_dense: bool = False) -> int:
    """Pack every CPU fp32 / bf16 ``nn.Linear`` of ``model``; returns how many were packed.

    ``release_dense``: free the dense weight of every packed module whose products always take
    oneDNN (weight elements >= MIN_WORK) and whose weight no other module shares (a tied LM head is
    the input embedding: kept), so the packed copy is the only one. For models the caller does not
    use otherwise (``TargetModel.load``); state dicts of such a model hold empty tensors."""
    if os.environ.get(ENV, "").lower() == "stock" or not onednn_available():
        return 0
    shared = {
        id(parameter)
        for module in model.modules()
        if not isinstance(module, torch.nn.Linear)
        for parameter in module.parameters(recurse=False)
    }
    packed = 0
    # oneDNN's bf16 reorder needs AVX512-BF16-class instructions (or AVX-NE-CONVERT); on an AVX2 CPU
    # it raises, so bf16 weights keep PyTorch's linear there.
    dtypes = (torch.float32, torch.bfloat16) if torch.ops.mkldnn._is_mkldnn_bf16_supported() else (torch.float32,)
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear) or hasattr(module, _PACKED):
            continue
        weight = module.weight
        if weight.device.type != "cpu" or weight.dtype not in dtypes:
            continue
        if module.bias is not None and module.bias.dtype != weight.dtype:
            continue
        state = Packed(weight)
        setattr(module, _PACKED, state)
        module.forward = types.MethodType(_packed_forward, module)  # type: ignore[method-assign]
        if release_dense and weight.numel() >= MIN_WORK and id(weight) not in shared:
            state.release(module)
        packed += 1
    return packed


def is_packed(module) -> bool:
    return hasattr(module, _PACKED) and "forward" in vars(module)


@contextmanager
def stock_linears(*models) -> Iterator[None]:
    """Run ``models`` with PyTorch's own linear for a while (the benchmark's transformers peers)."""
    switched = [module for model in models if model is not None for module in model.modules() if is_packed(module)]
    for module in switched:
        getattr(module, _PACKED).restore(module)  # a released dense weight, rebuilt for the while
        del module.forward  # the class's forward again
    try:
        yield
    finally:
        for module in switched:
            getattr(module, _PACKED).free(module)
            module.forward = types.MethodType(_packed_forward, module)
