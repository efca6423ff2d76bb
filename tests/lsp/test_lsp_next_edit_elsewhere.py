"""Next edits in another file, through the language server over stdio on the shipped model: a name
renamed at every use in one file is renamed next in the open file that still uses it, then in the
same file when the editor has closed it (read from disk, version null), and the request the client
makes once it has opened that file finds the answer ready (docs/next-edit.md)."""

from __future__ import annotations

import asyncio
import sys

import pytest
import pytest_asyncio
from lsprotocol import types
from pytest_lsp import ClientServerConfig

pytestmark = pytest.mark.asyncio(loop_scope="module")

WAIT_S = 180  # a hang guard only
SHAPES = 'def area_of_square(side):\n    return side * side\n\n\ndef describe(side):\n    print("area", area_of_square(side))\n'
# The shipped model's answer for this window is a change (it drops the second function): what the
# test needs is *an* answer to follow from file to file, and the shipped model is no next-edit model.
REPORT = (
    "def largest(sides):\n    return max(area_of_square(s) for s in sides)\n\n\n"
    "def smallest(sides):\n    return min(area_of_square(s) for s in sides)\n"
)
OLD, NEW = "area_of_square", "square_area"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("elsewhere")
    (root / "shapes.py").write_text(SHAPES)
    (root / "report.py").write_text(REPORT)
    (root / "notes.py").write_text("def unrelated():\n    return 1\n")
    return root


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(workspace):
    config = ClientServerConfig(server_command=[sys.executable, "-m", "codespec.commands.cli", "serve"])
    client = await config.start()
    capabilities = types.ClientCapabilities(
        window=types.WindowClientCapabilities(work_done_progress=True),
        workspace=types.WorkspaceClientCapabilities(workspace_folders=True),
    )
    await client.initialize_session(
        types.InitializeParams(
            capabilities=capabilities,
            root_uri=workspace.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=workspace.as_uri(), name="elsewhere")],
            initialization_options={"device": "cpu", "index": {"path": str(workspace / "index.db")}},
        )
    )
    yield client
    await client.shutdown_session()
    await client.stop()


def replay_history(uri: str, text: str, changes):
    """The edit history the server records for ``changes`` (start, end, new text), and the text after."""
    from codespec.service.requests.edit_history import EditHistory

    history = EditHistory()
    for start, end, new in changes:
        history.record(uri, text, start, end, new)
        text = text[:start] + new + text[end:]
    return history, text


def expected_answer(shapes_uri: str, report_uri: str, version, history, text: str):
    """The suggestion plain greedy decoding of the same request gives (the shipped model, no drafts)."""
    from codespec.core.default_model import target_path
    from codespec.core.model import TargetModel
    from codespec.service.engine.service import EngineService
    from codespec.service.requests.next_edit import OtherDocument, next_edit_request, suggestion

    request, plan = next_edit_request(
        text,
        text.rindex(NEW) + len(NEW),
        history.recent(),
        uri=shapes_uri,
        version=4,
        prompt_format="rewrite",
        budget=64,
        origin="lsp",
        elsewhere=lambda: [OtherDocument(report_uri, REPORT, version)],
    )
    assert plan.uri == report_uri and plan.moved
    service = EngineService(TargetModel.load(str(target_path()), device="cpu"), proposer="none")
    try:
        plain = service.submit(request).future.result(WAIT_S)
    finally:
        service.close()
    return suggestion(plan, plain.text, plain.reason)


def position_of(text: str, offset: int) -> dict:
    line = text.count("\n", 0, offset)
    return {"line": line, "character": offset - (text.rfind("\n", 0, offset) + 1)}


async def ask(client, uri: str, version: int, position: dict, other_documents: bool = True) -> list:
    params = {"textDocument": {"uri": uri, "version": version}, "position": position}
    if other_documents:
        params["otherDocuments"] = True  # as codespec's own clients say they take such an edit
    result = await asyncio.wait_for(
        client.protocol.send_request_async("textDocument/copilotInlineEdit", params), WAIT_S
    )
    return result.edits


