"""Draft-model proposer: a small causal LM with the target's vocabulary drafts K tokens, one by one.

The drafting loop (``ModelDrafter``) is shared with early exit; only the forward differs.

KV contract (the same as the target's, codespec.target.Cache): the drafter's cache holds keys/values for
exactly ``cache.token_ids``, and those ids are always a prefix of the engine's sequence *or* of the
sequence plus this step's draft. After drafting K tokens the cache holds ``sequence + draft[:K-1]``
(the last draft token is not fed), or all K when drafting stopped early on low confidence (the
check reads the forward that fed the last token). ``observe`` then keeps the longest prefix that the accepted
sequence confirms: a cached position is valid exactly when every token up to it matches, so a
common-prefix rollback is right whether this drafter's draft was verified, another proposer's was,
or none. The next ``propose`` feeds only what is missing (the recovered or bonus token, and the last
draft token when all K were accepted) in one forward.

Sampling: each draft token is sampled from q = ``process_logits(draft_logits, sampling)`` with the
request's generator, and that q is returned as ``draft_probs`` (rows exactly the distributions the
tokens were drawn from), so verification can be exact. Stopping early because q is unconfident is
fine: whether to draft position i is decided from the prefix, before position i is sampled.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

import torch

from codespec.core.draft import EMPTY_DRAFT, Draft, Outcome, ProposeContext
from codespec.core.errors import CodespecError
from codespec.core.sampling import process_logits, sample
from codespec.core.target import Cache, common_prefix_len
from codespec.proposers.setup import ProposerSetup

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class ModelDrafter:
    """Autoregressive drafting from a KV-cached forward; subclasses supply ``_forward``.

    ``min_confidence``: from the second draft position on, stop when the draft distribution's top
    probability falls below this (0 = never; the policy still chooses the length). ``vocab_size`` is
    the target's logit width: draft logits are cut or padded (with -inf) to it, so q rows line up
    with the target's p and padded ids are never drafted.
    """

    name = "model"

    def __init__(self, vocab_size: int, max_context: int, min_confidence: float = 0.0) -> None:
        if not 0.0 <= min_confidence <= 1.0:
            raise ValueError(f"min_confidence must be in [0, 1], got {min_confidence}")
        self.vocab_size = vocab_size
        self.input_vocab_size = vocab_size  # ids the drafter can embed; a draft model may have fewer
        self.max_context = max_context
        self.min_confidence = min_confidence
        self.cache: Cache | None = None
        self.last_fed = 0  # tokens fed to catch up before the last draft (the policy's timing filter)
        self.last_draft_s = 0.0

    # -- what subclasses provide -------------------------------------------------------------
    def _new_cache(self) -> Cache:
        raise NotImplementedError

    def _forward(self, input_ids: Sequence[int], cache: Cache) -> torch.Tensor:
        """Logits for the token after the last input id: [V_draft] (any float dtype)."""
        raise NotImplementedError

    def _drafting(self):
        """A context for one propose call (early exit swaps in its truncated layer stack here)."""
        return contextlib.nullcontext()

    # -- the protocol ------------------------------------------------------------------------
    def begin(self, prompt_ids: Sequence[int]) -> None:
        if self.cache is None:
            self.cache = self._new_cache()
        # Keep what an earlier request left that this prompt shares (prompt caching, as the target).
        self.cache.rollback(common_prefix_len(self.cache.token_ids, prompt_ids))

    def propose(self, context: ProposeContext) -> Draft:
        start = time.perf_counter()
        tokens = context.token_ids
        max_len = min(context.max_len, self.max_context - len(tokens))
        if max_len <= 0 or not tokens:
            return EMPTY_DRAFT
        if self.cache is None:
            self.cache = self._new_cache()
        sampling = context.sampling
        greedy = sampling is None or sampling.greedy
        draft_ids: list[int] = []
        draft_rows: list[torch.Tensor] = []  # q rows, [V] each, sampling only
        with self._drafting():
            self._sync(tokens)
            pending = list(tokens[len(self.cache) :])
            self.last_fed = len(pending)
            if max(pending) >= self.input_vocab_size:
                return EMPTY_DRAFT  # an id this drafter cannot embed (its table is narrower than the target's)
            for depth in range(max_len):
                logits = self._fit_vocab(self._forward(pending, self.cache))  # [V]
                if greedy:
                    if depth and self.min_confidence > 0.0:
                        if float(logits.float().softmax(-1).max()) < self.min_confidence:
                            break
                    token = int(logits.argmax())
                else:
                    assert sampling is not None  # not greedy
                    draft_probs = process_logits(logits, sampling)  # [V] q
                    if depth and float(draft_probs.max()) < self.min_confidence:
                        break
                    token = sample(draft_probs, context.generator)
                    draft_rows.append(draft_probs)
                draft_ids.append(token)
                pending = [token]
                if depth + 1 == max_len:
                    break  # the last draft token is not fed: the target scores it, not us
        self.last_draft_s = time.perf_counter() - start
        probs = torch.stack(draft_rows) if draft_rows else None  # [K, V]
        return Draft(tuple(draft_ids), self.name, probs)

    def observe(self, outcome: Outcome) -> None:
        if self.cache is None:
            return
        base = outcome.sequence_len - len(outcome.emitted)  # sequence length before this step
        cached = self.cache.token_ids
        if len(cached) <= base:
            return
        confirmed = common_prefix_len(cached[base:], outcome.emitted)
        self.cache.rollback(base + confirmed)

    def end(self) -> None:
        pass  # the cache stays for prompt reuse by the next request; begin() trims it

    def close(self) -> None:
        """Release the cache (memory) for good."""
        self.cache = None

    # -- helpers -----------------------------------------------------------------------------
    def _sync(self, tokens: Sequence[int]) -> None:
        """Make the cache a strict prefix of ``tokens`` (at least one token is left to feed)."""
        assert self.cache is not None, "propose() makes the cache first"
        cached = self.cache.token_ids
        if len(cached) < len(tokens) and cached == list(tokens[: len(cached)]):
            return  # the usual case after observe(): a prefix, nothing to drop
        self.cache.rollback(min(common_prefix_len(cached, tokens), len(tokens) - 1))

    def _fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """[V_draft] -> [V_target]: cut extra ids, pad missing ones with -inf (never drafted)."""
        width = logits.shape[-1]
        if width == self.vocab_size:
            return logits
        if width > self.vocab_size:
            return logits[: self.vocab_size]
        pad = logits.new_full((self.vocab_size - width,), float("-inf"))
        return torch.cat([logits, pad])


class DraftModelProposer(ModelDrafter):
    """A separate small model drafts; it must share the target's tokenizer."""

    name = "draft"

    def __init__(self, draft, target_vocab_size: int, min_confidence: float = 0.0) -> None:
        super().__init__(target_vocab_size, draft.max_context, min_confidence)
        self.draft = draft  # a Target: TargetModel or LlamaCppTarget (codespec.backends)
        self.input_vocab_size = embedded_tokens(draft)

    @classmethod
    def from_setup(cls, setup: ProposerSetup) -> DraftModelProposer:
        from codespec.core.backends import load_target

        target = setup.target
        if target is None:
            raise CodespecError("the draft proposer needs the target model (to check the vocabulary and device)")
        config = setup.config.draft
        path = config.path or default_draft_path()
        if path is None:
            raise CodespecError(
                "no draft model: pass the option draft_model=PATH (a local causal LM directory that shares "
                "the target's tokenizer); this build ships no default draft model"
            )
        dtype = DTYPE_NAMES.get(target.dtype, "auto") if hasattr(target, "dtype") else "auto"
        threads = target.threads
        draft = load_target(str(path), device=str(target.device), dtype=dtype, threads=threads)
        check_vocab_compatible(target, draft)
        return cls(draft, target.vocab_size, config.min_confidence)

    def _new_cache(self) -> Cache:
        return self.draft.new_cache()

    def _forward(self, input_ids: Sequence[int], cache: Cache) -> torch.Tensor:
        return self.draft.forward(input_ids, cache, keep_last=1)[0]  # [V_draft]


