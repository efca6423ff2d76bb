"""A real LSP client cancels the workspace-indexing progress: the scan stops, installs nothing,
and the reindex command indexes the workspace afterwards.

The cancel is sent on the progress ``begin``; the scan of this workspace (2,000 files, 16
tokenizer batches, each followed by a cancellation check) takes far longer than one message
round trip.
"""

from __future__ import annotations

import asyncio
import sys

import pytest
import pytest_asyncio
from lsprotocol import types
from pytest_lsp import ClientServerConfig

pytestmark = pytest.mark.asyncio(loop_scope="module")

WAIT_S = 120  # a hang guard only
FILES = 2000


def indexing_values(client) -> list[list]:
    return [values for token, values in client.progress_reports.items() if str(token).startswith("codespec/indexing")]


async def next_progress(client) -> None:
    await asyncio.wait_for(client.protocol.wait_for_notification_async("$/progress"), WAIT_S)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(server_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("big-workspace")
    body = "".join(f"    value_{j} = compute(value_{j - 1}, {j})\n" for j in range(1, 24))
    for i in range(FILES):
        folder = root / f"package_{i % 40}"
        folder.mkdir(exist_ok=True)
        (folder / f"module_{i}.py").write_text(f"def function_{i}(value_0):\n{body}    return value_23\n")
    config = ClientServerConfig(server_command=[sys.executable, "-m", "codespec.commands.cli", "serve"])
    client = await config.start()
    await client.initialize_session(
        types.InitializeParams(
            capabilities=types.ClientCapabilities(window=types.WindowClientCapabilities(work_done_progress=True)),
            root_uri=root.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name="big")],
            initialization_options={
                "model": str(server_model_dir),
                "device": "cpu",
                "index": {"path": str(tmp_path_factory.mktemp("index") / "index.db")},
            },
        )
    )
    yield client
    await client.shutdown_session()
    await client.stop()


@pytest.mark.slow
async def test_cancelling_the_progress_stops_indexing_and_reindex_still_works(client):
    while not indexing_values(client):  # the begin of the start-up scan
        await next_progress(client)
    [(token, values)] = [(t, v) for t, v in client.progress_reports.items() if str(t).startswith("codespec/indexing")]
    assert isinstance(values[0], types.WorkDoneProgressBegin) and values[0].cancellable
    client.window_work_done_progress_cancel(types.WorkDoneProgressCancelParams(token=token))
    while not isinstance(client.progress_reports[token][-1], types.WorkDoneProgressEnd):
        await next_progress(client)
    end = client.progress_reports[token][-1]
    assert "cancelled" in end.message
    stats = await client.protocol.send_request_async("codespec/stats", {})
    assert stats.index_documents == 0  # nothing of the cancelled scan was installed

    await asyncio.wait_for(
        client.workspace_execute_command_async(types.ExecuteCommandParams(command="codespec.reindex")), WAIT_S
    )
    ends = [values[-1] for values in indexing_values(client) if isinstance(values[-1], types.WorkDoneProgressEnd)]
    while len(ends) < 2:
        await next_progress(client)
        ends = [values[-1] for values in indexing_values(client) if isinstance(values[-1], types.WorkDoneProgressEnd)]
    assert f"{FILES} files indexed (done)" in ends[-1].message
    stats = await client.protocol.send_request_async("codespec/stats", {})
    assert stats.index_documents == FILES
