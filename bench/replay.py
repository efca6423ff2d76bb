"""Replay mode (design.md §3): every forward runs for real, the recorded token is forced.

At each output position j the recorded token ``output[j]`` gets a constant logit bias
(``REPLAY_BIAS``), and the position right after a complete recording gets it on the end token, so
the run stops where the author stopped. The bias is added to the real logits and the decision stays
an argmax (or a sample) over them: the compute is exactly that of the real run, only the choice is
pinned. One pure function applies it; two thin adapters call it:

- ``ReplayTarget`` wraps a codespec ``TargetModel``: ``forward`` knows the whole sequence (the KV
  cache holds its ids), finds the recording whose prompt starts it, and biases each kept row by its
  output position. Forwards through a truncated layer stack (early-exit drafting) are drafts, not
  the target: they get no bias, or a draft would be told the answer.
- ``ReplayLogitsProcessor`` is the same bias as a transformers ``LogitsProcessor`` for the hf-*
  configurations (``peers`` keeps it away from transformers' assistant models for the same reason).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from codespec.core.target import forward_each

REPLAY_BIAS = 1.0e4  # dwarfs any real logit gap (|logits| ~ 10s), small enough to keep float32 precise


@dataclass(frozen=True)
class Recording:
    """What the target is replayed as emitting after ``prompt_ids``."""

    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    end_id: int | None = None  # forced after the output (None: the recording was cut; no bias there)


def forced_token(recording: Recording, output_index: int) -> int | None:
    """The token forced at output position ``output_index`` (None: the model chooses)."""
    if 0 <= output_index < len(recording.output_ids):
        return recording.output_ids[output_index]
    if output_index == len(recording.output_ids):
        return recording.end_id
    return None


def apply_bias(scores, output_indices: Sequence[int], recording: Recording, strength: float = REPLAY_BIAS):
    """Add ``strength`` to the forced token of each row, in place. ``scores``: [rows, V] float."""
    for row, index in enumerate(output_indices):
        token = forced_token(recording, index)
        if token is not None and token < scores.shape[-1]:
            scores[row, token] += strength
    return scores


class Recordings:
    """Recordings by prompt; ``match`` finds the one whose prompt starts a sequence (longest wins)."""

    def __init__(self) -> None:
        self._by_len: dict[int, dict[tuple[int, ...], Recording]] = {}

    def add(self, recording: Recording) -> None:
        self._by_len.setdefault(len(recording.prompt_ids), {})[recording.prompt_ids] = recording

    def remove(self, recording: Recording) -> None:
        table = self._by_len.get(len(recording.prompt_ids), {})
        if table.get(recording.prompt_ids) is recording:
            del table[recording.prompt_ids]

    def __bool__(self) -> bool:
        return any(self._by_len.values())

    def match(self, sequence: Sequence[int]) -> Recording | None:
        for length in sorted(self._by_len, reverse=True):
            table = self._by_len[length]
            if table and len(sequence) >= length:
                found = table.get(tuple(sequence[:length]))
                if found is not None:
                    return found
        return None


class ReplayTarget:
    """A TargetModel whose full-depth forwards force the matching recording (if any).

    Everything else (tokenizer, caches, ``model``) is the wrapped target's. ``eos_token_ids`` may be
    widened (e.g. by the prompt formats' end markers) so codespec and transformers stop alike.
    """

    def __init__(
        self,
        target,
        eos_token_ids: frozenset[int] | None = None,
        strength: float = REPLAY_BIAS,
        vocab_limit: int | None = None,
    ) -> None:
        self.inner = target
        self.recordings = Recordings()
        self.strength = strength
        self.eos_token_ids = frozenset(eos_token_ids) if eos_token_ids is not None else target.eos_token_ids
        self.biased_rows = 0  # rows that got a forced token (tests and reports check replay happened)
        # A random model of a published shape drives the shipped tokenizer's 4,096 ids through a
        # 151,936-row head: left alone it would pick ids the tokenizer cannot spell. In real mode
        # the rows past ``vocab_limit`` are masked (after the whole head ran: the cost is the real one).
        self.vocab_limit = vocab_limit

    def __getattr__(self, name):  # tokenizer, model, device, max_context, encode, decode, new_cache, ...
        return getattr(self.inner, name)

    def forward(self, input_ids: Sequence[int], cache, keep_last: int = 1):
        logits = self.inner.forward(input_ids, cache, keep_last)  # [keep_last, V]
        if self.vocab_limit is not None and logits.shape[-1] > self.vocab_limit and self._full_depth():
            logits = mask_beyond(logits, self.vocab_limit)
        if not self.recordings or not self._full_depth():
            return logits
        sequence = cache.token_ids  # the whole sequence, the inputs included
        recording = self.recordings.match(sequence)
        if recording is None:
            return logits
        first = len(sequence) - keep_last + 1 - len(recording.prompt_ids)  # output index of row 0
        indices = range(first, first + keep_last)
        logits = apply_bias(logits.clone(), indices, recording, self.strength)  # clone: inference tensors are read-only
        self.biased_rows += sum(forced_token(recording, i) is not None for i in indices)
        return logits

    def forward_many(self, inputs, caches, keep_last):
        return forward_each(self, inputs, caches, keep_last)  # each through ``forward``: replayed

    def _full_depth(self) -> bool:
        model = getattr(self.inner, "model", None)
        if model is None:  # a backend with no partial forwards (llama.cpp): every forward is the target's
            return True
        layers = getattr(getattr(model, "model", None), "layers", None)
        wanted = getattr(model.config, "num_hidden_layers", None)
        return layers is None or wanted is None or len(layers) >= wanted


def mask_beyond(scores, limit: int):
    """``scores`` [rows, V] with every id >= ``limit`` at -inf (a copy: inference tensors are read-only)."""
    scores = scores.clone()
    scores[..., limit:] = float("-inf")
    return scores


class VocabularyLimit:
    """``mask_beyond`` as a transformers ``LogitsProcessor`` (the hf-* configurations in real mode)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def __call__(self, input_ids, scores):
        return mask_beyond(scores, self.limit) if scores.shape[-1] > self.limit else scores


class ReplayLogitsProcessor:
    """The same bias for transformers' ``generate`` (one request: one recording)."""

    def __init__(self, recording: Recording, strength: float = REPLAY_BIAS) -> None:
        self.recording = recording
        self.strength = strength

    def __call__(self, input_ids, scores):
        # input_ids: [1, T] the sequence so far; scores: [1, V] for the token at position T
        index = input_ids.shape[1] - len(self.recording.prompt_ids)
        token = forced_token(self.recording, index)
        if token is not None and token < scores.shape[-1]:
            scores = scores.clone()
            scores[:, token] += self.strength
        return scores
