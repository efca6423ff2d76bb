"""bench/gpu.sh at tiny shapes on the CPU (its --tiny switch): every step runs and the summary names
them, so the GPU minutes go to numbers, not to bugs. Kept under a minute."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # bench/gpu.sh end to end: `python -m pytest --full` runs it

ROOT = Path(__file__).resolve().parents[2]
EDIT = {
    "id": "e",
    "before": "def add(a, b):\n    return a + b\n\n\nprint(add(1, 2))\n",
    "after": 'def add(a, b):\n    """Sum."""\n    return a + b\n\n\nprint(add(1, 2))\n',
}
COMPLETION = {
    "id": "c",
    "path": "pkg/mod.py",
    "prefix": "def area(side):\n    return side * ",
    "suffix": "\n\n\nprint(area(2))\n",
    "target": "side",
}
WORKSPACE = {"path": "pkg/util.py", "text": "def area(side):\n    return side * side\n"}


@pytest.mark.skipif(shutil.which("timeout") is None or shutil.which("bash") is None, reason="needs bash and timeout")
def test_gpu_script_runs_every_step_at_tiny_shapes(tmp_path):
    work = tmp_path / "workloads"
    work.mkdir()
    for name, record in (("edits-httpx", EDIT), ("completions-httpx", COMPLETION), ("workspace-httpx", WORKSPACE)):
        (work / f"{name}.jsonl").write_text(json.dumps(record) + "\n")
    out = tmp_path / "out"
    env = {**os.environ, "CODESPEC_WORKLOADS": str(work), "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu.sh"), str(out), "--tiny"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    status = [line.split("\t") for line in (out / "status.tsv").read_text().splitlines()]
    assert [name for name, _, _ in status] == ["equivalence", "bench-1.5b", "bench-7b", "save-1.5b", "inline-1.5b"]
    failed = {name: code for name, code, _ in status if code not in ("0", "skipped")}
    assert not failed, {name: (out / f"{name}.log").read_text()[-1500:] for name in failed}
    equivalence = json.loads((out / "equivalence.json").read_text())
    assert set(equivalence["dtypes"]) == {"float32", "bfloat16"}
    assert all(result["identical"] == result["runs"] for result in equivalence["dtypes"].values())
    bench = json.loads((out / "bench-1.5b.json").read_text())
    assert set(bench["workloads"]) == {"edits-httpx", "completions-httpx"}
    assert all(row["equivalence"] == 1.0 for row in bench["configs"].values())
    inline = json.loads((out / "inline-1.5b.json").read_text())
    assert inline["cold_item_ms_p50"] > 0
    summary = (out / "summary.md").read_text()
    assert "greedy equivalence" in summary and "auto / hf-pld" in summary and "inline completion" in summary
    assert not (out / "model-1.5b").exists()  # the saved random weights are not an output
