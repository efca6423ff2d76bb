"""The language server over stdio, driven by pytest-lsp as a real client (one server per module)."""

from __future__ import annotations

import asyncio
import collections
import sys

import pytest
import pytest_asyncio
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import ClientServerConfig

from codespec.core.prompts import PromptRenderer
from codespec.service.requests.inline import completion_context, completion_prompt, trim_completion
from codespec.service.requests.options import ServerOptions

pytestmark = pytest.mark.asyncio(loop_scope="module")

LIMITS = {"lineTokens": 12, "blockTokens": 20, "editTokens": 48, "nextEditTokens": 16, "deadlineMs": 600_000}
WAIT_S = 120  # a hang guard only; every wait below ends on an event
SOURCE = 'import os\n\n\ndef join_all(parts):\n    """Join 😀 parts."""\n    return os.path.join(*parts)\n\n\ndef main(argv):\n    result = join_all(argv)\n'


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("workspace")
    (root / "util.py").write_text(SOURCE)
    (root / "other.py").write_text("def helper(value):\n    return value * 2\n")
    return root


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(server_model_dir, workspace):
    config = ClientServerConfig(server_command=[sys.executable, "-m", "codespec.commands.cli", "serve"])
    client = await config.start()
    capabilities = types.ClientCapabilities(
        window=types.WindowClientCapabilities(work_done_progress=True),
        text_document=types.TextDocumentClientCapabilities(
            inline_completion=types.InlineCompletionClientCapabilities(dynamic_registration=False),
            synchronization=types.TextDocumentSyncClientCapabilities(did_save=True),
        ),
        workspace=types.WorkspaceClientCapabilities(workspace_folders=True),
    )
    result = await client.initialize_session(
        types.InitializeParams(
            capabilities=capabilities,
            root_uri=workspace.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=workspace.as_uri(), name="workspace")],
            initialization_options={
                "model": str(server_model_dir),
                "device": "cpu",
                "limits": {**LIMITS, "maxDraft": -3},
                "debounceMs": 10,
                "index": {"path": str(workspace / "index.db")},
            },
        )
    )
    client.initialize_result = result
    client.edit_deltas = collections.defaultdict(list)  # editId -> texts, in arrival order
    client.first_delta = collections.defaultdict(lambda: asyncio.get_running_loop().create_future())

    @client.feature("codespec/editDelta")
    def on_delta(ls, params):
        client.edit_deltas[params.editId].append(params.text)
        if not client.first_delta[params.editId].done():
            client.first_delta[params.editId].set_result(params.text)

    yield client
    await client.shutdown_session()
    await client.stop()


def engine_completion(target, text: str, offset: int) -> str:
    """What the engine returns for the same context, decoded plainly (greedy is lossless)."""
    from codespec.core.config import GenerationLimits
    from codespec.core.decode import generate_all
    from codespec.service.requests.inline import target_windows

    options = ServerOptions()
    windows = target_windows(
        target, options.completion.prefix_chars, options.completion.suffix_chars, LIMITS["blockTokens"]
    )
    context = completion_context(text, offset, LIMITS["lineTokens"], LIMITS["blockTokens"], *windows, invoked=True)
    from codespec.service.engine.service import COMPLETION_STOP_REPEATS

    finished = generate_all(
        target,
        target.encode(completion_prompt(context, PromptRenderer(target.tokenizer, target.prompt_format))),
        None,
        limits=GenerationLimits(context.max_tokens, context.stop, stop_repeats=COMPLETION_STOP_REPEATS),
    )
    return trim_completion(finished.text, context)


def open_document(client, uri: str, text: str, version: int = 1) -> None:
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="python", version=version, text=text)
        )
    )


async def inline(client, uri: str, line: int, character: int):
    return await client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line, character),
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
        )
    )


async def test_initialize_declares_features_and_reports_bad_options(client):
    capabilities = client.initialize_result.capabilities
    assert capabilities.inline_completion_provider is not None
    assert capabilities.text_document_sync.change == types.TextDocumentSyncKind.Incremental
    commands = capabilities.execute_command_provider.commands
    assert {"codespec.accepted", "codespec.reindex", "codespec.clearHistory"} <= set(commands)
    # maxDraft = -3 fell back to the default, with a message to the user
    assert any("limits.maxDraft" in message.message for message in client.messages)


async def test_indexing_reports_progress(client):
    def finished() -> list:
        return [
            values
            for token, values in client.progress_reports.items()
            if str(token).startswith("codespec/indexing")
            and any(isinstance(value, types.WorkDoneProgressEnd) for value in values)
        ]

    while not finished():  # each check is followed at once by registering the next wait: no race
        await asyncio.wait_for(client.protocol.wait_for_notification_async("$/progress"), WAIT_S)
    values = finished()[0]
    assert isinstance(values[0], types.WorkDoneProgressBegin)
    reports = [value for value in values if isinstance(value, types.WorkDoneProgressReport)]
    assert reports and reports[-1].percentage == 100
    assert "2 files indexed" in values[-1].message
    stats = await client.protocol.send_request_async("codespec/stats", {})
    assert stats.index_documents >= 2
    assert stats.index_health.last_error is None and stats.index_health.levels >= 0


