"""The next site in other documents (service.next_edit: site_in, find_site, next_edit_request's
``elsewhere``; proposers.edit_rules.anchors) and the LSP door's part of it (lsp.next_edits)."""

from __future__ import annotations

import asyncio

from codespec.lsp.next_edits import NextEdits, Speculation
from codespec.proposers.edit_rules import anchors
from codespec.service.engine.indexing import read_file
from codespec.service.requests.edit_history import EditHistory
from codespec.service.requests.next_edit import (
    PROBES,
    NextEditPlan,
    OtherDocument,
    find_site,
    next_edit_request,
    site_in,
)

RENAME = [("    x = fetch(url)\n", "    x = fetch_all(url)\n")]
ARGUMENT = [("    show(x)\n", "    show(x, flush=True)\n")]


def test_anchors_are_the_text_every_site_of_a_rule_holds():
    assert anchors(RENAME) == ("fetch",)
    assert anchors(ARGUMENT) == ("show(",)
    assert anchors([("a\n", "a\n")]) == ()  # no change, no rule, nothing to look for


def test_a_site_is_a_whole_token_use_the_rules_change_not_a_longer_name_or_a_done_one():
    filler = "import os\n" * 40
    text = filler + "y = prefetch(1)\nz = fetch_all(2)\n" + filler + "w = fetch(3)\n"
    start, end = site_in(text, RENAME)
    assert "w = fetch(3)" in text[start:end] and "prefetch" not in text[start:end]
    assert site_in("y = prefetch(1)\nz = fetch_all(2)\n", RENAME) is None
    assert site_in("obj.show(x)\n", ARGUMENT) is None  # another object's method
    start, end = site_in("def g():\n    show(y)\n", ARGUMENT)
    assert start == 0


def test_only_the_first_probes_are_tried():
    late = "fetch_all(0)\n" * (PROBES * 3) + "fetch(1)\n"
    assert site_in(late, RENAME) is not None  # fetch_all is no occurrence of the whole token fetch
    # occurrences the rules leave alone (``obj.fetch`` is another object's) use up the probes
    busy = "obj.fetch(0)\n" * (PROBES * 3) + "fetch(1)\n"
    assert site_in(busy, RENAME) is None
    assert site_in("fetch(1)\n" + busy, RENAME) is not None


def test_the_first_document_with_a_site_wins_and_files_are_read_only_where_a_rule_may_apply():
    reads: list[str] = []

    def reader(uri: str, text: str | None):
        def read():
            reads.append(uri)
            return text

        return read

    others = [
        OtherDocument("file:///w/a.py", "nothing here\n", 3),
        OtherDocument("file:///w/b.py", "prefetch(1)\n", 4),  # the anchor, but no whole-token site
        OtherDocument("file:///w/gone.py", "fetch(0)\n", None, read=reader("file:///w/gone.py", None)),
        OtherDocument("file:///w/skip.py", "nothing\n", None, read=reader("file:///w/skip.py", "fetch(9)\n")),
        OtherDocument("file:///w/c.py", "v = fetch(2)\n", None, read=reader("file:///w/c.py", "v = fetch(2)\nu = 1\n")),
        OtherDocument("file:///w/d.py", "fetch(3)\n", 5),
    ]
    other, start, end = find_site(others, RENAME)
    assert other.uri == "file:///w/c.py" and other.version is None
    assert other.text == "v = fetch(2)\nu = 1\n" and other.read is None  # the text read from disk, not the index's
    assert (start, end) == (0, len(other.text))
    assert reads == ["file:///w/gone.py", "file:///w/c.py"]  # skip.py's index copy has no anchor: never read
    # the search stops at its budget of characters
    assert find_site(others, RENAME, budget=40) is None
    assert find_site(others, [("a\n", "a\n")]) is None


