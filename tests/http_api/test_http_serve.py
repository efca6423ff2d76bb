"""`codespec serve --http` as a process: with the websocket endpoint, and beside the stdio LSP,
sharing one engine service (one model, one index)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import time

import openai
import pytest
from lsprotocol import types
from pytest_lsp import ClientServerConfig

from codespec.vllm_proposer.launch import free_port, read_until

pytestmark = pytest.mark.slow  # subprocess servers: `python -m pytest --full` runs it

SERVE = [sys.executable, "-m", "codespec.commands.cli", "serve"]
WAIT_S = 120


def start_serve(*arguments: str) -> subprocess.Popen:
    """`codespec serve ARGUMENTS` with no token in the environment (so one is generated); stderr piped."""
    env = {key: value for key, value in os.environ.items() if key != "CODESPEC_TOKEN"}
    return subprocess.Popen(
        [*SERVE, *arguments],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_http_and_ws_in_one_process_with_a_generated_token(server_model_dir, tmp_path):
    from websockets.sync.client import connect

    token_file = tmp_path / "token"
    process = start_serve(
        "--http", "--ws", "--http-port", "0", "--ws-port", "0", "--model", str(server_model_dir),
        "--device", "cpu", "--token-file", str(token_file),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + WAIT_S
        ws = read_until(process, r"websocket on (ws://127\.0\.0\.1:\d+/)  token written to (\S+)", deadline)
        http = read_until(process, r"HTTP API on (http://127\.0\.0\.1:\d+/v1)  token written to (\S+)", deadline)
        assert ws.group(2) == http.group(2) == str(token_file)  # one token for both, its path printed
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()

        client = openai.OpenAI(base_url=http.group(1), api_key=token, max_retries=0, timeout=WAIT_S)
        assert client.models.list().data[0].id == str(server_model_dir)
        completion = client.completions.create(model="codespec", prompt="def f(x):\n    return ", max_tokens=4)
        assert completion.usage.completion_tokens >= 1
        line = read_until(
            process,
            r"codespec: http complete model=\S+ prompt=(\d+) \(cached \d+\) output=(\d+) tokens/forward=[\d.]+ "
            r"proposer=\S+ \w+ \d+ ms",
            deadline,
        )  # one line per request on stderr
        assert (int(line.group(1)), int(line.group(2))) == (
            completion.usage.prompt_tokens,
            completion.usage.completion_tokens,
        )
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=http.group(1), api_key="wrong", max_retries=0).models.list()

        with connect(ws.group(1), additional_headers={"Authorization": f"Bearer {token}"}) as connection:
            connection.send(json.dumps({"type": "stats", "id": "s"}))
            stats = json.loads(connection.recv(timeout=WAIT_S))["stats"]
        assert stats["requests"].get("complete", 0) >= 1  # the HTTP request ran on the same service
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=WAIT_S) == 0


@pytest.mark.asyncio
async def test_http_beside_the_stdio_lsp_shares_its_service(server_model_dir, tmp_path, capfd):
    port = free_port()
    config = ClientServerConfig(
        server_command=[
            *SERVE,
            "--stdio",
            "--http",
            "--http-port",
            str(port),
            "--model",
            str(server_model_dir),
            "--device",
            "cpu",
        ],
        server_env={**os.environ, "CODESPEC_TOKEN": "shared-token"},
    )
    client = await config.start()
    try:
        await client.initialize_session(
            types.InitializeParams(
                capabilities=types.ClientCapabilities(),
                root_uri=tmp_path.as_uri(),
                initialization_options={"model": str(server_model_dir), "device": "cpu", "index": {"enabled": False}},
            )
        )
        api = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="shared-token", max_retries=0, timeout=WAIT_S
        )
        try:
            before = await client.protocol.send_request_async("codespec/stats", {})
            completion = await api.completions.create(model="codespec", prompt="x = ", max_tokens=3)
            chat = await api.chat.completions.create(
                model="codespec", messages=[{"role": "user", "content": "```\ny = 2\n```"}], max_tokens=5
            )
        finally:
            await api.close()
        assert completion.usage.completion_tokens >= 1 and chat.usage.completion_tokens >= 1
        after = await asyncio.wait_for(client.protocol.send_request_async("codespec/stats", {}), WAIT_S)
        requests, old = after.requests._asdict(), before.requests._asdict()  # pygls hands back namedtuples
        # The LSP's service ran the HTTP requests: one model in the process, not two.
        assert requests.get("complete", 0) == old.get("complete", 0) + 1
        assert requests.get("chat", 0) == old.get("chat", 0) + 1
    finally:
        await client.shutdown_session()
    loaded = [line for line in capfd.readouterr().err.splitlines() if line.startswith("codespec: model ")]
    assert len(loaded) == 1, loaded  # the server's stderr: the model was loaded once


def test_port_is_refused_when_it_is_ambiguous():
    done = subprocess.run([*SERVE, "--http", "--ws", "--port", "9000"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--port is ambiguous" in done.stderr and "--http-port" in done.stderr
