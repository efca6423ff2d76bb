"""Model-free replay: how a proposer would fare if the target emitted exactly a recorded output.

At each step the proposer drafts up to K tokens; the leading draft tokens that equal the recorded
continuation are "accepted" (w), and the step advances w + 1 tokens, as one target forward would
(the +1 is the recovered or bonus token). Every step becomes a ``StepRecord``, so the figures
come from the same ``RequestStats`` arithmetic as real decoding (docs/design.md §3).

The lookup ceiling is docs/design.md §3's definition: the output is diffed against its reference at token
level; each aligned block of b tokens costs ceil(b / (K + 1)) forwards (a perfect copy pointer),
each unaligned token one forward.

The hindsight bound is what no copying proposer can beat: at every step it drafts the longest
continuation of the recorded output (up to K tokens) that occurs anywhere in the prompt, the
reference (tokenized on its own, as the copy pointer and the index draft it) or the output so
far, knowing the output in advance. Greedy is optimal among drafts that are stretches
copied from that text, one per forward or a tree of them: a forward accepts an occurring prefix of
the continuation plus one token, and the reach ``i + L(i) + 1`` never decreases in ``i`` because
a suffix of an occurring stretch occurs. (A draft stitched from overlapping n-grams is not such a
stretch: it is not bound by this, only by how well a chain of n-grams predicts.)
"""

from __future__ import annotations

import difflib
import math
import time
from collections.abc import Sequence

from codespec.core.draft import EMPTY_DRAFT, Outcome, ProposeContext, Proposer
from codespec.core.stats import RequestStats, StepRecord


def replay(
    proposer: Proposer,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    max_draft: int,
    verify_cost: tuple[float, float] = (0.0, 0.0),
) -> RequestStats:
    """Replay ``output_ids`` after ``prompt_ids`` through ``proposer``; one StepRecord per forward.

    No target runs, so verification time is a model, ``a + b * k`` seconds for a draft of k
    tokens (``verify_cost = (a, b)``): what a cost-aware policy (``auto``) is told it paid.
    """
    sequence = list(prompt_ids)
    output = list(output_ids)
    stats = RequestStats()
    position = 0
    proposer.begin(tuple(prompt_ids))
    try:
        while position < len(output):
            remaining = len(output) - position
            max_len = min(max_draft, remaining - 1)  # as the engine: a draft past the budget is useless
            started = time.perf_counter()
            draft = EMPTY_DRAFT
            if max_len > 0:
                draft = proposer.propose(ProposeContext(sequence, len(prompt_ids), max_len)).truncated(max_len)
            proposal_s = time.perf_counter() - started
            verify_s = verify_cost[0] + verify_cost[1] * len(draft)
            accepted = 0
            while accepted < len(draft) and draft.token_ids[accepted] == output[position + accepted]:
                accepted += 1
            emitted = tuple(output[position : position + accepted + 1])
            sequence.extend(emitted)
            position += len(emitted)
            stats.steps.append(
                StepRecord(
                    draft.proposer if len(draft) else "", len(draft), accepted, len(emitted), proposal_s, verify_s, 0.0
                )
            )
            proposer.observe(Outcome(draft, accepted, emitted, len(sequence), proposal_s, verify_s))
    finally:
        proposer.end()
    return stats


def ceiling_forwards(reference_ids: Sequence[int], output_ids: Sequence[int], max_draft: int) -> int:
    """Forwards a perfect copy pointer with max draft K needs for ``output_ids`` (docs/design.md §3)."""
    matcher = difflib.SequenceMatcher(None, list(reference_ids), list(output_ids), autojunk=False)
    blocks = [block.size for block in matcher.get_matching_blocks() if block.size]
    unaligned = len(output_ids) - sum(blocks)
    return unaligned + sum(math.ceil(size / (max_draft + 1)) for size in blocks)


def hindsight_forwards(
    prompt_ids: Sequence[int], output_ids: Sequence[int], max_draft: int, sources: Sequence[Sequence[int]] = ()
) -> int:
    """Forwards needed if every step drafted the longest next stretch of ``output_ids`` (at most
    ``max_draft`` tokens) found in the prompt, in ``sources`` (other token streams a proposer
    copies from: the reference tokenized on its own, which need not match the prompt's ids where
    the text joins the prompt's header) or in the output so far."""
    # One code point per token (str.find is a token search); the sources apart, the prompt last:
    # the output continues it.
    text = "".join("".join(map(chr, ids)) + "\U0010ffff" for ids in sources) + "".join(map(chr, prompt_ids))
    output = "".join(map(chr, output_ids))
    position = forwards = 0
    while position < len(output):
        available = text + output[:position]
        low, high = 0, min(max_draft, len(output) - position - 1)
        while low < high:  # a stretch that occurs has every prefix occurring: binary search
            middle = (low + high + 1) // 2
            if available.find(output[position : position + middle]) >= 0:
                low = middle
            else:
                high = middle - 1
        position += low + 1
        forwards += 1
    return forwards