def test_a_request_moves_to_another_document_only_when_this_one_has_no_site():
    history = EditHistory()
    here = "def f(url):\n    x = fetch(url)\n    return x\n"
    at = here.index("fetch") + len("fetch")
    history.record("file:///w/f.py", here, at, at, "_all")
    renamed = here[:at] + "_all" + here[at:]
    asked: list[bool] = []

    def elsewhere():
        asked.append(True)
        return [OtherDocument("file:///w/g.py", "import f\n\n\ndef g():\n    return fetch(1)\n", 9)]

    request, plan = next_edit_request(
        renamed,
        at + 4,
        history.recent(),
        uri="file:///w/f.py",
        version=2,
        prompt_format="rewrite",
        budget=16,
        elsewhere=elsewhere,
    )
    assert (plan.uri, plan.version, plan.moved) == ("file:///w/g.py", 9, True)
    assert "return fetch(1)" in plan.window and plan.text.startswith("import f")
    assert request.uri == "file:///w/g.py" and request.reference == plan.window
    assert "fetch_all" in request.prompt.instruction  # the edit made in f.py, shown to the model

    # a site left in this document: it is chosen, and the others are never listed
    two_uses = renamed + "\n\ndef h():\n    return fetch(2)\n"
    asked.clear()
    _, plan = next_edit_request(
        two_uses,
        at + 4,
        history.recent(),
        uri="file:///w/f.py",
        version=3,
        prompt_format="zeta",
        budget=16,
        elsewhere=elsewhere,
    )
    assert plan.uri == "file:///w/f.py" and "return fetch(2)" in plan.window and not asked


def test_a_ready_answer_for_a_file_is_the_draft_of_the_request_made_once_it_is_open():
    async def scenario():
        edits = NextEdits(EditHistory())
        plan = NextEditPlan("file:///w/g.py", 1, 0, 9, "fetch(1)\n", "rewrite", False, "fetch(1)\n")
        edits.speculations[plan.uri] = Speculation("fetch(1)\n", plan.window, None, "fetch_all(1)\n")
        ready = await edits._speculated(plan.uri, "fetch(1)\n", plan)
        # once used (or not), it is gone; another text gets no draft
        edits.speculations[plan.uri] = Speculation("fetch(1)\n", plan.window, None, "fetch_all(1)\n")
        other = await edits._speculated(plan.uri, "fetch(1)\n# edited\n", plan)
        return ready, other, dict(edits.speculations)

    ready, other, left = asyncio.run(scenario())
    assert ready == "fetch_all(1)\n" and other is None and left == {}


def test_files_are_read_as_the_scan_reads_them(tmp_path):
    crlf = tmp_path / "crlf.py"
    crlf.write_bytes(b"a = fetch(1)\r\nb = 2\r\n")
    assert read_file(crlf.as_uri(), 1000) == "a = fetch(1)\r\nb = 2\r\n"  # offsets count the \r
    assert read_file(crlf.as_uri(), 5) is None  # over the size limit
    binary = tmp_path / "blob.py"
    binary.write_bytes(b"\xff\xfe\x00fetch(")
    assert read_file(binary.as_uri(), 1000) is None
    assert read_file((tmp_path / "missing.py").as_uri(), 1000) is None
    assert read_file("untitled:Untitled-1", 1000) is None


def test_a_known_window_is_kept_wherever_the_cursor_is_in_it():
    """The request made where an answer's edit starts (lines below its window's centre) keeps the
    window that answer was made for, so the ready answer drafts it."""
    text = "".join(f"line_{i} = fetch({i})\n" for i in range(30))
    start = text.index("line_10")
    end = text.index("line_19")
    cursor = text.index("line_18")
    edits = EditHistory()
    edits.record("file:///w/a.py", "x = fetch(1)\n", 4, 9, "fetch_all")
    _, chosen = next_edit_request(
        text, cursor, edits.recent(), uri="file:///w/b.py", version=1, prompt_format="rewrite", budget=8
    )
    assert chosen.start != start  # left alone, the window centres on the cursor's line
    _, kept = next_edit_request(
        text,
        cursor,
        edits.recent(),
        uri="file:///w/b.py",
        version=1,
        prompt_format="rewrite",
        budget=8,
        fixed_window=(start, end),
    )
    assert (kept.start, kept.end, kept.window) == (start, end, text[start:end]) and not kept.moved
