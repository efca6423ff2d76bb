"""The target model: any transformers causal LM, loaded offline, with one KV cache per request
(``KVCache``: its storage and rollback, as ``codespec.llama_cpp_target`` keeps its own)."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from codespec.core.errors import CodespecError, InvalidRequestError, ModelNotFoundError
from codespec.core.ragged import ragged_forward, supports_ragged
from codespec.core.target import forward_each

log = logging.getLogger(__name__)


def resolve_device(device: str = "auto") -> torch.device:
    """ "auto" picks cuda, then mps, then cpu; anything else is passed to torch as given."""
    if device != "auto":
        try:
            chosen = torch.device(device)
        except (RuntimeError, TypeError) as error:
            raise InvalidRequestError(
                f"unknown device {device!r}; use auto, cpu, cuda, cuda:N or mps ({error})"
            ) from None
        if chosen.type == "cuda" and not torch.cuda.is_available():
            raise InvalidRequestError(
                f"device {device!r} asked for, but this torch sees no CUDA device; use auto or cpu"
            )
        return chosen
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """ "auto" is bf16 on CUDA and fp32 elsewhere (CPU matmuls in bf16 are slow and less exact)."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    names = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in names:
        raise InvalidRequestError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16")
    return names[dtype]


def locate_model(name_or_path: str | os.PathLike) -> Path:
    """A local model directory, or the snapshot of a hub id already in the local cache.

    Never downloads: a model that is neither on disk nor cached is a ModelNotFoundError that says
    both places that were searched.
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is a directory but holds no config.json (not a transformers model)")
        return path
    text = str(name_or_path)
    looks_like_path = text.startswith((".", "/", "~")) or text.count("/") > 1 or os.sep in text.replace("/", "")
    from huggingface_hub import snapshot_download
    from huggingface_hub.constants import HF_HUB_CACHE

    if not looks_like_path:
        try:
            return Path(snapshot_download(text, local_files_only=True))
        except Exception as error:  # LocalEntryNotFoundError, HFValidationError, ...
            log.debug("hub cache lookup for %s failed: %s", text, error)
    raise ModelNotFoundError(
        f"model {text!r} not found: no directory at {path.resolve()} and no cached hub model "
        f"{text!r} under {HF_HUB_CACHE}. codespec never downloads at run time; pass a local "
        f"model directory or an id already in the hub cache."
    )


class KVCache:
    """A request's KV cache: transformers' DynamicCache plus the token ids it covers (this backend's
    ``codespec.target.Cache``).

    Storage: transformers' DynamicCache whose full-attention layers are ``codespec.cache_layer``'s
    ``GrowingLayer`` (a buffer with spare capacity, written in place; a rollback moves a length).

    Contract: the cache holds keys/values for exactly ``token_ids`` (the invariant
    ``hf_cache.get_seq_length() == len(token_ids)`` is checked on every change). Verification writes
    K+1 positions; ``rollback(n)`` then drops everything past the accepted sequence, so the next
    forward sees exactly the state a fresh prefill of ``token_ids[:n]`` would give. The same object is
    used for a draft model's cache, rolled back in step with the target's. Keeping the ids also lets a
    later request reuse the longest common prefix (prompt caching).

    Sliding-window layers (Starcoder2, Mistral, Qwen2 with ``use_sliding_window``) keep every position
    too: transformers' ``DynamicSlidingWindowLayer`` drops keys older than the window, after which it
    cannot be cropped (a rollback raises once the window is full) and could not return to an earlier
    length anyway (the dropped keys would be needed again). With a full layer the model's own
    sliding-window mask still limits what each query sees, so the attention is the same; the cost
    is memory for positions outside the window.
    """

    def __init__(self, model_config) -> None:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        from codespec.core.cache_layer import GrowingLayer

        self.hf_cache = DynamicCache(config=model_config)
        _keep_every_position(self.hf_cache)  # sliding-window layers become full ones first
        # full-attention layers write in place
        self.hf_cache.layers = [
            GrowingLayer() if type(layer) is DynamicLayer else layer for layer in self.hf_cache.layers
        ]
        self.token_ids: list[int] = []

    def __len__(self) -> int:
        return len(self.token_ids)

    def appended(self, token_ids: Sequence[int]) -> None:
        """Record that a forward just wrote these positions."""
        self.token_ids.extend(token_ids)
        self._check()

    def rollback(self, length: int) -> None:
        """Keep the first ``length`` positions, drop the rest (transformers 5.x: negative crop)."""
        if length < 0:
            raise ValueError(f"cannot roll back to a negative length ({length})")
        excess = len(self.token_ids) - length
        if excess <= 0:
            return
        self.hf_cache.crop(-excess)
        del self.token_ids[length:]
        self._check()

    def reset(self) -> None:
        self.rollback(0)

    def resync(self) -> None:
        """After a forward that failed part way (some layers wrote positions, ``appended`` never ran):
        drop what any layer holds past ``token_ids``, so the cache is again what they say."""
        layer: Any
        for layer in self.hf_cache.layers:
            excess = layer.get_seq_length() - len(self.token_ids) if hasattr(layer, "get_seq_length") else 0
            if excess > 0:
                layer.crop(-excess)
        self._check()

    def _check(self) -> None:
        cached = self.hf_cache.get_seq_length()
        if cached != len(self.token_ids):
            raise RuntimeError(f"KV cache holds {cached} positions but tracks {len(self.token_ids)} token ids")


def _keep_every_position(cache) -> None:
    """Replace sliding-window layers with full ones (the module docstring says why)."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    for index, layer in enumerate(cache.layers):
        if type(layer) is DynamicSlidingWindowLayer:  # subclasses (hybrid linear attention) are left alone
            cache.layers[index] = DynamicLayer()


