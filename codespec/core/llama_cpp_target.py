"""A GGUF model on llama.cpp's kernels, behind the ``Target`` contract (docs/gguf.md).

One llama.cpp context holds every request's KV state, one sequence (``seq_id``) per
``LlamaCache``, in a unified KV buffer of ``kv_tokens`` cells that all sequences share. A
verification is one ``llama_decode`` whose batch asks for logits at exactly the drafted
positions; ``forward_many`` puts every sequence of a scheduler cycle in that one batch. Rollback
removes the rejected positions from the KV memory (``llama_memory_seq_rm``). Weights are
memory-mapped (llama.cpp's default), so resident memory is near the file size plus the KV buffer.

Memory stays bounded: before a decode that would not fit, the least recently used sequences
outside the batch are emptied (their ``token_ids`` cleared, so a later request re-prefills; the
contract's invariant, "the state is a fresh prefill of ``token_ids``", holds throughout).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from codespec.core.errors import CodespecError, ContextLengthError, InvalidRequestError
from codespec.core.gguf_files import BadModelFileError, resolve_gguf
from codespec.core.gguf_tokenizer import LlamaVocab, agreement, gguf_prompt_format, transformers_tokenizer
from codespec.core.llama_cpp_lib import load_library, take_errors

log = logging.getLogger(__name__)

KV_BUDGET_BYTES = 512 << 20  # default KV buffer: 512 MiB of f16 keys and values
KV_TOKENS_RANGE = (4096, 65536)
MAX_SEQUENCES = 64  # sequences (requests, cached documents, spares) alive at once
BATCH_TOKENS = 2048  # tokens per llama_decode (llama.cpp's n_batch); longer inputs take several


def default_threads() -> int:
    """Every core this process may use, at most 8 (llama.cpp's matmuls scale with cores, and past
    8 a small model's steps are bound by memory, not arithmetic)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, min(cores, 8))


class LlamaCache:
    """One sequence of the shared context: its ``seq_id`` and the token ids its cells hold."""

    def __init__(self, owner: LlamaCppTarget, seq_id: int) -> None:
        self.owner = owner
        self.seq_id = seq_id
        self.token_ids: list[int] = []

    def __len__(self) -> int:
        return len(self.token_ids)

    def rollback(self, length: int) -> None:
        if length < len(self.token_ids):
            self.owner._remove(self.seq_id, max(length, 0))
            del self.token_ids[max(length, 0) :]

    def reset(self) -> None:
        self.rollback(0)


class LlamaCppTarget:
    """``codespec.target.Target`` for a GGUF file, through llama-cpp-python's low-level API."""

    device = torch.device("cpu")  # logits come back as CPU tensors (llama.cpp copies them out)
    batch_invariant = False  # llama.cpp's kernels depend on the batch (docs/gguf.md, "Exactness")
    # Flash attention off (LLAMA_FLASH_ATTN_TYPE_DISABLED): its one-query and many-query kernels
    # differ by ~1e-3 in the logits, the plain path by ~1e-5 (docs/gguf.md, "Exactness").
    flash_attention = 0

    def __init__(
        self,
        path: str | os.PathLike,
        threads: int | None = None,
        kv_tokens: int | None = None,
        prompt_format: str | None = None,
        name: str | None = None,
    ) -> None:
        self.path = resolve_gguf(str(path))
        self.name = name or str(path)
        self._lib = lib = load_library()
        self.threads = threads or default_threads()
        take_errors()
        params = lib.llama_model_default_params()
        params.n_gpu_layers = 0
        self._model = lib.llama_model_load_from_file(str(self.path).encode(), params)
        if not self._model:
            raise BadModelFileError(f"llama.cpp cannot load {self.path}: {_why(take_errors())}")
        self._closed = False
        self.vocab = LlamaVocab(lib, self._model)
        self.vocab_size = self.vocab.size
        self.num_layers_gguf = int(lib.llama_model_n_layer(self._model))
        self.parameter_count = int(lib.llama_model_n_params(self._model))
        self.context_train = int(lib.llama_model_n_ctx_train(self._model))
        self.kv_tokens = kv_tokens or self._default_kv_tokens()
        self._context = self._new_context(self.kv_tokens)
        self._memory = lib.llama_get_memory(self._context)
        self.max_context = min(self.context_train, self.kv_tokens) if self.context_train > 0 else self.kv_tokens
        self._batch = lib.llama_batch_init(BATCH_TOKENS, 0, 1)
        self._lock = threading.Lock()
        self._free_seqs = list(range(MAX_SEQUENCES - 1, -1, -1))
        self._dropped: list[int] = []  # seq_ids of collected caches, their cells not yet freed
        self._live: OrderedDict[int, weakref.ref[LlamaCache]] = OrderedDict()  # by last use
        template = lib.llama_model_chat_template(self._model, None)
        self.tokenizer = transformers_tokenizer(self.path, template.decode() if template else None)
        self.prompt_format = gguf_prompt_format(self.tokenizer, self.vocab, prompt_format)
        self.tokenizer_agrees = agreement(self.vocab, self.tokenizer)
        if not self.tokenizer_agrees:
            log.warning(
                "%s: transformers' reading of this GGUF's tokenizer splits text differently from llama.cpp; "
                "prompts use llama.cpp's (exact), the index and lookup tables transformers' (drafts may be "
                "accepted less often)",
                self.path.name,
            )
        self.eos_token_ids = self._end_ids()
        self._finalizer = weakref.finalize(self, _release, lib, self._model, self._context, self._batch)

    @property
    def kv_capacity(self) -> int:
        """KV cells all sequences share: what the scheduler's batch may hold together."""
        return self.kv_tokens

    # -- loading ---------------------------------------------------------------------------------
    def _default_kv_tokens(self) -> int:
        per_token = self._kv_bytes_per_token()
        tokens = KV_BUDGET_BYTES // max(per_token, 1)
        low, high = KV_TOKENS_RANGE
        return int(min(max(tokens, low), high))

    def _kv_bytes_per_token(self) -> int:
        """f16 keys and values of every layer for one position (from the GGUF's hyperparameters)."""
        arch = self.metadata("general.architecture") or ""
        kv_heads = int(
            self.metadata(f"{arch}.attention.head_count_kv") or self.metadata(f"{arch}.attention.head_count") or 1
        )
        head_dim = int(self.metadata(f"{arch}.attention.key_length") or 0)
        if not head_dim:
            head_dim = int(self.metadata(f"{arch}.embedding_length") or 0) // int(
                self.metadata(f"{arch}.attention.head_count") or 1
            )
        return 2 * 2 * self.num_layers_gguf * kv_heads * max(head_dim, 1)

    def _new_context(self, kv_tokens: int) -> Any:
        lib = self._lib
        params = lib.llama_context_default_params()
        params.n_ctx = kv_tokens
        params.n_batch = BATCH_TOKENS
        params.n_ubatch = 512
        params.n_seq_max = MAX_SEQUENCES
        params.kv_unified = True  # every sequence may use every cell
        params.swa_full = True  # sliding-window layers keep every position, so any rollback is possible
        params.n_threads = self.threads
        params.n_threads_batch = self.threads
        params.no_perf = True
        params.flash_attn_type = self.flash_attention
        context = lib.llama_init_from_model(self._model, params)
        if not context:
            lib.llama_model_free(self._model)
            raise CodespecError(f"llama.cpp cannot make a context for {self.path}: {_why(take_errors())}")
        return context

    def metadata(self, key: str) -> str | None:
        buffer = bytes(512)
        length = self._lib.llama_model_meta_val_str(self._model, key.encode(), buffer, len(buffer))
        return buffer[:length].decode("utf-8", "replace") if length >= 0 else None

    def _end_ids(self) -> frozenset[int]:
        """llama.cpp's end-of-generation tokens among the special ones (EOS, EOT, FIM pad...)."""
        candidates = {self.vocab.special("eos"), self.vocab.special("eot")}
        candidates.update(int(i) for i in getattr(self.tokenizer, "added_tokens_decoder", {}))
        return frozenset(i for i in candidates if i is not None and self.vocab.is_end_of_generation(i))

    # -- the Target contract ---------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self.vocab.encode(text)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.vocab.decode(token_ids)

    def new_cache(self) -> LlamaCache:
        self._free_dropped()
        with self._lock:
            if not self._free_seqs:
                raise CodespecError(
                    f"llama.cpp context full: {MAX_SEQUENCES} sequences alive (requests and cached documents)"
                )
            cache = LlamaCache(self, self._free_seqs.pop())
            self._live[cache.seq_id] = weakref.ref(cache)
        weakref.finalize(cache, self._forget, cache.seq_id)
        return cache

    def forward(self, input_ids: Sequence[int], cache: LlamaCache, keep_last: int = 1) -> torch.Tensor:
        return self.forward_many([input_ids], [cache], [keep_last])[0]

    def forward_many(
        self, inputs: Sequence[Sequence[int]], caches: Sequence[LlamaCache], keep_last: Sequence[int]
    ) -> list[torch.Tensor]:
        """Every sequence's tokens in one ``llama_decode`` (several where they pass ``BATCH_TOKENS``);
        item i: float32 logits [keep_last[i], V] for the last positions of ``inputs[i]``."""
        if not len(inputs) == len(caches) == len(keep_last):
            raise ValueError(f"forward_many got {len(inputs)} inputs, {len(caches)} caches, {len(keep_last)} keep_last")
        if len({id(cache) for cache in caches}) != len(caches):
            raise ValueError("forward_many got one cache twice")
        for ids, cache, keep in zip(inputs, caches, keep_last):
            if not ids or not 1 <= keep <= len(ids):
                raise InvalidRequestError(f"forward needs 1 <= keep_last <= len(input_ids); got {keep} of {len(ids)}")
            if cache.owner is not self:
                raise ValueError("a cache of another llama.cpp target")
        self._free_dropped()
        self._make_room(caches, sum(len(ids) for ids in inputs))
        # (sequence, position in its input, token, wants logits) in batch order
        rows = [
            (index, offset, int(token), offset >= len(ids) - keep)
            for index, (ids, keep) in enumerate(zip(inputs, keep_last))
            for offset, token in enumerate(ids)
        ]
        outputs: list[list[np.ndarray]] = [[] for _ in inputs]
        try:
            for start in range(0, len(rows), BATCH_TOKENS):
                chunk = rows[start : start + BATCH_TOKENS]
                logits = self._decode(chunk, caches)  # a view of llama.cpp's buffer [flagged, V]
                wanted = [index for index, _, _, want in chunk if want]
                # a sequence's flagged rows are its last ones, so they are adjacent: one copy each
                row = 0
                for index, group in itertools.groupby(wanted):
                    count = len(list(group))
                    outputs[index].append(logits[row : row + count].copy())
                    row += count
        except BaseException:
            for cache in caches:  # cells a failed decode kept: drop them, the caches stay usable
                self._remove(cache.seq_id, len(cache.token_ids))
            raise
        for ids, cache in zip(inputs, caches):
            cache.token_ids.extend(int(t) for t in ids)
            self._touch(cache.seq_id)
        return [  # [keep_last, V] each
            torch.from_numpy(blocks[0] if len(blocks) == 1 else np.concatenate(blocks)) for blocks in outputs
        ]

    # -- llama.cpp calls -------------------------------------------------------------------------
    def _decode(self, chunk: list[tuple[int, int, int, bool]], caches: Sequence[LlamaCache]) -> np.ndarray:
        """One ``llama_decode`` of ``chunk``; the logits of its flagged rows, in order [N, V], as a
        view of llama.cpp's buffer (valid until the next decode)."""
        lib, batch = self._lib, self._batch
        for slot, (index, offset, token, want) in enumerate(chunk):
            batch.token[slot] = token
            batch.pos[slot] = len(caches[index].token_ids) + offset
            batch.n_seq_id[slot] = 1
            batch.seq_id[slot][0] = caches[index].seq_id
            batch.logits[slot] = 1 if want else 0
        batch.n_tokens = len(chunk)
        status = lib.llama_decode(self._context, batch)
        if status != 0:
            detail = _why(take_errors())
            if status == 1:
                raise CodespecError(
                    f"llama.cpp found no room for {len(chunk)} positions in its KV memory ({self.kv_tokens} cells): "
                    f"serve with a larger --max-cached-tokens or shorter prompts ({detail})"
                )
            raise CodespecError(f"llama_decode failed with status {status} ({detail})")
        flagged = sum(1 for row in chunk if row[3])
        if not flagged:
            return np.empty((0, self.vocab_size), dtype=np.float32)
        pointer = lib.llama_get_logits(self._context)
        return np.ctypeslib.as_array(pointer, shape=(flagged, self.vocab_size))

    def _remove(self, seq_id: int, start: int) -> None:
        if self._closed:
            return
        self._lib.llama_memory_seq_rm(self._memory, seq_id, start, -1)

    def _touch(self, seq_id: int) -> None:
        with self._lock:
            if seq_id in self._live:
                self._live.move_to_end(seq_id)

    def _forget(self, seq_id: int) -> None:
        """A cache was dropped (on whatever thread collected it): its cells are freed by the
        engine thread's next call, never beside a running decode."""
        with self._lock:
            self._live.pop(seq_id, None)
            self._dropped.append(seq_id)

    def _free_dropped(self) -> None:
        with self._lock:
            dropped, self._dropped = self._dropped, []
        for seq_id in dropped:
            self._remove(seq_id, 0)
        with self._lock:
            self._free_seqs.extend(dropped)

    def _make_room(self, caches: Sequence[LlamaCache], incoming: int) -> None:
        """Empty the least recently used sequences outside this batch until ``incoming`` fits."""
        busy = {cache.seq_id for cache in caches}
        with self._lock:
            live = [(seq, ref()) for seq, ref in self._live.items()]
        used = sum(len(cache) for _, cache in live if cache is not None)
        needed = used + incoming - self.kv_tokens
        if needed <= 0:
            return
        for seq, cache in live:  # oldest first
            if needed <= 0:
                break
            if cache is None or seq in busy or not cache.token_ids:
                continue
            needed -= len(cache.token_ids)
            cache.reset()
            log.debug("llama.cpp KV memory full: emptied sequence %d", seq)
        if needed > 0:
            held = sum(len(cache) for cache in caches)
            raise ContextLengthError(
                f"{incoming} new positions do not fit llama.cpp's KV memory ({self.kv_tokens} cells, "
                f"{held} held by requests in this batch); serve with a larger --max-cached-tokens"
            )

    def close(self) -> None:
        """Free the context and the model now (also done, once, when the target is collected)."""
        self._closed = True
        self._finalizer()


def _release(lib: Any, model: Any, context: Any, batch: Any) -> None:
    lib.llama_batch_free(batch)
    lib.llama_free(context)
    lib.llama_model_free(model)


def _why(errors: list[str]) -> str:
    """The root cause llama.cpp logged first, without its function-name prefixes."""
    if not errors:
        return "llama.cpp gave no reason"
    cause = errors[0]
    while ": " in cause and cause.split(": ", 1)[0].replace("_", "").isalnum():
        cause = cause.split(": ", 1)[1]
    if "gguf" in errors[0] and "failed to read" in cause:
        cause += " (a truncated or damaged file?)"
    return cause
