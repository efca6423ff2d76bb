"""``bench.http`` end to end on the shipped pair: the HTTP door in process, rewrites with and without
a prediction against plain decoding, every output compared, the door's overhead timed."""

from __future__ import annotations

import json
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "edits-httpx-sample.jsonl"


def test_the_http_bench_runs_and_every_configuration_writes_the_plain_output(tmp_path):
    from bench.http import main

    report_path = tmp_path / "report.json"
    argv = ["--workload", str(SAMPLE), "--max-records", "2", "--stride", "1", "--max-chars", "300"]
    assert (
        main([*argv, "--max-tokens", "24", "--overhead-pairs", "1", "--threads", "1", "--json", str(report_path)]) == 0
    )
    report = json.loads(report_path.read_text())
    assert report["cases"] == 2 and report["identical_outputs"] == 2  # every configuration wrote the plain output
    assert set(report["configs"]) == {"prediction", "no prediction", "plain"}
    assert report["configs"]["prediction"]["tokens"] == report["configs"]["plain"]["tokens"] > 0
    assert report["configs"]["prediction"]["accepted_prediction_tokens"] > 0
    assert report["http_overhead"]["chunks"] > 0
