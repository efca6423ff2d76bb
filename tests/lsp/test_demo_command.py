"""`codespec demo` (the README's main job) on the shipped model: completions over the example
workspace and a rewrite, each decoded speculatively and plainly in one run, outputs identical."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_demo_reports_both_jobs_with_identical_outputs():
    done = subprocess.run(
        [sys.executable, "-m", "codespec.cli", "demo", "--repeats", "1", "--json", "--device", "cpu", "--threads", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    completions, rewrite = report["completions"], report["rewrite"]
    assert report["prompt_format"] == "qwen2.5-coder" and report["shipped_model"]
    assert completions["positions"] >= 30  # every line of examples/workspace with code after its first word
    assert completions["identical"] and rewrite["identical"]  # lossless, both jobs
    assert completions["speedup_p10"] <= completions["speedup_median"] <= completions["speedup_p90"]
    assert rewrite["tokens"] > 0 and rewrite["tokens_per_forward"] > 2  # the region is drafted, not decoded
    assert rewrite["original"].startswith("@dataclass(frozen=True)\nclass Rectangle:")
