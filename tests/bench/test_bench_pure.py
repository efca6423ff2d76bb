"""Pure parts of the bench: interleaving, speedup arithmetic, metric merging, windows, hf step logs."""

import math

import pytest

from bench.load import max_within_slo
from bench.measure import RunResult
from bench.peers import StepLog, TimingStreamer, steps_from
from bench.replay import Recording, Recordings, apply_bias, forced_token
from bench.run import METRIC_KEYS, interleaved_order, median_ratio, speedup, summarize, unigram_tv
from bench.workload import window_edit
from codespec.core.stats import RequestStats, StepRecord


def test_interleaving_runs_each_pair_once_request_by_request_with_rotation():
    configs = ["greedy", "auto", "hf-pld"]
    order = interleaved_order(4, configs)
    assert sorted(order) == sorted((r, c) for r in range(4) for c in configs)
    assert [r for r, _ in order] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]  # request by request
    assert [c for r, c in order if r == 0] == ["greedy", "auto", "hf-pld"]
    assert [c for r, c in order if r == 1] == ["auto", "hf-pld", "greedy"]
    assert [c for r, c in order if r == 3] == ["greedy", "auto", "hf-pld"]  # the rotation wraps around
    firsts = [next(c for r, c in order if r == request) for request in range(3)]
    assert sorted(firsts) == sorted(configs)  # nobody always goes first


def _request(tokens: int, decode_s: float, ttft_s: float = 0.1, forwards: int | None = None) -> RunResult:
    """A synthetic request: ``tokens`` output tokens over ``forwards`` equal steps."""
    forwards = forwards or tokens
    per_step = tokens // forwards
    steps = [
        StepRecord(
            "p" if per_step > 1 else "",
            per_step - 1,
            per_step - 1,
            per_step,
            0.001,
            0.01,
            ttft_s + i * decode_s / max(forwards - 1, 1),
        )
        for i in range(forwards)
    ]
    stats = RequestStats(steps, [ttft_s], [decode_s], [tokens - 1], [decode_s / max(forwards - 1, 1)] * (forwards - 1))
    return RunResult(tuple(range(tokens)), stats, peak_rss_mb=100.0)


def test_speedup_is_aggregate_rate_over_same_run_greedy():
    greedy = [_request(101, 2.0), _request(51, 1.0)]  # (100 + 50) tokens / 3 s = 50 tok/s
    fast = [_request(101, 0.5, forwards=25), _request(51, 0.5, forwards=17)]  # 150 / 1 s = 150 tok/s
    base_row = summarize(greedy, greedy)
    row = summarize(fast, greedy)
    assert base_row["tokens_per_s"] == pytest.approx(50.0)
    assert row["tokens_per_s"] == pytest.approx(150.0)
    assert row["speedup"] == pytest.approx(3.0)
    assert base_row["speedup"] == pytest.approx(1.0)
    # per-request ratios: 200/50 = 4 and 100/50 = 2 -> median 3
    assert row["speedup_median"] == pytest.approx(3.0)
    assert row["equivalence"] == 1.0  # same token ids as greedy
    assert row["tokens_per_forward"] == pytest.approx((25 * 4 + 17 * 3) / 42, abs=1e-3)  # steps emit 4 and 3
    assert set(METRIC_KEYS) <= set(row)
    assert row["drafts_by_proposer"] == {"p": {"steps": 42, "proposed": 25 * 3 + 17 * 2, "accepted": 25 * 3 + 17 * 2}}
    assert base_row["drafts_by_proposer"] == {}


def test_equivalence_counts_token_identical_requests():
    greedy = [_request(10, 1.0), _request(10, 1.0)]
    other = [_request(10, 1.0), RunResult((9, 9), greedy[1].stats)]
    assert summarize(other, greedy)["equivalence"] == 0.5


def test_speedup_edge_cases_and_median_ratio():
    assert speedup(10.0, 0.0) is None
    assert speedup(math.nan, 5.0) is None
    assert speedup(30.0, 10.0) == 3.0
    assert median_ratio([2.0, None, 9.0], [1.0, 1.0, 3.0]) == pytest.approx(2.5)


def test_unigram_tv():
    assert unigram_tv([[1, 2]], [[2, 1]]) == 0.0
    assert unigram_tv([[1, 1]], [[2, 2]]) == 1.0
    assert unigram_tv([[]], [[1]]) is None


