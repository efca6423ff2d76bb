"""The command line LSP clients build: vscode-languageclient appends ``--stdio`` (and may pass
``--clientProcessId``); other transports are refused with a message, not an argparse usage line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from lsprotocol import types
from pytest_lsp import ClientServerConfig

pytestmark = pytest.mark.slow  # subprocess servers: `python -m pytest --full` runs it

SERVE = [sys.executable, "-m", "codespec.commands.cli", "serve"]


@pytest.mark.asyncio
async def test_stdio_and_client_process_id_flags_start_the_server(server_model_dir, tmp_path):
    config = ClientServerConfig(server_command=[*SERVE, "--stdio", f"--clientProcessId={os.getpid()}"])
    client = await config.start()
    try:
        result = await client.initialize_session(
            types.InitializeParams(
                capabilities=types.ClientCapabilities(),
                root_uri=tmp_path.as_uri(),
                initialization_options={"model": str(server_model_dir), "device": "cpu", "index": {"enabled": False}},
            )
        )
        assert result.capabilities.inline_completion_provider
    finally:
        await client.shutdown_session()


@pytest.mark.parametrize("flag", ["--node-ipc", "--pipe=/tmp/x.sock", "--socket=5007"])
def test_other_transports_are_refused_with_a_message(flag):
    done = subprocess.run([*SERVE, flag], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "speaks LSP over stdio" in done.stderr and "transport" in done.stderr


def test_server_exits_when_the_client_process_is_gone():
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    server = subprocess.Popen(
        [*SERVE, "--clientProcessId", str(parent.pid)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        parent.wait(timeout=30)
        rc = server.wait(timeout=60)  # the watchdog polls every 2 s
        assert rc == 0
        assert f"client process {parent.pid} is gone" in server.stderr.read()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
