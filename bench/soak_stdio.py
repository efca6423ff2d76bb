"""`codespec serve` over stdio as a subprocess, driven with raw bytes (the robustness soak,
``bench.soak``, and the JSON-RPC tests): frames in, parsed messages out, kept by id."""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.soak_values import SERVE, answer_key, frame, memory_mb


class StdioServer:
    """`codespec serve` as a subprocess, driven with raw bytes on its stdin; its stdout parsed on
    a thread. Responses are kept by id (a list: a duplicate answer shows); responses with
    ``"id": null`` separately; server-to-client requests are answered with null."""

    def __init__(
        self,
        model: Path,
        workspace: Path,
        options: dict | None = None,
        stderr_path: Path | None = None,
        args: tuple[str, ...] = (),  # more of `codespec serve`'s flags (--http, --ws: doors beside stdio)
    ) -> None:
        self.model, self.workspace = Path(model), Path(workspace)
        self.options = options or {}
        self.stderr_path = stderr_path or Path(tempfile.mkstemp(prefix="codespec-stdio-", suffix=".log")[1])
        self._stderr = open(self.stderr_path, "wb")
        self.process = subprocess.Popen(
            [*SERVE, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr
        )
        self.responses: dict[Any, list[dict]] = {}
        self.null_id: list[dict] = []
        self.notifications: list[dict] = []
        self._cond = threading.Condition()
        self._write_lock = threading.Lock()
        self._eof = False
        self._reader = threading.Thread(target=self._read, name="soak-stdout", daemon=True)
        self._reader.start()

    # ---- io -----------------------------------------------------------------------------------
    def _read(self) -> None:
        out = self.process.stdout
        assert out is not None  # started with stdout=PIPE
        try:
            while True:
                length = None
                while True:
                    line = out.readline()
                    if not line:
                        return
                    if not line.strip():
                        break
                    name, _, value = line.decode("ascii").partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                if length is None:
                    raise RuntimeError("the server sent a message without Content-Length")
                message = json.loads(out.read(length))
                if "method" in message and "id" in message:  # a request to the client
                    self.send({"jsonrpc": "2.0", "id": message["id"], "result": None})
                    continue
                with self._cond:
                    if "method" in message:
                        self.notifications.append(message)
                        del self.notifications[:-200]
                    elif message.get("id") is None:
                        self.null_id.append(message)
                    else:
                        self.responses.setdefault(answer_key(message["id"]), []).append(message)
                    self._cond.notify_all()
        finally:
            with self._cond:
                self._eof = True
                self._cond.notify_all()

    def send_bytes(self, data: bytes) -> None:
        stdin = self.process.stdin
        assert stdin is not None  # started with stdin=PIPE
        with self._write_lock:
            stdin.write(data)
            stdin.flush()

    def send(self, message: dict) -> None:
        self.send_bytes(frame(message))

    def request(self, method: str, params: Any = None, msg_id: Any = None, timeout: float = 60) -> dict:
        msg_id = msg_id if msg_id is not None else f"r-{time.monotonic_ns()}"
        self.send({"jsonrpc": "2.0", "id": msg_id, "method": method, **({} if params is None else {"params": params})})
        answers = self.wait_for([msg_id], timeout)
        if msg_id not in answers:
            raise TimeoutError(f"{method} {msg_id!r} got no answer in {timeout} s")
        return answers[msg_id][0]

    def wait_for(self, ids, timeout: float) -> dict[Any, list[dict]]:
        """Answers to ``ids`` once all have one, or at the deadline (those that have one)."""
        keys = {answer_key(i): i for i in ids}
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                missing = [k for k in keys if k not in self.responses]
                left = deadline - time.monotonic()
                if not missing or left <= 0 or self._eof:
                    return {keys[k]: list(self.responses[k]) for k in keys if k in self.responses}
                self._cond.wait(min(left, 1.0))

    def wait_null(self, count: int, timeout: float) -> list[dict]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.null_id) < count and not self._eof and time.monotonic() < deadline:
                self._cond.wait(min(1.0, max(0.0, deadline - time.monotonic())))
            return list(self.null_id)

    # ---- session ------------------------------------------------------------------------------
    def initialize(self, timeout: float = 180) -> dict:
        options = {
            "model": str(self.model),
            "device": "cpu",
            "debounceMs": 10,
            "index": {"path": str(self.workspace / ".codespec" / "index.db")},
            **self.options,
        }
        result = self.request(
            "initialize",
            {
                "processId": None,
                "rootUri": self.workspace.as_uri(),
                "capabilities": {},
                "initializationOptions": options,
            },
            msg_id="initialize",
            timeout=timeout,
        )
        self.send({"jsonrpc": "2.0", "method": "initialized", "params": {}})
        return result

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def memory(self) -> dict[str, float]:
        return memory_mb(self.process.pid)

    def stderr_text(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def close(self, timeout: float = 30) -> int | None:
        if self.alive:
            try:
                self.request("shutdown", msg_id="soak-shutdown", timeout=timeout)
                self.send({"jsonrpc": "2.0", "method": "exit"})
                self.process.wait(timeout)
            except (OSError, TimeoutError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait(timeout)
        self._stderr.close()
        return self.process.returncode