async def indexed(client) -> None:
    def finished() -> bool:
        return any(
            str(token).startswith("codespec/indexing") and isinstance(values[-1], types.WorkDoneProgressEnd)
            for token, values in client.progress_reports.items()
        )

    while not finished():
        await asyncio.wait_for(client.protocol.wait_for_notification_async("$/progress"), WAIT_S)


def open_document(client, uri: str, text: str, version: int = 1) -> None:
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri, language_id="python", version=version, text=text)
        )
    )


async def test_the_next_site_is_found_in_the_open_file_then_on_disk_and_asked_there_again(client, workspace):
    shapes, report = (workspace / "shapes.py").as_uri(), (workspace / "report.py").as_uri()
    await indexed(client)
    open_document(client, shapes, SHAPES)
    open_document(client, report, REPORT)
    # the user renames both uses in shapes.py, one change each (as an editor sends a rename)
    changes, text, version = [], SHAPES, 1
    for _ in range(2):
        at = text.index(OLD)
        changes.append((at, at + len(OLD), NEW))
        start, end = position_of(text, at), position_of(text, at + len(OLD))
        version += 1
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=shapes, version=version),
                content_changes=[
                    types.TextDocumentContentChangePartial(
                        range=types.Range(types.Position(**start), types.Position(**end)), text=NEW
                    )
                ],
            )
        )
        text = text[:at] + NEW + text[at + len(OLD) :]
    history, renamed = replay_history(shapes, SHAPES, changes)
    assert renamed == text and OLD not in text
    cursor = position_of(text, text.rindex(NEW) + len(NEW))

    # 0. a client that did not say it takes edits in other documents (copilot-lsp draws any
    # answer in the buffer that asked) gets none there
    unasked = await ask(client, shapes, version, cursor, other_documents=False)
    assert all(edit.textDocument.uri == shapes for edit in unasked)

    # 1. report.py is open: the answer names it, with its version, and is the model's own
    expected = expected_answer(shapes, report, 1, history, text)
    assert expected is not None, "the shipped model left this window as it was: pick another REPORT"
    [edit] = await ask(client, shapes, version, cursor)
    assert edit.textDocument.uri == report and edit.textDocument.version == 1
    assert edit.text == expected.text
    range_ = edit.range
    assert (range_.start.line, range_.start.character) == tuple(position_of(REPORT, expected.start).values())
    assert (range_.end.line, range_.end.character) == tuple(position_of(REPORT, expected.end).values())

    # 2. report.py closed: the same answer, read from disk, with version null (the client opens it)
    client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=report)))
    [from_disk] = await ask(client, shapes, version, cursor)
    assert from_disk.textDocument.uri == report and from_disk.textDocument.version is None
    assert (from_disk.text, from_disk.range) == (edit.text, edit.range)

    # 3. the client opens it and asks where the edit starts: the same edit, for the opened version
    # (drafted from the answer just made: tests/lsp/test_lsp_units.py)
    open_document(client, report, REPORT, version=7)
    [there] = await ask(client, report, 7, {"line": range_.start.line, "character": range_.start.character})
    assert there.textDocument.uri == report and there.textDocument.version == 7
    assert (there.text, there.range) == (edit.text, edit.range)

    # 4. a version of report.py the server no longer has: nothing (the client asks again)
    assert await ask(client, report, 6, {"line": range_.start.line, "character": range_.start.character}) == []


async def test_an_edit_that_applies_nowhere_else_gets_no_other_file(client, workspace):
    """The recent edits are the workspace's: the renames above would still apply to report.py."""
    await client.workspace_execute_command_async(types.ExecuteCommandParams("codespec.clearHistory"))
    notes = (workspace / "notes.py").as_uri()
    open_document(client, notes, "def unrelated():\n    return 1\n")
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=notes, version=2),
            content_changes=[
                types.TextDocumentContentChangePartial(
                    range=types.Range(types.Position(0, 4), types.Position(0, 13)), text="never_used_name"
                )
            ],
        )
    )
    edits = await ask(client, notes, 2, {"line": 0, "character": 19})
    # not another file, and not notes.py's own copy on disk (which still has the old name)
    assert all(edit.textDocument.uri == notes and edit.textDocument.version == 2 for edit in edits)
