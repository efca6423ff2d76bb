"""Hostile input at the LSP door (`codespec serve` over stdio, the shipped model): 300 seeded
mutations of valid JSON-RPC messages (``bench.hostile_cases``: lone surrogates, 5,000-digit and
non-finite numbers, wrong types, deep nesting, truncation, bytes that are not UTF-8), one frame at
a time: each request is answered by its id (a parse error with its id when the bytes show it, else
with ``"id": null``), none with -32603, and a ``codespec/stats`` after each one is answered too."""

from __future__ import annotations

import pytest

from bench.hostile_cases import LSP_BASES, LSP_KEEP, message_cases
from bench.hostile_input import run_lsp
from bench.soak_stdio import StdioServer

pytestmark = pytest.mark.slow  # a subprocess server: `python -m pytest --full` runs it

FUZZ_SEED = 4813
FUZZ_CASES = 300
ANSWER_S = 60  # a hang guard: each answer normally comes within a second


@pytest.fixture(scope="module")
def stdio_server(tmp_path_factory):
    from codespec.core.default_model import target_path

    root = tmp_path_factory.mktemp("hostile-workspace")
    server = StdioServer(target_path(), root, stderr_path=tmp_path_factory.mktemp("hostile-logs") / "stderr.log")
    server.initialize()
    uri = LSP_BASES[0]["params"]["textDocument"]["uri"]
    opened = {"uri": uri, "languageId": "python", "version": 1, "text": "def add(a, b):\n    return a + b\n"}
    server.send({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": opened}})
    yield server
    server.close()


def test_seeded_mutations_are_answered_and_none_is_an_internal_error(stdio_server):
    cases = message_cases(FUZZ_SEED, FUZZ_CASES, LSP_BASES, "lsp", LSP_KEEP)
    tally = run_lsp(stdio_server, cases, ANSWER_S)
    assert tally.sent == FUZZ_CASES and tally.answered == FUZZ_CASES, tally.as_dict()
    assert not tally.server_errors and not tally.hangs and not tally.failures, tally.as_dict()
    for code in (-32700, -32602, "result", "notification"):  # it refused, and it served
        assert tally.statuses[code] > 0, tally.as_dict()
    assert stdio_server.alive
    log = stdio_server.stderr_text()
    assert "Traceback" not in log, log[log.index("Traceback") - 500 :][:4000]
