"""The baseline every lookup proposer is measured against: transformers' prompt-lookup rule.

``PromptLookupCandidateGenerator.get_candidates`` (transformers 5.x) tries n = 2, then 1; for each
n it takes the *leftmost* occurrence of the last n tokens in prompt + output that has at least one
token after it, and drafts a fixed ``num_output_tokens`` (10) tokens from there (fewer only where
the sequence ends). Re-scanning the sequence every step as transformers does is quadratic; here a
first-occurrence map per n is extended as the sequence grows, which returns the same occurrence.
"""

from __future__ import annotations

from collections.abc import Sequence

from codespec.core.draft import EMPTY_DRAFT, Draft, MatchInfo, Outcome, ProposeContext
from codespec.proposers.context import extends


class PromptLookupRule:
    name = "hf-rule"

    def __init__(self, num_output_tokens: int = 10, max_matching_ngram_size: int = 2) -> None:
        self.num_output_tokens = num_output_tokens
        self.max_ngram = max_matching_ngram_size
        self.begin(())

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self._tokens: list[int] = []
        self._first_start: list[dict[tuple[int, ...], int]] = [{} for _ in range(self.max_ngram + 1)]

    def propose(self, context: ProposeContext) -> Draft:
        tokens = self._sync(context.token_ids)
        length = len(tokens)
        for n in range(min(self.max_ngram, length - 1), 0, -1):
            start = self._first_start[n].get(tuple(tokens[length - n :]))
            # The suffix itself is an occurrence with nothing after it: transformers skips it.
            if start is not None and start + n < length:
                end = min(start + n + min(self.num_output_tokens, context.max_len), length)
                return Draft(tuple(tokens[start + n : end]), self.name, match=MatchInfo(n, "context", start + n))
        return EMPTY_DRAFT

    def observe(self, outcome: Outcome) -> None:
        pass

    def end(self) -> None:
        self.begin(())

    def _sync(self, token_ids: Sequence[int]) -> list[int]:
        if not extends(self._tokens, token_ids):
            self.begin(())
        tokens = self._tokens
        for position in range(len(tokens), len(token_ids)):
            tokens.append(token_ids[position])
            for n in range(1, min(self.max_ngram, position + 1) + 1):
                self._first_start[n].setdefault(tuple(tokens[position + 1 - n : position + 1]), position + 1 - n)
        return tokens
