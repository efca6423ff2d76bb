"""`codespec serve --http` as real processes: the token file is made once (0600) and reused by every
later serve, a serve that cannot listen leaves it alone, `--new-token` replaces it; SIGTERM stops
the server at once and says so."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from codespec.vllm_proposer.launch import read_until

pytestmark = pytest.mark.slow  # subprocess servers: `python -m pytest --full` runs it

SERVE = [sys.executable, "-m", "codespec.commands.cli", "serve"]
WAIT_S = 120
LISTENING = r"HTTP API on (http://127\.0\.0\.1:(\d+)/v1)  token (written to|read from) (\S+)"


def serve(model: Path, token_file: Path, *arguments: str) -> subprocess.Popen:
    env = {key: value for key, value in os.environ.items() if key != "CODESPEC_TOKEN"}
    return subprocess.Popen(
        [*SERVE, "--http", "--model", str(model), "--device", "cpu", "--token-file", str(token_file), *arguments],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def models(url: str, token: str) -> list[str]:
    client = openai.OpenAI(base_url=url, api_key=token, max_retries=0, timeout=WAIT_S)
    return [model.id for model in client.models.list().data]


def stop_and_read(process: subprocess.Popen) -> str:
    process.send_signal(signal.SIGTERM)
    rest = process.stderr.read() if process.stderr else ""
    assert process.wait(timeout=WAIT_S) == 0, rest
    return rest


def test_the_token_is_made_once_kept_by_a_failed_start_and_replaced_on_request(server_model_dir, tmp_path):
    token_file = tmp_path / "runtime" / "token"
    first = serve(server_model_dir, token_file, "--port", "0")
    try:
        listening = read_until(first, LISTENING, time.monotonic() + WAIT_S)
        url, port = listening.group(1), listening.group(2)
        assert (listening.group(3), listening.group(4)) == ("written to", str(token_file))
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        before = token_file.stat()
        assert models(url, token)

        # a second serve on the same port cannot listen: it says so and leaves the token file alone
        second = serve(server_model_dir, token_file, "--port", port, "--new-token")
        _, errors = second.communicate(timeout=WAIT_S)
        assert second.returncode == 2 and "cannot listen" in errors, errors
        after = token_file.stat()
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
        assert token_file.read_text().strip() == token
        assert models(url, token)  # the running server's clients keep working

        said = stop_and_read(first)
        assert "codespec: stopping (SIGTERM)" in said and "codespec: stopped in" in said
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()

    again = serve(server_model_dir, token_file, "--port", "0")  # a restart reuses the file's token
    try:
        listening = read_until(again, LISTENING, time.monotonic() + WAIT_S)
        assert (listening.group(3), listening.group(4)) == ("read from", str(token_file))
        assert models(listening.group(1), token)
        stop_and_read(again)
    finally:
        if again.poll() is None:
            again.kill()
            again.wait()

    renewed = serve(server_model_dir, token_file, "--port", "0", "--new-token")
    try:
        listening = read_until(renewed, LISTENING, time.monotonic() + WAIT_S)
        assert listening.group(3) == "written to"
        new_token = token_file.read_text().strip()
        assert new_token != token and stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert models(listening.group(1), new_token)
        with pytest.raises(openai.AuthenticationError):
            models(listening.group(1), token)
        stop_and_read(renewed)
    finally:
        if renewed.poll() is None:
            renewed.kill()
            renewed.wait()