async def test_inline_completion_matches_engine(client, server_target, workspace):
    uri = (workspace / "util.py").as_uri()
    open_document(client, uri, SOURCE)
    line, character = 9, len("    result = ")
    result = await inline(client, uri, line, character)
    offset = SOURCE.index("join_all(argv)")
    expected = engine_completion(server_target, SOURCE, offset)
    assert expected, "the tiny model should say something here"
    assert len(result) == 1
    item = result[0]
    assert item.insert_text == expected
    assert item.range.start == item.range.end == types.Position(line, character)
    assert item.command.command == "codespec.accepted"


async def test_incremental_changes_reach_completions(client, server_target, workspace):
    uri = (workspace / "other.py").as_uri()
    text = "def helper(value):\n    return value * 2\n"
    open_document(client, uri, text)
    # insert an emoji (two UTF-16 units) then text after it, in two incremental changes
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[
                types.TextDocumentContentChangePartial(
                    range=types.Range(types.Position(1, 11), types.Position(1, 16)), text="'😀'"
                ),
                types.TextDocumentContentChangePartial(
                    range=types.Range(types.Position(1, 15), types.Position(1, 15)), text=" + str("
                ),
            ],
        )
    )
    expected_text = "def helper(value):\n    return '😀' + str( * 2\n"
    offset = expected_text.index(" * 2")
    result = await inline(client, uri, 1, len("    return '") + 2 + len("' + str("))
    expected = engine_completion(server_target, expected_text, offset)
    assert [item.insert_text for item in result] == ([expected] if expected else [])
    # after save (which flushes the debounce) the index holds exactly the edited text
    client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))
    stats = await client.protocol.send_request_async("codespec/stats", {})
    assert [entry.indexed for entry in stats.documents if entry.uri == uri] == [True]


def keystrokes(client, uri: str, text: str, line: int, character: int, typed: str, version: int) -> tuple[str, int]:
    """Type ``typed`` at (line, character) one didChange per character, as an editor sends it."""
    for char in typed:
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                content_changes=[
                    types.TextDocumentContentChangePartial(
                        range=types.Range(types.Position(line, character), types.Position(line, character)), text=char
                    )
                ],
            )
        )
        lines = text.split("\n")
        lines[line] = lines[line][:character] + char + lines[line][character:]
        text, character, version = "\n".join(lines), character + 1, version + 1
    return text, version - 1


async def test_next_edit_is_the_engines_rewrite_of_the_next_site_in_copilots_shape(client, server_target, workspace):
    from codespec.service.engine.service import EngineService
    from codespec.service.requests.edit_history import EditHistory
    from codespec.service.requests.next_edit import next_edit_request, suggestion

    uri = (workspace / "next.py").as_uri()
    text = "def a(url):\n    x = fetch(url)\n    return x\n\n\ndef b(other):\n    return fetch(other)\n"
    open_document(client, uri, text)
    text, version = keystrokes(client, uri, text, 1, len("    x = fetch"), "_all", 2)
    params = {"textDocument": {"uri": uri, "version": version}, "position": {"line": 1, "character": 17}}
    result = await asyncio.wait_for(
        client.protocol.send_request_async("textDocument/copilotInlineEdit", params), WAIT_S
    )
    # the same request, decoded plainly in this process (greedy is lossless)
    history = EditHistory()
    at = text.index("_all")
    history.record(uri, text.replace("fetch_all(url)", "fetch(url)"), at, at, "_all")
    request, plan = next_edit_request(
        text, at + 4, history.recent(uri), uri=uri, version=version, prompt_format="rewrite", budget=16
    )
    assert "return fetch(other)" in plan.window
    service = EngineService(server_target, proposer="none")
    try:
        plain = service.submit(request).future.result(WAIT_S)
        expected = suggestion(plan, plain.text, plain.reason)
    finally:
        service.close()
    if expected is None:
        assert result.edits == []
    else:
        [edit] = result.edits
        assert edit.text == expected.text
        assert edit.textDocument.uri == uri and edit.textDocument.version == version
        assert edit.command.command == "codespec.accepted"
        lines = text.split("\n")
        start = sum(len(line) + 1 for line in lines[: edit.range.start.line]) + edit.range.start.character
        assert start == expected.start
    client.protocol.notify("textDocument/didShowInlineEdit", {"item": {"command": None}})
    # a request for a version the server no longer has gets nothing (the client asks again)
    stale = {**params, "textDocument": {"uri": uri, "version": version - 1}}
    result = await asyncio.wait_for(client.protocol.send_request_async("textDocument/copilotInlineEdit", stale), WAIT_S)
    assert result.edits == []
    with pytest.raises(JsonRpcException, match="position"):
        await client.protocol.send_request_async("textDocument/copilotInlineEdit", {"textDocument": {"uri": uri}})


