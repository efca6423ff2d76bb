"""`codespec demo` (the README's main job) on the shipped model: completions over the example
workspace and rewrites of its classes and functions, each decoded speculatively and plainly in one run, outputs identical."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the demo end to end: `python -m pytest --full` runs it

ROOT = Path(__file__).resolve().parents[2]


def test_demo_reports_both_jobs_with_identical_outputs(tmp_path):
    plot = tmp_path / "speedups.svg"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "codespec.commands.cli",
            "demo",
            "--repeats",
            "1",
            "--json",
            "--device",
            "cpu",
            "--threads",
            "1",
            "--plot",
            str(plot),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    completions, rewrites = report["completions"], report["rewrites"]
    assert report["prompt_format"] == "qwen2.5-coder" and report["shipped_model"]
    assert completions["positions"] >= 30  # every line of examples/workspace with code after its first word
    assert rewrites["positions"] >= 4  # every class and function of 3-30 lines
    assert completions["identical"] and rewrites["identical"]  # lossless, both jobs
    for summary in (completions, rewrites):
        assert summary["speedup_p10"] <= summary["speedup_median"] <= summary["speedup_p90"]
    assert rewrites["tokens_per_forward_median"] > 2  # the regions are drafted, not decoded
    example = rewrites["typical"]
    assert example["tokens"] > 0 and example["where"].split(":")[0] in ("shapes.py", "report.py")
    assert example["original"].lstrip().startswith(("@", "class ", "def "))
    # its work shown as it happens, on stderr (not a terminal here: a plain line per case)
    progress = [line for line in done.stderr.splitlines() if line.startswith("codespec: ")]
    assert progress[0].startswith("codespec: loading the model")
    assert sum(" completions " in line for line in progress) == completions["positions"]
    assert sum(" rewrites " in line for line in progress) == rewrites["positions"]
    assert plot.read_text().count("<rect ") == completions["positions"] + rewrites["positions"]


def test_progress_rewrites_one_line_on_a_terminal_and_writes_lines_elsewhere():
    import io

    from codespec.commands.progress import Progress

    for live in (True, False):
        stream = io.StringIO()
        progress = Progress(stream, live=live)
        progress.say("loading")
        progress.phase("completions", 2)
        progress.step("a.py:1:1: 1.50x")
        progress.step("a.py:2:1: 2.00x")
        progress.say("done")
        text = stream.getvalue()
        assert text.startswith("codespec: loading\n") and text.endswith("codespec: done\n")
        assert ("\r" in text) is live and text.count("completions ") == 2
        assert ("[##########..........]" in text and "[####################]" in text) is live  # the bar


def test_a_difference_is_reported_with_its_count_and_its_reason_never_a_bare_no():
    from codespec.commands.demo import identity

    same = {"identical": True, "differing": 0, "positions": 37}
    differs = {"identical": False, "differing": 3, "positions": 37}
    assert identity(same, {"batch_invariant": False, "backend": "llama.cpp"}) == "yes"
    on_llama_cpp = identity(differs, {"batch_invariant": False, "backend": "llama.cpp"})
    assert on_llama_cpp.startswith("no, 3 of 37 differ. On llama.cpp") and "Exactness" in on_llama_cpp
    assert "bug" in identity(differs, {"batch_invariant": True, "backend": "torch"})  # fp32 CPU: exact
    assert "bf16" in identity(differs, {"batch_invariant": False, "backend": "torch"})