def embedded_tokens(model) -> int:
    """Token ids a model reads: its input embedding's rows (transformers) or its vocabulary (GGUF)."""
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(inner, "get_input_embeddings"):
        return int(inner.get_input_embeddings().num_embeddings)
    return int(model.vocab_size)


def default_draft_path():
    """The shipped draft model's directory (a function, so tests can take it away)."""
    from codespec.core.default_model import draft_path

    return draft_path()


def check_vocab_compatible(target, draft) -> None:
    """A draft must tokenize exactly like the target: the same id for every token string."""
    target_vocab = target.tokenizer.get_vocab()
    draft_vocab = draft.tokenizer.get_vocab()
    if target_vocab == draft_vocab:
        embedded = embedded_tokens(draft)
        if embedded < len(target.tokenizer):
            raise CodespecError(
                f"draft model {draft.name!r} embeds only {embedded} token ids but the tokenizer has "
                f"{len(target.tokenizer)}: it could not read every sequence the target produces"
            )
        return
    by_id_target = {index: token for token, index in target_vocab.items()}
    by_id_draft = {index: token for token, index in draft_vocab.items()}
    differing = sorted(i for i in by_id_target.keys() | by_id_draft.keys() if by_id_target.get(i) != by_id_draft.get(i))
    example = differing[0]
    raise CodespecError(
        f"draft model {draft.name!r} does not share the target's tokenizer: {len(differing)} token ids differ "
        f"(target vocabulary {len(target_vocab)}, draft {len(draft_vocab)}; e.g. id {example} is "
        f"{by_id_target.get(example)!r} for the target and {by_id_draft.get(example)!r} for the draft). "
        f"Use a draft model trained with the target's tokenizer."
    )