def test_hf_streamer_events_become_steps():
    streamer = TimingStreamer()
    start = streamer.start
    streamer.events = [(start + 0.5, 1), (start + 0.6, 4), (start + 0.7, 1)]  # prefill step, 3 accepted, 0
    log = StepLog()
    log.drafts = [(0, 0.0, start + 0.4), (5, 0.002, start + 0.55), (5, 0.002, start + 0.65)]
    stats = steps_from(streamer, log, start)
    assert [(s.draft_len, s.accepted, s.emitted) for s in stats.steps] == [(0, 0, 1), (5, 3, 4), (5, 0, 1)]
    assert stats.ttft_s == [pytest.approx(0.5)]
    assert stats.decode_tokens == [5] and stats.decode_s == [pytest.approx(0.2)]
    assert stats.token_gaps_s == [pytest.approx(0.1), pytest.approx(0.1)]
    assert stats.steps[1].verify_s == pytest.approx(0.05)
    summary = stats.summary()
    assert summary["acceptance_by_depth"][:4] == [0.5, 1.0, 1.0, 0.0]  # depth 1: 1 of 2; depth 4: 0 of 1
    plain = steps_from(streamer, StepLog(), start)
    assert all(step.draft_len == 0 for step in plain.steps)


def test_bias_forces_recorded_tokens_and_end():
    import torch

    recording = Recording((7, 8), (3, 1), end_id=0)
    assert [forced_token(recording, i) for i in (-1, 0, 1, 2, 3)] == [None, 3, 1, 0, None]
    scores = torch.zeros(4, 5)
    scores[:, 4] = 50.0  # the model's own favourite
    apply_bias(scores, [0, 1, 2, 3], recording)
    assert scores.argmax(-1).tolist() == [3, 1, 0, 4]  # after the end, the model chooses again
    table = Recordings()
    table.add(recording)
    longer = Recording((7, 8, 9), (5,))
    table.add(longer)
    assert table.match([7, 8, 9, 5]) is longer  # the longest prompt that starts the sequence
    assert table.match([7, 8, 3]) is recording
    assert table.match([8, 7]) is None
    table.remove(longer)
    table.remove(recording)
    assert not table


def test_window_edit_keeps_the_change_with_context():
    before = "".join(f"line {i}\n" for i in range(200))
    after = before.replace("line 150\n", "line 150 changed\n")
    short_before, short_after = window_edit(before, after, max_chars=200, context_lines=3)
    assert short_before.startswith("line 147\n") and short_after.startswith("line 147\n")
    assert "line 150 changed\n" in short_after and "line 150\n" in short_before
    assert len(short_before) <= 200 and len(short_after) <= 200
    assert window_edit(before, after, None) == (before, after)


def test_max_within_slo():
    levels = [
        {"concurrency": 1, "ttft_ms_p95": 100.0, "errors": 0},
        {"concurrency": 4, "ttft_ms_p95": 400.0, "errors": 0},
        {"concurrency": 8, "ttft_ms_p95": 900.0, "errors": 0},
    ]
    assert max_within_slo(levels, 500.0) == 4
    assert max_within_slo(levels, 50.0) is None


def test_plots_are_skipped_with_a_note_without_matplotlib(tmp_path, monkeypatch):
    import sys

    from bench.report import write_plots

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as when it is not installed
    note = write_plots({"mode": "replay", "workloads": {}, "configs": {}}, tmp_path / "plots")
    assert note.startswith("plots skipped") and not (tmp_path / "plots").exists()


def test_plots_are_written_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    from bench.report import write_plots

    row = {"acceptance_by_depth": [0.9, 0.8], "speedup": 2.0, "itl_ms": [1.0, 2.0, 3.0]}
    report = {"mode": "replay", "configs": {"auto": row}, "workloads": {"w": {"configs": {"auto": row}}}}
    note = write_plots(report, tmp_path)
    assert note.startswith("plots:")
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [
        "acceptance_by_depth.png",
        "itl_distribution.png",
        "speedup_per_workload.png",
    ]


def test_targets_read_same_run_ratios():
    from bench.targets import TARGETS, check, targets_table

    configs = {
        "greedy": {"tokens_per_s": 10.0, "speedup_median": 1.0, "equivalence": 1.0},
        "auto": {"tokens_per_s": 45.0, "speedup_median": 4.0, "equivalence": 1.0},
        "hf-pld": {"tokens_per_s": 25.0, "speedup_median": 2.5, "equivalence": 1.0},
    }
    report = {"mode": "replay", "workloads": {"edits-httpx": {"configs": configs}}}
    versus_pld, versus_greedy = (check(t, report) for t in TARGETS[:2])
    assert versus_pld["ratio"] == pytest.approx(1.8) and not versus_pld["met"]
    assert versus_pld["median_ratio"] == pytest.approx(1.6)
    assert versus_greedy["ratio"] == pytest.approx(4.5) and versus_greedy["met"]
    configs["auto"]["equivalence"] = 0.9  # fast but not lossless: the target is not met
    assert not check(TARGETS[1], report)["met"]
    assert check(TARGETS[0], {**report, "mode": "real"}) is None  # another mode does not count
    assert "not run" in targets_table([report])  # completions and editeval were not in this report


