"""``bench.lsp_concurrency`` end to end on the shipped model: ``codespec serve`` over stdio, a real
LSP client (pygls), requests at once against one at a time on one connection, every answer compared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

WORKLOADS = Path(__file__).resolve().parents[3] / "shared" / "workloads"


@pytest.mark.skipif(not (WORKLOADS / "edits-httpx.jsonl").is_file(), reason="the shared workloads are not here")
@pytest.mark.parametrize("kind", ["edit", "completion"])
def test_requests_at_once_through_the_lsp_get_the_one_at_a_time_answers(tmp_path, kind):
    from bench.lsp_concurrency import main

    report_path = tmp_path / "report.json"
    argv = ["--kind", kind, "--requests", "3", "--concurrency", "1", "3", "--max-tokens", "12", "--threads", "1"]
    assert main([*argv, "--json", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    one, three = report["levels"]
    assert (one["clients"], three["clients"]) == (1, 3)
    assert three["identical_requests"] == report["requests"] == 3
    assert three["mean_batch"] > 1.0  # the three shared forwards
    assert one["tokens"] == three["tokens"] > 0
    assert report["model"]
