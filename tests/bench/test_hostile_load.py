"""bench/hostile_load.py runs end to end against a real `codespec serve --http` (a subprocess, the
shipped model) and reports every phase: the refusals are 400s, every crowd request is answered,
the server is alive at the end. Its figures are for docs/benchmarks.md, not asserted here."""

from __future__ import annotations

import json
import sys

import pytest

from bench import hostile_load


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_probe_reports_every_phase(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(hostile_load.SOURCE.parents[2]))  # the server runs this checkout
    out = tmp_path / "hostile.json"
    args = ["--window", "0.5", "--rounds", "1", "--crowd-seconds", "1", "--clients", "4", "--json", str(out)]
    assert hostile_load.main(args) == 0
    report = json.loads(out.read_text())
    assert report["server_alive"]
    assert report["sequential"]["statuses"] == [400] and len(report["sequential"]["rss_after_each_mb"]) == 12
    assert report["parallel"]["statuses"] == [400] and report["parallel"]["peak_rss_mb"] > 0
    assert [phase["big_statuses"] for phase in report["beside_big"]] == [["400"], ["400"]]
    crowd = report["crowd"][0]
    assert crowd["clients"] == 4 and crowd["unanswered"] == 0 and crowd["retry_after_missing"] == 0
    assert crowd["over_long"]["2000000"]["statuses"].keys() == {"400"}