def test_targets_table_shows_the_range_over_repeated_runs():
    from bench.targets import targets_table

    def run(auto_rate: float) -> dict:
        configs = {
            "greedy": {"tokens_per_s": 10.0, "speedup_median": 1.0, "equivalence": 1.0},
            "auto": {"tokens_per_s": auto_rate, "speedup_median": auto_rate / 10, "equivalence": 1.0},
        }
        return {"mode": "real", "workloads": {"editeval": {"configs": configs}}}

    row = next(line for line in targets_table([run(11.0), run(9.0)]).splitlines() if "`auto` >= 1x" in line)
    assert "1.10x (2 runs: 0.90x–1.10x)" in row and "not in every run" in row


def test_a_completion_case_gives_auto_no_reference_as_the_server_does(tmp_path):
    """The server's completion request carries no reference (service/inline.completion_request): the
    bench's auto must not get the document as one; the reference configuration alone does."""
    from transformers import AutoTokenizer

    from bench.engine import CodespecConfig
    from bench.sim_run import build_index
    from bench.workload import case_from_record
    from codespec.core.default_model import target_path

    completion = case_from_record({"prefix": "def f():\n    ", "suffix": "\n", "target": "return 1"}, "w", "here")
    edit = case_from_record({"before": "x = 1\n", "after": "x = 2\n"}, "w", "here")
    index = build_index(AutoTokenizer.from_pretrained(str(target_path())), [("a.py", "def g():\n    return 2\n")])
    auto = CodespecConfig("auto", None, None, index)
    assert auto.request_context(completion).reference is None
    assert auto.request_context(completion).index is index
    assert auto.request_context(edit).reference == "x = 1\n"
    assert CodespecConfig("reference", None, None).request_context(completion).reference == "def f():\n    \n"
    subs = [sub.name for sub in auto.proposer(auto.request_context(completion)).subs]
    assert "reference" not in subs and "index" in subs


def test_the_earlier_outputs_bench_drafts_the_longer_match_and_the_request_s_own_text_on_a_tie():
    from bench.vllm_earlier_outputs import context_drafter
    from codespec.proposers.outputs import RecentOutputs

    store = RecentOutputs()
    store.add([1, 2, 3, 4, 5, 6])
    drafter = context_drafter(8, store)
    assert drafter([9, 9, 2, 3], 2) == [4, 5, 6]  # only an earlier output holds "2 3"
    assert drafter([2, 3, 7, 2, 3], 2)[:3] == [7, 2, 3]  # a tie: the request's own text (its loop)
    assert drafter([2, 3, 7, 1, 2, 3], 2) == [4, 5, 6]  # the earlier output's match is longer
    assert context_drafter(8, None)([9, 9, 2, 3], 2) == []


def test_a_vllm_trace_splits_busy_time_into_decoding_prefilling_and_drafting():
    from bench.vllm_trace import busy_time

    def row(drafted: int, served: bool = False) -> dict:
        return {"len": 10, "sampled": 1, "drafted": drafted, "served": served, "choice": None}

    records = [
        {"step_ms": 0.0, "prefilled": True, "propose_ms": 1.0, "rows": [row(0)]},  # the first call
        {"step_ms": 40.0, "prefilled": True, "propose_ms": 2.0, "rows": [row(4), row(0)]},  # a prompt ran
        {"step_ms": 5.0, "prefilled": False, "propose_ms": 0.5, "rows": [row(4, served=True), row(2)]},
        {"step_ms": 4000.0, "prefilled": True, "propose_ms": 0.5, "rows": [row(0)]},  # waited for requests
        {"step_ms": 3000.0, "prefilled": False, "propose_ms": 0.5, "rows": [row(0)]},  # a wait too
    ]
    split = busy_time(records)
    assert split["busy_ms"] == 40.0 + 5.0 + 4.5 and split["waits"] == 2
    assert (split["decode_ms"], split["prefill_ms"], split["drafter_ms"]) == (5.0, 40.0, 4.5)
    assert split["drafter_after_prefill_ms"] == 1.0 + 2.0 + 0.5
    assert split["prefill_steps"] == 2 and split["decode_share"] == round(5 / 49.5, 3)
    assert split["rows"] == {"plain": 4, "drafted": 2, "served": 1} and split["drafted_tokens"] == 10
    assert split["drafter_us_per_row_step"] == round(1e3 * 4.5 / 7, 1)