async def test_edit_streams_deltas_that_add_up_to_the_edit(client, workspace, server_target):
    uri = (workspace / "util.py").as_uri()
    params = {
        "textDocument": {"uri": uri},
        "editId": "e-stream",
        "range": {"start": {"line": 3, "character": 0}, "end": {"line": 5, "character": 31}},
        "instruction": "rename parts to pieces",
    }
    response = await asyncio.wait_for(client.protocol.send_request_async("codespec/edit", params), WAIT_S)
    edit = response.edits[0]
    assert edit.range.start.line == 3 and edit.range.end.line == 5
    deltas = client.edit_deltas["e-stream"]
    assert deltas and "".join(deltas) == edit.newText
    usage = response.usage
    assert usage.completion_tokens > 0
    assert usage.accepted_prediction_tokens == usage.rejected_prediction_tokens == 0  # no prediction sent
    # its own output as the prediction: every predicted token is accepted (as the HTTP door counts)
    again = {**params, "editId": "e-predicted", "prediction": edit.newText}
    predicted = await asyncio.wait_for(client.protocol.send_request_async("codespec/edit", again), WAIT_S)
    assert predicted.edits[0].newText.startswith(edit.newText)  # a longer reference: a larger budget
    tokens = len(server_target.tokenizer.encode(edit.newText, add_special_tokens=False))
    accepted, rejected = predicted.usage.accepted_prediction_tokens, predicted.usage.rejected_prediction_tokens
    assert accepted + rejected == tokens and accepted >= tokens - 1  # (its last token may merge)
    assert predicted.speculation.target_forwards > 0


async def test_cancel_edit_returns_request_cancelled(client, workspace):
    uri = (workspace / "util.py").as_uri()
    started = client.first_delta["e-cancel"]
    long_original = {"start": {"line": 0, "character": 0}, "end": {"line": 10, "character": 0}}
    pending = asyncio.ensure_future(
        client.protocol.send_request_async(
            "codespec/edit",
            {"textDocument": {"uri": uri}, "editId": "e-cancel", "range": long_original},
            msg_id="edit-to-cancel",
        )
    )
    await asyncio.wait_for(started, WAIT_S)  # generation is under way
    client.protocol.notify("$/cancelRequest", types.CancelParams(id="edit-to-cancel"))
    with pytest.raises(JsonRpcException) as raised:
        await asyncio.wait_for(pending, WAIT_S)
    assert raised.value.code == -32800  # RequestCancelled
    # the server is still fine afterwards, and the engine job did stop as cancelled
    follow_up = await inline(client, uri, 9, len("    result = "))
    assert isinstance(follow_up, list)
    stats = await client.protocol.send_request_async("codespec/stats", {})
    assert stats.finish_reasons._asdict().get("cancelled", 0) >= 1


async def test_accepted_completion_lands_in_history(client, workspace):
    uri = (workspace / "util.py").as_uri()
    await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="codespec.accepted", arguments=[uri, "join_all(argv)  # accepted"])
    )
    stats = await client.protocol.send_request_async("codespec/stats", {})
    accepted = [entry for entry in stats.history if entry.kind == "accepted"]
    assert accepted and accepted[-1].text == "join_all(argv)  # accepted" and accepted[-1].uri == uri
    await client.workspace_execute_command_async(types.ExecuteCommandParams(command="codespec.clearHistory"))
    stats = await client.protocol.send_request_async("codespec/stats", {})
    assert stats.history == []


async def test_out_of_range_position_is_an_error_not_a_crash(client, workspace):
    uri = (workspace / "util.py").as_uri()
    with pytest.raises(JsonRpcException):
        await inline(client, uri, 500, 0)
    with pytest.raises(JsonRpcException):  # inside the surrogate pair of the emoji on line 4
        await inline(client, uri, 4, len('    """Join ') + 1)
    stats = await client.protocol.send_request_async("codespec/stats", {})
    assert stats.documents_open >= 1


async def test_completion_fallback_returns_the_same_completion(client, workspace):
    uri = (workspace / "util.py").as_uri()
    inline_items = await inline(client, uri, 9, len("    result = "))
    completion = await client.text_document_completion_async(
        types.CompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(9, len("    result = "))
        )
    )
    assert [item.text_edit.new_text for item in completion.items] == [item.insert_text for item in inline_items]


async def test_reindex_command_reports_progress_again(client):
    def ended() -> int:
        return sum(
            1
            for token, values in client.progress_reports.items()
            if str(token).startswith("codespec/indexing")
            and any(isinstance(value, types.WorkDoneProgressEnd) for value in values)
        )

    before = ended()
    await asyncio.wait_for(
        client.workspace_execute_command_async(types.ExecuteCommandParams(command="codespec.reindex")), WAIT_S
    )
    while ended() == before:  # the end notification precedes the command's response, but be safe
        await asyncio.wait_for(client.protocol.wait_for_notification_async("$/progress"), WAIT_S)
    assert ended() == before + 1
