"""Next edits in other files, in a real VS Code (code-server) with the codespec extension and
`codespec serve` on the shipped model: a name renamed at both its uses in shapes.py is next
changed in report.py, a file the editor has not opened (the status bar says where, Tab opens it and
asks there, Tab applies the diff shown), then in totals.py, open in another tab (Tab goes there,
Tab applies; totals.py is excluded from the workspace index, so only its open tab is found). What the server answered is read from the extension's LSP trace; files are checked
on disk after Ctrl+S.

The shipped model is a small completion model, not a next-edit model: its answers here are not the
rename a person would make (it drops a function), but they are its own, and what this checks is
that each is shown and applied in the file it names, for the version it was made for. The texts
are chosen so that it answers with a change (a failing precondition says so)."""

from __future__ import annotations

import pytest
from test_vscode import apply_edit
from vscode_session import GHOST_S, STEP_S, running

pytestmark = [pytest.mark.slow, pytest.mark.editors]

SHAPES = 'def area_of_square(side):\n    return side * side\n\n\ndef describe(side):\n    print("area", area_of_square(side))\n'
REPORT = (
    "def largest(sides):\n    return max(area_of_square(s) for s in sides)\n\n\n"
    "def smallest(sides):\n    return min(area_of_square(s) for s in sides)\n"
)
TOTALS = (
    "def mean(sides):\n    return sum(area_of_square(s) for s in sides) / len(sides)\n\n\n"
    "def spread(sides):\n    return max(area_of_square(s) for s in sides) - min(area_of_square(s) for s in sides)\n"
)
NEW = "square_area"


@pytest.fixture(scope="module")
def vscode(vscode_installed, editors_outcome):
    files = {"shapes.py": SHAPES, "report.py": REPORT, "totals.py": TOTALS}
    # totals.py is left out of the index: the first search (no other file open) must find report.py
    settings = {"codespec.index.exclude": [".git", "totals.py"]}
    with running("next-edit", files, editors_outcome, settings=settings) as session:
        yield session


def rename_at(vscode, position: str) -> None:
    """Select the word at ``position`` (line:column) and type the new name over it."""
    vscode.go_to(position)
    vscode.page.keyboard.press("Control+Shift+ArrowRight")
    vscode.page.keyboard.type(NEW, delay=25)


def ask(vscode, mark: int) -> tuple[dict, dict]:
    """Run "codespec: Suggest Next Edit"; the request and the edit the server answered with."""
    vscode.palette("codespec: Suggest Next Edit", "codespec: Suggest Next Edit")
    request = vscode.wait(
        "textDocument/copilotInlineEdit request", lambda: vscode.trace.requests("textDocument/copilotInlineEdit", mark)
    )[-1]
    response = vscode.wait("the next-edit reply", lambda: vscode.trace.response(request), timeout=GHOST_S)
    assert "error" not in response, response
    edits = response["result"]["edits"]
    assert edits, "the shipped model left the window as it was: choose other texts for this test"
    return request, edits[0]


def status(vscode, text: str) -> None:
    vscode.wait(f"{text!r} in the status bar", lambda: vscode.page.locator(".statusbar", has_text=text).count() > 0)


def test_next_edits_in_a_file_not_open_then_in_another_tab(vscode):
    page, workspace = vscode.page, vscode.workspace
    report_uri, totals_uri = (workspace / "report.py").as_uri(), (workspace / "totals.py").as_uri()
    vscode.wait(  # the workspace scan is what knows report.py before the editor opens it
        "the workspace index built ($/progress end in the LSP trace)",
        lambda: any(n["params"]["value"].get("kind") == "end" for n in vscode.trace.notifications("$/progress")),
        timeout=STEP_S,
    )
    vscode.open_file("shapes.py")
    rename_at(vscode, "1:5")
    rename_at(vscode, "6:19")  # the cursor ends after the second rename
    assert vscode.save("shapes.py") == SHAPES.replace("area_of_square", NEW)

    # 1. report.py, not open: the answer names it with version null; Tab opens it and asks there
    mark = len(vscode.trace.messages())
    request, edit = ask(vscode, mark)
    assert request["params"]["textDocument"]["uri"] == (workspace / "shapes.py").as_uri()
    assert request["params"]["otherDocuments"] is True  # the extension takes an edit in another file
    assert edit["textDocument"] == {"uri": report_uri, "version": None}
    status(vscode, "next edit in report.py")
    vscode.shot("next-edit-elsewhere")
    assert not [n for n in vscode.trace.notifications("textDocument/didOpen", mark) if "report.py" in str(n)]
    page.keyboard.press("Tab")
    page.locator('.tabs-container .tab.active[aria-label*="report.py"]').wait_for()
    asked_there = vscode.wait(
        "the request made in report.py",
        lambda: [
            r
            for r in vscode.trace.requests("textDocument/copilotInlineEdit", mark)
            if r["params"]["textDocument"]["uri"] == report_uri
        ],
    )[0]
    opened = [
        n
        for n in vscode.trace.notifications("textDocument/didOpen", mark)
        if n["params"]["textDocument"]["uri"] == report_uri
    ]
    assert opened and asked_there["params"]["position"] == edit["range"]["start"]
    assert asked_there["params"]["textDocument"]["version"] == opened[0]["params"]["textDocument"]["version"]
    there = vscode.wait("the reply in report.py", lambda: vscode.trace.response(asked_there), timeout=GHOST_S)
    [shown] = there["result"]["edits"]
    assert shown["textDocument"] == asked_there["params"]["textDocument"]
    assert (shown["text"], shown["range"]) == (edit["text"], edit["range"])  # the answer made before, ready
    status(vscode, "Tab applies")
    vscode.shot("next-edit-opened")
    page.keyboard.press("Tab")
    vscode.wait("the applied edit", lambda: page.locator(".statusbar", has_text="Tab applies").count() == 0)
    assert vscode.save("report.py") == apply_edit(REPORT, {"range": edit["range"], "newText": edit["text"]})

    # 2. totals.py, open in another tab (the newest open document is searched first): the answer
    # names it with its version; Tab goes there and shows the diff, Tab applies it
    vscode.open_file("totals.py")
    vscode.open_file("shapes.py")
    vscode.go_to("6:30")
    mark = len(vscode.trace.messages())
    _, edit = ask(vscode, mark)
    opened = [
        n
        for n in vscode.trace.notifications("textDocument/didOpen")
        if n["params"]["textDocument"]["uri"] == totals_uri
    ]
    assert edit["textDocument"] == {"uri": totals_uri, "version": opened[-1]["params"]["textDocument"]["version"]}
    status(vscode, "next edit in totals.py")
    page.keyboard.press("Tab")
    page.locator('.tabs-container .tab.active[aria-label*="totals.py"]').wait_for()
    status(vscode, "Tab applies")
    vscode.shot("next-edit-other-tab")
    asked = [r for r in vscode.trace.requests("textDocument/copilotInlineEdit", mark)]
    assert len(asked) == 1  # shown from the answer, not asked again
    page.keyboard.press("Tab")
    vscode.wait("the applied edit", lambda: page.locator(".statusbar", has_text="Tab applies").count() == 0)
    assert vscode.save("totals.py") == apply_edit(TOTALS, {"range": edit["range"], "newText": edit["text"]})
