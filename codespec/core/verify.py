"""Verification: which draft tokens survive one target forward, and what the target emits next.

Pure functions over one step (docs/design.md §2). With K draft tokens the target scored K+1
positions: row i of ``target_logits`` / ``target_probs`` is the target's distribution for the
token after ``sequence + draft[:i]``. A step keeps the *accepted* prefix of w drafts and emits one
more token: the *recovered* token at the first rejection (w < K) or the *bonus* token from row K
(w == K). So one forward advances w + 1 tokens; K + 1 is the maximum, not the expectation.

- greedy: a draft survives while it equals argmax; the first mismatch is replaced by argmax.
- lookup draft under sampling (q one-hot on x): accept with probability p(x); on rejection sample
  from p with x removed, renormalised.
- model draft under sampling: accept with probability min(1, p(x)/q(x)); on rejection sample from
  normalize(max(0, p - q)) (Leviathan et al. 2023; Chen et al. 2023).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from codespec.core.config import SamplingParams
from codespec.core.draft import Draft
from codespec.core.sampling import process_logits, sample


@dataclass(frozen=True)
class Verdict:
    """The result of verifying one draft."""

    accepted: int  # w: leading draft tokens that survived
    next_token: int  # the recovered (w < K) or bonus (w == K) token
    draft_len: int  # K

    def emitted(self, draft_ids: Sequence[int]) -> list[int]:
        """The w + 1 tokens this step adds to the sequence."""
        return [*draft_ids[: self.accepted], self.next_token]

    @property
    def bonus(self) -> bool:
        return self.accepted == self.draft_len


def leading_survivors(survived: Sequence[bool]) -> int:
    """w: how many drafts survived before the first rejection (later survivors do not count)."""
    accepted = 0
    while accepted < len(survived) and survived[accepted]:
        accepted += 1
    return accepted


def verify_greedy(draft_ids: Sequence[int], target_logits: torch.Tensor) -> Verdict:
    """target_logits: [K+1, V] raw logits."""
    num_draft = len(draft_ids)
    target_choice = target_logits.argmax(dim=-1).tolist()  # [K+1] one device sync
    accepted = leading_survivors([draft == choice for draft, choice in zip(draft_ids, target_choice)])
    return Verdict(accepted, target_choice[accepted], num_draft)


def verify_lookup_sampling(
    draft_ids: Sequence[int], target_probs: torch.Tensor, generator: torch.Generator | None
) -> Verdict:
    """Exact sampling for a deterministic draft (q one-hot). target_probs: [K+1, V]."""
    num_draft = len(draft_ids)
    device = target_probs.device
    draft = torch.tensor(draft_ids, dtype=torch.long, device=device)[:, None]  # [K, 1]
    draft_token_probs = target_probs[:-1].gather(1, draft).squeeze(1)  # [K] p(x_i)
    uniforms = torch.rand(num_draft, generator=generator, device=device)  # [K]
    accepted = leading_survivors((uniforms < draft_token_probs).tolist())
    if accepted == num_draft:
        return Verdict(accepted, sample(target_probs[num_draft], generator), num_draft)
    residual = target_probs[accepted].clone()  # [V]
    residual[draft_ids[accepted]] = 0.0  # p with the rejected x removed
    return Verdict(accepted, sample(residual / residual.sum(), generator), num_draft)


def verify_model_sampling(
    draft_ids: Sequence[int],
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Verdict:
    """Exact sampling for drafts sampled from q. draft_probs: [K, V]; target_probs: [K+1, V]."""
    num_draft = len(draft_ids)
    device = target_probs.device
    draft_probs = draft_probs.to(device)
    draft = torch.tensor(draft_ids, dtype=torch.long, device=device)[:, None]  # [K, 1]
    target_token_probs = target_probs[:-1].gather(1, draft).squeeze(1)  # [K] p(x_i)
    draft_token_probs = draft_probs.gather(1, draft).squeeze(1)  # [K] q(x_i) > 0
    uniforms = torch.rand(num_draft, generator=generator, device=device)  # [K]
    # u < min(1, p/q)  <=>  u * q < p, without dividing by q.
    accepted = leading_survivors((uniforms * draft_token_probs < target_token_probs).tolist())
    if accepted == num_draft:
        return Verdict(accepted, sample(target_probs[num_draft], generator), num_draft)
    residual = (target_probs[accepted] - draft_probs[accepted]).clamp_min(0.0)  # [V]
    mass = residual.sum()
    if float(mass) <= 0.0:  # p == q here: a rejection has probability 0, fall back to p
        residual, mass = target_probs[accepted], residual.new_tensor(1.0)
    return Verdict(accepted, sample(residual / mass, generator), num_draft)


def verify(
    draft: Draft,
    target_logits: torch.Tensor,
    sampling: SamplingParams,
    generator: torch.Generator | None,
) -> Verdict:
    """Dispatch on the sampling mode and on whether the draft carries its own q.

    target_logits: [K+1, V] raw logits for the K draft positions plus one.
    """
    if sampling.greedy:
        return verify_greedy(draft.token_ids, target_logits)
    target_probs = process_logits(target_logits, sampling)  # [K+1, V]
    if draft.draft_probs is None:
        return verify_lookup_sampling(draft.token_ids, target_probs, generator)
    return verify_model_sampling(draft.token_ids, draft.draft_probs, target_probs, generator)
