"""Row following: each vLLM row gets the state of the request it holds, however rows move."""

import numpy as np

from codespec.vllm_proposer.rows import Row, RowStates


def make_states():
    made = []
    closed = []

    def create(row, prompt_len):
        state = {"prompt": row.tokens[:prompt_len].tolist(), "id": len(made)}
        made.append(state)
        return state

    return RowStates(create, closed.append, keep_steps=3), made, closed


def test_a_request_keeps_its_state_when_rows_are_reordered():
    rows, made, _ = make_states()
    a, b = [1, 2, 3, 4], [1, 2, 3, 9]  # the same start (a shared system prompt), different requests
    first = rows.step([Row(np.array(a + [5]), 1), Row(np.array(b + [6]), 1)])
    assert [s["prompt"] for s in first] == [a, b]
    # next step: b moved to row 0, a accepted two drafts and one more (3 sampled)
    second = rows.step([Row(np.array(b + [6, 7]), 1), Row(np.array(a + [5, 8, 8, 8]), 3)])
    assert second[0] is first[1] and second[1] is first[0]
    assert len(made) == 2


def test_identical_requests_get_one_state_each():
    rows, made, _ = make_states()
    prompt = [7, 7, 7]
    first = rows.step([Row(np.array(prompt + [1]), 1), Row(np.array(prompt + [1]), 1)])
    assert first[0] is not first[1] and len(made) == 2
    second = rows.step([Row(np.array(prompt + [1, 2]), 1), Row(np.array(prompt + [1, 2]), 1)])
    assert {id(s) for s in second} == {id(s) for s in first}


def test_rows_not_decoding_get_none_and_new_requests_a_fresh_state():
    rows, made, _ = make_states()
    first = rows.step([None, Row(np.array([1, 2, 3]), 1)])
    assert first[0] is None and first[1]["prompt"] == [1, 2]
    second = rows.step([Row(np.array([4, 5, 6]), 1), Row(np.array([1, 2, 3, 4]), 1)])
    assert second[0]["prompt"] == [4, 5] and second[1] is first[1]


def test_a_preempted_request_resumes_its_state_and_gone_ones_are_dropped():
    rows, made, closed = make_states()
    first = rows.step([Row(np.array([1, 2, 3]), 1), Row(np.array([8, 9, 10]), 1)])
    rows.step([Row(np.array([1, 2, 3, 4]), 1)])  # the second is preempted
    resumed = rows.step([Row(np.array([1, 2, 3, 4, 5]), 1), Row(np.array([8, 9, 10, 11, 12]), 1)])
    assert resumed[1] is first[1]  # back with more tokens than one step adds: still its state
    for step in range(5):  # the first request finished: no row continues it
        rows.step([Row(np.array([8, 9, 10, 11, 12] + [0] * (step + 1)), 1)])
    assert closed == [first[0]] and len(rows) == 1


def test_memory_is_bounded_by_the_tracked_limit():
    closed = []
    rows = RowStates(lambda tokens, n: n, closed.append, keep_steps=1000, max_tracked=8)
    for request in range(50):
        rows.step([Row(np.array([request, request + 1, request + 2]), 1)])
    assert len(rows) == 8 and len(closed) == 42


def test_a_row_continuing_its_sequence_keeps_its_state_and_a_new_request_in_it_gets_a_fresh_one():
    rows, made, _ = make_states()
    first = rows.step([Row(np.array([1, 2, 3, 4]), 1, 0), Row(np.array([5, 6, 7, 8]), 1, 1)])
    second = rows.step([Row(np.array([1, 2, 3, 4, 9, 9]), 2, 0), Row(np.array([5, 6, 7, 8, 1]), 1, 1)])
    assert second == first and len(made) == 2
    # row 1's request finished; a new one of the same length, ending alike, takes its row
    third = rows.step([Row(np.array([1, 2, 3, 4, 9, 9, 3]), 1, 0), Row(np.array([6, 6, 7, 8, 1, 2]), 1, 1)])
    assert third[0] is first[0] and third[1] is not first[1] and third[1]["prompt"] == [6, 6, 7, 8, 1]
    # rows swapped: each request still finds its own state
    fourth = rows.step([Row(np.array([6, 6, 7, 8, 1, 2, 4]), 1, 0), Row(np.array([1, 2, 3, 4, 9, 9, 3, 5]), 1, 1)])
    assert fourth[0] is third[1] and fourth[1] is first[0]


def test_the_bound_drops_the_least_recently_seen_not_the_first_tracked():
    closed = []
    rows = RowStates(lambda row, n: row.tokens[0], closed.append, keep_steps=1000, max_tracked=3)
    long_lived = [100, 101]
    for request in range(6):  # a long request decodes beside a new short one each step
        long_lived = long_lived + [request]
        rows.step([Row(np.array(long_lived), 1), Row(np.array([request, request + 1]), 1)])
    assert len(rows) == 3 and closed == [0, 1, 2, 3]  # the long request (tracked first) is kept


def test_more_rows_than_the_bound_keep_every_state_while_their_rows_hold_them():
    closed = []
    made = iter(range(100))
    rows = RowStates(lambda row, n: next(made), closed.append, keep_steps=1000, max_tracked=1)
    rows.step([Row(np.array([9, 9, 1]), 1, 0)])
    first = rows.step([Row(np.array([1, 2, 3]), 1, 0), Row(np.array([4, 5, 6]), 1, 1)])
    assert closed == [0]  # only the sequence no row holds
    second = rows.step([Row(np.array([1, 2, 3, 7]), 1, 0), Row(np.array([4, 5, 6, 8]), 1, 1)])
    assert second == first and closed == [0]
    rows.step([Row(np.array([50, 51]), 1, 2)])  # both left: dropped, least recently seen first
    assert closed == [0, 1, 2] and len(rows) == 1
