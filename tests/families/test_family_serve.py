"""`codespec serve` per family, driven by pytest-lsp as a real client (initializationOptions
model=DIR): one inline completion and one ``codespec/edit``, each equal to what plain decoding of
the same request gives in this process (greedy speculation is lossless), and the edit's prompt
the family's rewrite layout, through the chat template for the instruct tokenizer."""

from __future__ import annotations

import asyncio
import sys

import pytest
import pytest_asyncio
from family_layouts import FAMILIES
from lsprotocol import types
from pytest_lsp import ClientServerConfig

from codespec.core.prompts import PromptRenderer, Rewrite

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]  # slow: `python -m pytest --full` runs it

SOURCE = (
    "import os\n\n\ndef join_all(parts):\n    return os.path.join(*parts)\n\n\n"
    "def main(argv):\n    result = join_all(argv)\n    return result\n"
)
LIMITS = {"lineTokens": 8, "blockTokens": 12, "editTokens": 12, "deadlineMs": 600_000}
WAIT_S = 180  # a hang guard only
EDIT = {"start": {"line": 3, "character": 0}, "end": {"line": 4, "character": 31}}
INSTRUCTION = "rename parts to pieces"

# What each family's rewrite prompt starts with (the chat template's system turn for the instruct one).
REWRITE_HEADS = {
    "qwen2.5-coder": "<|file_sep|>original.py\n",
    "starcoder2": "<file_sep>original.py\n",
    "deepseek-coder": "<｜begin▁of▁sentence｜># Original:\n",
    "qwen2.5-coder-instruct": "<|im_start|>system\nYou are Qwen",
}


def expected(target, uri: str):
    """The inline completion and the edit's text by plain decoding, as the server builds them."""
    import dataclasses

    from codespec.service.engine.service import EngineService
    from codespec.service.requests.edit import edit_request, plan_edit
    from codespec.service.requests.inline import completion_request, trim_completion
    from codespec.service.requests.options import CompletionOptions, ServerOptions
    from codespec.service.requests.schema import Sampling

    options = ServerOptions(
        completion=CompletionOptions(
            line_tokens=LIMITS["lineTokens"],
            block_tokens=LIMITS["blockTokens"],
            edit_tokens=LIMITS["editTokens"],
            deadline_ms=LIMITS["deadlineMs"],
        )
    )
    service = EngineService(target, proposer="none")
    try:
        offset = SOURCE.index("join_all(argv)")
        request, context = completion_request(SOURCE, offset, options, service.target, invoked=True, uri=uri)
        completion = trim_completion(service.submit(dataclasses.replace(request, proposer="none")).wait().text, context)
        plan = plan_edit(SOURCE, {"range": EDIT, "instruction": INSTRUCTION}, "utf-16", options.completion.edit_tokens)
        edit = (
            service.submit(edit_request(plan, sampling=Sampling(proposer="none"), uri=uri, cursor=plan.start))
            .wait()
            .text
        )
    finally:
        service.close()
    return completion, edit


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def servers(family_checkpoints, tmp_path_factory):
    """One `codespec serve` per family, started at once (their start-up is mostly imports)."""

    async def start(name: str):
        family = family_checkpoints(name)
        root = tmp_path_factory.mktemp(f"serve-{name}")
        (root / "util.py").write_text(SOURCE)
        client = await ClientServerConfig(
            server_command=[sys.executable, "-m", "codespec.commands.cli", "serve"]
        ).start()
        await client.initialize_session(
            types.InitializeParams(
                capabilities=types.ClientCapabilities(
                    text_document=types.TextDocumentClientCapabilities(
                        inline_completion=types.InlineCompletionClientCapabilities(dynamic_registration=False)
                    )
                ),
                root_uri=root.as_uri(),
                workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name="workspace")],
                initialization_options={
                    "model": str(family.target),
                    "draft": str(family.draft),
                    "device": "cpu",
                    "limits": LIMITS,
                    "debounceMs": 10,
                    "index": {"path": str(root / "index.db")},
                },
            )
        )
        uri = (root / "util.py").as_uri()
        client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=SOURCE)
            )
        )
        return name, (client, uri)

    for name in FAMILIES:
        family_checkpoints(name)  # written before the servers start
    started = dict(await asyncio.wait_for(asyncio.gather(*(start(name) for name in FAMILIES)), WAIT_S))
    yield started

    async def stop(client):
        await client.shutdown_session()
        await client.stop()

    await asyncio.gather(*(stop(client) for client, _ in started.values()))


@pytest.mark.parametrize("name", FAMILIES)
async def test_inline_completion_and_edit_through_the_server(servers, family_checkpoints, loaded, monkeypatch, name):
    family = family_checkpoints(name)
    target = loaded(family.target)
    client, uri = servers[name]
    rewrites: list[str] = []
    render = PromptRenderer.render

    def spy(self, prompt):
        result = render(self, prompt)
        if isinstance(prompt, Rewrite):
            rewrites.append(result.text)
        return result

    monkeypatch.setattr(PromptRenderer, "render", spy)
    completion, edit = expected(target, uri)
    assert rewrites and rewrites[0].startswith(REWRITE_HEADS[name]), rewrites[:1]
    if family.chat:
        assert rewrites[0].endswith("<|im_start|>assistant\n```\n") and INSTRUCTION in rewrites[0]
        assert PromptRenderer(target.tokenizer, target.prompt_format).stop_token_ids() >= {151_645, 151_643}

    line, character = 8, len("    result = ")
    items = await asyncio.wait_for(
        client.text_document_inline_completion_async(
            types.InlineCompletionParams(
                text_document=types.TextDocumentIdentifier(uri=uri),
                position=types.Position(line, character),
                context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
            )
        ),
        WAIT_S,
    )
    assert completion and len(items) == 1 and items[0].insert_text == completion

    response = await asyncio.wait_for(
        client.protocol.send_request_async(
            "codespec/edit", {"textDocument": {"uri": uri}, "editId": "e1", "range": EDIT, "instruction": INSTRUCTION}
        ),
        WAIT_S,
    )
    assert edit and response.edits[0].newText == edit
    stats = await client.protocol.send_request_async("codespec/stats", {})
    assert stats.prompt_format == family.prompt_format
    last = stats.last_requests[-1]
    assert last.kind == "edit" and last.prompt_tokens == len(target.encode(rewrites[0]))
