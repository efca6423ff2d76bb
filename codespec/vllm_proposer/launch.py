"""vLLM's OpenAI server with codespec's proposer, and codespec's door in front of it, as processes.

vLLM lives in its own environment (its pins are not codespec's), so scripts and tests start it as
a subprocess of that environment's python and talk to it over HTTP; what they read back is its
Prometheus ``/metrics``, where the drafts it proposed and accepted are counted (docs/vllm.md).
Standard library only: this module loads in either environment.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

SERVED_NAME = "codespec-default"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def read_until(process: subprocess.Popen, pattern: str, deadline: float) -> re.Match:
    """Lines of ``process``'s stderr until one matches ``pattern`` (codespec's doors print their
    addresses there); an error naming what was seen when it exits or the deadline passes."""
    seen: list[str] = []
    while time.monotonic() < deadline:
        line = process.stderr.readline() if process.stderr else ""
        if not line:
            raise RuntimeError(f"the process exited ({process.poll()}): {''.join(seen)[-4000:]}")
        seen.append(line)
        match = re.search(pattern, line)
        if match:
            return match
    raise RuntimeError(f"no line matched {pattern!r} in time: {''.join(seen)[-4000:]}")


def stop(process: subprocess.Popen | None, timeout: float) -> None:
    """Terminate ``process`` and wait for it; killed if it outlives ``timeout`` seconds."""
    if process is None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def metric(url: str, name: str, label: str = "") -> float:
    """One counter of an engine's Prometheus ``/metrics``, summed over the series whose labels hold ``label``."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as reply:
        lines = reply.read().decode().splitlines()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in lines
        if line.startswith(name) and not line.startswith(name + "_created") and label in line
    )


@dataclass
class VllmServer:
    """``python -m vllm.entrypoints.openai.api_server`` on ``model`` (``vllm serve`` does not start from
    the CPU wheel); ``speculative_config`` is the JSON of ``--speculative-config``, None for none."""

    python: str
    model: Path
    log: Path
    speculative_config: str | None = None
    port: int = 0  # 0: a free one
    max_model_len: int = 1024
    dtype: str = "float32"
    memory_share: float = 0.1  # --gpu-memory-utilization: on the CPU build, a share of *CPU* memory
    extra: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # added to this process's environment
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        command = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
                   "--served-model-name", SERVED_NAME, "--dtype", self.dtype,
                   "--max-model-len", str(self.max_model_len), "--gpu-memory-utilization", str(self.memory_share),
                   "--host", "127.0.0.1", "--port", str(self.port), *self.extra]  # fmt: skip
        if self.speculative_config:
            command += ["--speculative-config", self.speculative_config]
        return command

    def start(self, ready_s: float = 600.0) -> VllmServer:
        """Start it and wait until it answers ``/v1/models`` (on two cores: ~40 s to load, compile, warm up)."""
        self.port = self.port or free_port()
        with self.log.open("w") as sink:
            self.process = subprocess.Popen(
                self.command(), stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
            )  # fmt: skip
        deadline = time.monotonic() + ready_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM exited ({self.process.returncode}):\n{self.log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=5) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                time.sleep(2)
        self.close()
        raise RuntimeError(f"vLLM did not answer in {ready_s:.0f} s:\n{self.log.read_text()[-4000:]}")

    def metric(self, name: str, label: str = "") -> float:
        return metric(self.url, name, label)

    def close(self) -> None:
        stop(self.process, timeout=60)
        self.process = None

    def __enter__(self) -> VllmServer:
        return self if self.process else self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Door:
    """``codespec serve --http`` as a process (in front of ``engine_url`` when given; its own model
    otherwise, from ``arguments``); a token is generated into ``token_file``."""

    token_file: Path
    engine_url: str | None = None
    arguments: tuple[str, ...] = ()
    process: subprocess.Popen | None = None
    base_url: str = ""  # the HTTP API's address, read from the door's own line on stderr
    log_tail: deque[str] = field(default_factory=lambda: deque(maxlen=200))  # its last stderr lines

    def start(self, ready_s: float = 120.0) -> Door:
        command = [sys.executable, "-m", "codespec.commands.cli", "serve", "--http", "--http-port", "0",
                   "--token-file", str(self.token_file), *self.arguments]  # fmt: skip
        if self.engine_url:
            command += ["--engine-url", self.engine_url]
        env = {key: value for key, value in os.environ.items() if key != "CODESPEC_TOKEN"}
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
        )
        try:
            found = read_until(self.process, r"HTTP API on (http://\S+/v1)", time.monotonic() + ready_s)
        except RuntimeError:
            self.close()
            raise
        self.base_url = found.group(1)
        # keep reading its log, or a full pipe would stall the door mid-run
        threading.Thread(target=self._drain, args=(self.process,), daemon=True).start()
        return self

    def _drain(self, process: subprocess.Popen) -> None:
        for line in process.stderr or ():
            self.log_tail.append(line)

    @property
    def token(self) -> str:
        return self.token_file.read_text().strip()

    def close(self) -> None:
        stop(self.process, timeout=30)
        self.process = None

    def __enter__(self) -> Door:
        return self if self.process else self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
