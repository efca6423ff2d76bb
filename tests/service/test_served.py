"""The engine-URL mode's failures before any request: a clear message, a non-zero exit, no hang."""

import socket
import subprocess
import sys

import pytest

from codespec.service.engine.served import EngineEndpoint, EngineUnavailable


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed once the probe goes


def test_an_engine_that_is_not_running_is_named_in_the_error():
    url = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(EngineUnavailable, match="unreachable.*is it running"):
        EngineEndpoint(url).served_model()


@pytest.mark.parametrize(
    ("url", "message"),
    [("ftp://host:1", "expected http://HOST:PORT"), (None, "is unreachable")],
)
def test_serve_with_a_bad_engine_url_exits_with_the_reason(url, message):
    url = url or f"http://127.0.0.1:{closed_port()}"
    result = subprocess.run(
        [sys.executable, "-m", "codespec.commands.cli", "serve", "--http", "--engine-url", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert message in result.stderr and "Traceback" not in result.stderr
