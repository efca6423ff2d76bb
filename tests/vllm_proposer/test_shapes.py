"""Draft lengths cut to land a step on a token count vLLM has run, and what that may cost."""

import pytest

from codespec.vllm_proposer.shapes import EXTRA_MIN, StepShapes, cut_to_seen


def test_the_longest_drafts_are_cut_to_the_nearest_count_run_below():
    # rows of 16, 9, 4 and 0 drafted tokens: a step of 33 tokens; 31 and 28 have run
    cut = cut_to_seen([16, 9, 4, 0], {28, 31}, most=3)
    assert cut == [14, 9, 4, 0]  # 31: two tokens fewer, both from the longest draft
    assert sum(cut) + len(cut) == 31


def test_cuts_spread_over_drafts_of_equal_length():
    assert cut_to_seen([5, 5, 1], {12}, most=4) == [4, 4, 1]  # a step of 14 tokens, 12 has run


@pytest.mark.parametrize(
    ("lengths", "seen", "most"),
    [
        ([16, 9], {27}, 3),  # the step's own count has run: nothing to gain
        ([16, 9], {20}, 3),  # the nearest count run lies 7 tokens below: more than the extra pays for
        ([16, 9], {26}, 0),  # no extra measured: nothing may be cut
        ([0, 0], {1}, 5),  # nothing drafted to cut
    ],
)
def test_nothing_is_cut_where_no_count_run_is_within_reach(lengths, seen, most):
    assert cut_to_seen(lengths, seen, most) is None


def test_the_extra_of_a_new_count_is_the_median_of_first_steps_and_never_negative():
    shapes = StepShapes()
    assert shapes.first(40) and not shapes.first(40)  # a count's second step is not a first
    for extra in (0.004, 0.001, 0.003)[: EXTRA_MIN - 1]:
        shapes.book_extra(extra)
    assert shapes.extra_s == 0.0  # not trusted yet
    shapes.book_extra(0.003)
    assert shapes.extra_s == pytest.approx(0.003)
    faster = StepShapes()  # an engine without the extra (a GPU's captured graphs): noise either way
    for extra in (-0.001, 0.0002, -0.0004, 0.0001):
        faster.book_extra(extra)
    assert faster.extra_s == 0.0 and faster.most_cut(8, 0.004) == 0


def test_a_cut_pays_even_if_every_token_cut_would_have_been_accepted():
    shapes = StepShapes()
    for _ in range(EXTRA_MIN):
        shapes.book_extra(0.003)
    # a token cut costs its request a later row-step: in the batch, its share of the 4.3 ms fixed cost
    most = shapes.most_cut(requests=8, base_s=0.0043)
    assert most * 0.0043 / 8 < 0.003 <= (most + 1) * 0.0043 / 8
    assert shapes.most_cut(requests=1, base_s=0.00217) == 1  # alone, one token is worth 2.17 ms
