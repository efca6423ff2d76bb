"""``bench.concurrency`` end to end on the shipped model: the HTTP door in process, the official
``openai`` client, clients at once against one at a time, every output compared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

WORKLOADS = Path(__file__).resolve().parents[3] / "shared" / "workloads"


@pytest.mark.skipif(not (WORKLOADS / "completions-httpx.jsonl").is_file(), reason="the shared workloads are not here")
@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_concurrent_clients_get_the_one_at_a_time_outputs(tmp_path, kind):
    from bench.concurrency import main

    report_path = tmp_path / "report.json"
    argv = ["--kind", kind, "--requests", "3", "--concurrency", "1", "3", "--max-tokens", "12", "--threads", "1"]
    assert main([*argv, "--json", str(report_path), "--plot", str(tmp_path / "plot.svg")]) == 0
    report = json.loads(report_path.read_text())
    one, three = report["levels"]
    assert (one["clients"], three["clients"]) == (1, 3)
    assert three["identical_requests"] == report["requests"] == 3
    assert three["mean_batch"] > 1.0  # the three shared forwards
    assert one["tokens"] == three["tokens"] > 0
    assert (tmp_path / "plot.svg").read_text().startswith("<svg")
