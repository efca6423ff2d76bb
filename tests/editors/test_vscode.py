"""The codespec VS Code extension inside a real VS Code (code-server 4.100.3 = VS Code 1.100.3),
driven like a person would through headless Chromium (playwright): open a workspace, type, trigger
an inline suggestion, see the ghost text, accept it with Tab, rewrite a selection from the command
palette. The extension is packaged from the checkout with vsce and installed with
`code-server --install-extension`; it starts `codespec serve` on the shipped default model.

What reached the server is read from the extension's own LSP trace (`codespec.trace.server`,
JSON format, written by vscode-languageclient to the "codespec" output channel, which VS Code
keeps in <user-data-dir>/logs/*/exthost1/codespec.codespec/codespec.log), and from the server
itself: its `codespec/stats` reply (run through "codespec: Show Statistics") lists the accepted
text in its session history. Document contents are checked on disk after Ctrl+S.

Install what this needs with `bash tests/editors/setup_vscode.sh`. Screenshots, VS Code's logs
and the trace stay in a temporary folder when a test fails (its path is printed at the end).
"""

from __future__ import annotations

import pytest
from vscode_session import GHOST_S, gguf_model, running

pytestmark = [pytest.mark.slow, pytest.mark.editors]  # slow: `python -m pytest --full` runs it

SHAPES = """def area_of_square(side):
    return side * side


def area_of_rectangle(width, height):
    return width * height


def perimeter_of_square(side):
    return 4 * side


def perimeter_of_rectangle(width, height):
    return 2 * (width + height)


def describe_square(side):
    print("area", area_of_square(side))
    print("perimeter", perimeter_of_square(side))


def describe_rectangle(width, height):
    print("area", area_of_rectangle(width, height))
"""
TYPED = 'print("perimeter", '  # typed on a new line after line 23 (auto-indented by 4 spaces)

REPORT = """import math


def circle_area(radius):
    result = math.pi * radius * radius
    return result


def circle_perimeter(radius):
    result = 2 * math.pi * radius
    return result
"""
REWRITE_LINES = (4, 6)  # 1-based, inclusive: circle_area, signature and body
INSTRUCTION = "return the expression directly"


# Each test runs in one VS Code whose server uses the shipped model as it ships (PyTorch), then in
# one whose server runs it as a GGUF file on llama.cpp (the codespec.model setting).
@pytest.fixture(scope="module", params=["pytorch", "llama.cpp"])
def vscode(request, vscode_installed, editors_outcome, tmp_path_factory):
    model = gguf_model(tmp_path_factory) if request.param == "llama.cpp" else None
    files = {"shapes.py": SHAPES, "report.py": REPORT}
    with running(request.param.replace(".", ""), files, editors_outcome, model) as session:
        yield session


def test_inline_suggestion_shows_as_ghost_text_and_tab_accepts_it(vscode):
    page = vscode.page
    vscode.open_file("shapes.py")
    uri = (vscode.workspace / "shapes.py").as_uri()
    vscode.go_to("23")
    page.keyboard.press("End")
    page.keyboard.press("Enter")
    page.keyboard.type(TYPED, delay=25)
    mark = trigger_mark = len(vscode.trace.messages())
    # trigger explicitly (editor.action.inlineSuggest.trigger), as well as typing did
    vscode.palette("Trigger Inline Suggestion")

    def retrigger():
        page.keyboard.press("Alt+Backslash")  # the same command's default keybinding

    ghost = vscode.wait(
        "ghost text in the editor", lambda: vscode.ghost_text().strip(), timeout=GHOST_S, every=retrigger
    )
    vscode.shot("ghost-text")

    # the items VS Code got for this spot, from the server (trace)
    offered = vscode.trace.inline_items(after=mark)
    assert offered, "ghost text shown but no inline completion items in the LSP trace"
    invoked = [request for request, _ in offered.values() if request["params"]["context"]["triggerKind"] == 1]
    assert invoked, "no explicitly invoked (triggerKind 1) inline completion request answered with items"
    shown = [text for text in offered if is_subsequence(ghost.replace("\u00a0", " "), text)]
    assert shown, f"ghost text {ghost!r} is none of the items offered: {list(offered)}"
    for _, item in offered.values():
        assert item["insertText"].strip()
        assert item["command"]["command"] == "codespec.accepted"

    mark = len(vscode.trace.messages())
    page.keyboard.press("Tab")
    accepted = vscode.wait(
        "workspace/executeCommand codespec.accepted in the LSP trace",
        lambda: [
            r
            for r in vscode.trace.requests("workspace/executeCommand", after=mark)
            if r["params"]["command"] == "codespec.accepted"
        ],
    )[0]
    answer = vscode.wait("the server's reply to codespec.accepted", lambda: vscode.trace.response(accepted))
    assert "error" not in answer, answer
    accepted_uri, accepted_text = accepted["params"]["arguments"]
    offered = vscode.trace.inline_items(after=trigger_mark)  # and any newer reply shown before Tab
    assert accepted_uri == uri and accepted_text in offered, (accepted_text, list(offered))
    vscode.shot("accepted")

    saved = vscode.save("shapes.py")
    from_line_24 = "\n".join(saved.splitlines()[23:])
    assert from_line_24.startswith("    " + TYPED + accepted_text), (from_line_24, accepted_text)

    # the server itself: its session history has the accepted text
    mark = len(vscode.trace.messages())
    vscode.palette("codespec: Show Statistics")
    stats_request = vscode.wait("codespec/stats request", lambda: vscode.trace.requests("codespec/stats", after=mark))[
        0
    ]
    stats = vscode.wait("codespec/stats reply", lambda: vscode.trace.response(stats_request))["result"]
    assert {"kind": "accepted", "uri": uri, "text": accepted_text} in stats["history"], stats["history"]
    page.locator('.tabs-container .tab.active[aria-label*="Untitled"]').wait_for()
    vscode.wait(
        "the statistics JSON in an editor",
        lambda: (
            '"history_entries"'
            in (page.locator(".editor-group-container.active .view-lines").first.text_content() or "").replace(
                "\u00a0", " "
            )
        ),
    )
    vscode.shot("statistics")


