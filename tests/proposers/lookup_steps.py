"""Helpers for the lookup proposers' literal cases: walk an output through a proposer, cut an
output at a text position."""

from __future__ import annotations

from codespec.core.draft import Draft, ProposeContext
from codespec.proposers.lookup_sim import replay


def step_to(proposer, prompt_ids: list[int], output_ids: list[int], max_len: int = 64) -> Draft:
    """Walk ``output_ids`` through the proposer as the engine would (drafts verified against the
    recorded output), then return the draft it proposes next."""
    replay(proposer, prompt_ids, output_ids, max_len)
    return proposer.propose(ProposeContext([*prompt_ids, *output_ids], len(prompt_ids), max_len))


def cut_after(codec, output: str, text_end: int) -> list[int]:
    """The output's tokens up to the first token boundary at or after character ``text_end``."""
    output_ids = codec.encode(output)
    target = len(output[:text_end].encode())
    for count in range(len(output_ids) + 1):
        if len(codec.join(output_ids[:count])) >= target:
            return output_ids[:count]
    return output_ids