class TargetModel:
    """A transformers causal LM + tokenizer: the ``codespec.target.Target`` backend for PyTorch."""

    def __init__(
        self, model, tokenizer, name: str = "", prompt_format: str | None = None, release_dense: bool = False
    ) -> None:
        from codespec.core.attention import use_native_gqa
        from codespec.core.linear import pack_linears
        from codespec.core.prompts import resolve_format

        self.model = model.eval()
        use_native_gqa(self.model)  # no K/V head copies in verification forwards on CPU
        self.parameter_count = sum(p.numel() for p in model.parameters())
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "_name_or_path", "") or type(model).__name__
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.kv_capacity: int | None = None  # caches grow with their sequences
        self.threads: int | None = None  # torch's own thread setting (codespec.service.engine.runtime sets it)
        self.eos_token_ids = _eos_ids(model, tokenizer)
        self.max_context = _max_context(model, tokenizer)
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        # How this family spells FIM and rewrites (codespec/prompts.py): detected from the
        # tokenizer's special tokens unless named.
        self.prompt_format = resolve_format(tokenizer, prompt_format)
        # oneDNN on weights packed once on CPU (MKL's few-row GEMMs are 2-3x slower on this CPU class;
        # codespec/linear.py), unless CODESPEC_CPU_LINEAR=stock. ``release_dense`` (a model this object
        # owns: ``load``) frees the dense copies the packed ones replace, so packing costs memory only
        # for a tied LM head and the small projections.
        self.packed_linears = pack_linears(self.model, release_dense)

    @classmethod
    def load(
        cls,
        name_or_path: str,
        device: str = "auto",
        dtype: str = "auto",
        trust_remote_code: bool = False,
        prompt_format: str | None = None,
        release_dense: bool = True,
    ) -> TargetModel:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = locate_model(name_or_path)
        torch_device = resolve_device(device)
        torch_dtype = resolve_dtype(dtype, torch_device)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, trust_remote_code=trust_remote_code, dtype=torch_dtype
        )
        model = model.to(torch_device)  # type: ignore[arg-type]  # transformers' stubs type .to() oddly
        return cls(model, tokenizer, name=str(name_or_path), prompt_format=prompt_format, release_dense=release_dense)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def new_cache(self) -> KVCache:
        return KVCache(self.model.config)

    @torch.inference_mode()
    def forward(self, input_ids: Sequence[int], cache: KVCache, keep_last: int = 1) -> torch.Tensor:
        """Run ``input_ids`` after what ``cache`` holds; return float32 logits for the last positions.

        Returns [keep_last, V]: row i scores the token after input position T - keep_last + i.
        Where the model can run ragged batches, this is a batch of one through the same code, so a
        request alone and in a batch computes the same thing (``codespec.ragged``).
        """
        if supports_ragged(self.model, (cache,)):
            return self.forward_many([input_ids], [cache], [keep_last])[0]
        ids = torch.tensor([list(input_ids)], dtype=torch.long, device=self.device)  # [1, T]
        try:
            output = self.model(input_ids=ids, cache=cache.hf_cache, use_cache=True, logits_to_keep=keep_last)
        except BaseException:
            cache.resync()  # layers that ran wrote positions: drop them, the cache stays usable
            raise
        cache.appended(input_ids)
        return output.logits[0, -keep_last:].float()  # [keep_last, V]

    @property
    def num_layers(self) -> int:
        """Decoder layers of a Llama-style stack (``model.model.layers``); 0 for another layout."""
        layers = getattr(getattr(self.model, "model", None), "layers", None)
        return len(layers) if isinstance(layers, torch.nn.ModuleList) else 0

    def first_layers(self, count: int) -> contextlib.AbstractContextManager[None]:
        """Forwards run the first ``count`` layers, the final norm and the head, until exited (early exit)."""
        return truncated_layers(self.model, count)

    def forward_many(
        self, inputs: Sequence[Sequence[int]], caches: Sequence[KVCache], keep_last: Sequence[int]
    ) -> list[torch.Tensor]:
        """Every sequence in one ragged forward (``codespec.ragged``) where the architecture and the
        caches allow it, else one forward each (``Target.forward_many``'s contract either way)."""
        if not supports_ragged(self.model, caches):
            return forward_each(self, inputs, caches, keep_last)
        try:
            return ragged_forward(self.model, inputs, caches, keep_last, self.device)
        except BaseException:
            for cache in caches:  # a failed forward wrote some layers of some caches: undo that
                cache.resync()
            raise

    @property
    def batch_invariant(self) -> bool:
        """Whether a position's logits are the same bits however they are computed (alone, in a
        draft, in a batch): fp32 on CPU with codespec's packed linears (codespec.linear) and grouped
        attention (codespec.attention); bf16 and CUDA kernels depend on the rows beside a row."""
        return self.device.type == "cpu" and self.dtype == torch.float32 and self.packed_linears > 0


def decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder layer stack of a Llama-style causal LM (``model.model.layers``)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise CodespecError(
            f"early exit needs a Llama-style model with model.model.layers; {type(model).__name__} has none"
        )
    return layers


@contextlib.contextmanager
def truncated_layers(model, exit_layer: int) -> Iterator[None]:
    """Run ``model`` with only its first ``exit_layer`` decoder layers; restore them on any exit."""
    full = decoder_layers(model)
    if not 1 <= exit_layer <= len(full):
        raise ValueError(f"exit layer must be in [1, {len(full)}], got {exit_layer}")
    model.model.layers = torch.nn.ModuleList(list(full)[:exit_layer])
    try:
        yield
    finally:
        model.model.layers = full


def _eos_ids(model, tokenizer) -> frozenset[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return frozenset(ids)


def _max_context(model, tokenizer) -> int:
    for attribute in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(model.config, attribute, None)
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", 0)
    return limit if 0 < limit < 1_000_000 else 2048