def test_rewrite_selection_applies_the_servers_edit(vscode):
    page = vscode.page
    vscode.open_file("report.py")
    before = (vscode.workspace / "report.py").read_text()
    first, last = REWRITE_LINES
    vscode.go_to(f"{first}:1")
    for _ in range(last - first + 1):
        page.keyboard.press("Shift+ArrowDown")
    vscode.shot("selection")

    mark = len(vscode.trace.messages())
    vscode.palette("codespec: Rewrite Selection", "codespec: Rewrite Selection")
    page.locator(".quick-input-widget .quick-input-message", has_text="Instruction").wait_for()
    page.keyboard.type(INSTRUCTION, delay=10)
    vscode.shot("instruction")
    page.keyboard.press("Enter")

    request = vscode.wait("codespec/edit request", lambda: vscode.trace.requests("codespec/edit", after=mark))[0]
    params = request["params"]
    assert params["instruction"] == INSTRUCTION
    assert params["range"] == {"start": {"line": first - 1, "character": 0}, "end": {"line": last, "character": 0}}, (
        params["range"]
    )
    response = vscode.wait("the server's codespec/edit reply", lambda: vscode.trace.response(request), timeout=GHOST_S)
    assert "error" not in response, response
    result = response["result"]
    (edit,) = result["edits"]
    deltas = [
        n["params"]["text"]
        for n in vscode.trace.notifications("codespec/editDelta", after=mark)
        if n["params"]["editId"] == params["editId"]
    ]
    assert "".join(deltas) == edit["newText"]  # what streamed in adds up to the final edit
    # the extension's status bar line, shown once the edit is applied
    vscode.wait(
        "the rewrite's status bar message",
        lambda: page.locator(".statusbar", has_text="copied from the original").count() > 0,
    )
    vscode.shot("rewritten")

    after = vscode.save("report.py")
    assert after == apply_edit(before, edit), (after, edit)


def is_subsequence(needle: str, haystack: str) -> bool:
    """Every character of `needle` appears in `haystack` in order (ghost text is `insertText`,
    shown in pieces around what is already on the line)."""
    rest = iter(haystack)
    return all(any(c == h for h in rest) for c in needle if not c.isspace())


def offset(text: str, position: dict) -> int:
    lines = text.splitlines(keepends=True)
    return sum(len(line) for line in lines[: position["line"]]) + position["character"]


def slice_range(text: str, lsp_range: dict) -> str:
    return text[offset(text, lsp_range["start"]) : offset(text, lsp_range["end"])]


def apply_edit(text: str, edit: dict) -> str:
    """One LSP TextEdit on ASCII text (UTF-16 columns are characters here)."""
    return text[: offset(text, edit["range"]["start"])] + edit["newText"] + text[offset(text, edit["range"]["end"]) :]


def test_next_edit_is_asked_for_the_documents_version_and_applied_with_tab(vscode):
    """After a rename, "codespec: Suggest Next Edit": the request names the document's version and
    the cursor; the server's answer is shown and applied with Tab (or reported as none)."""
    page = vscode.page
    vscode.open_file("shapes.py")
    vscode.go_to("2:12")  # "    return side * side": the first "side" after "return "
    page.keyboard.press("Control+Shift+ArrowRight")
    page.keyboard.type("length", delay=25)
    before = vscode.save("shapes.py")
    assert before.splitlines()[1] == "    return length * side"

    mark = len(vscode.trace.messages())
    vscode.palette("codespec: Suggest Next Edit", "codespec: Suggest Next Edit")
    request = vscode.wait(
        "textDocument/copilotInlineEdit request",
        lambda: vscode.trace.requests("textDocument/copilotInlineEdit", after=mark),
    )[0]
    params = request["params"]
    assert isinstance(params["textDocument"]["version"], int) and params["position"]["line"] == 1
    response = vscode.wait("the next-edit reply", lambda: vscode.trace.response(request), timeout=GHOST_S)
    assert "error" not in response, response
    edits = response["result"]["edits"]
    if not edits:  # the model saw nothing to repeat: the user is told so
        vscode.wait("'no next edit'", lambda: page.locator(".statusbar", has_text="no next edit").count() > 0)
        return
    (edit,) = edits
    assert edit["textDocument"]["version"] == params["textDocument"]["version"]
    vscode.wait("the next edit's status", lambda: page.locator(".statusbar", has_text="Tab applies").count() > 0)
    vscode.shot("next-edit")
    page.keyboard.press("Tab")
    vscode.wait("the applied edit", lambda: page.locator(".statusbar", has_text="Tab applies").count() == 0)
    after = vscode.save("shapes.py")
    assert after == apply_edit(before, {"range": edit["range"], "newText": edit["text"]}), (after, edit)
