"""Robustness soak: random, truncated and mutated messages against `codespec serve`, over stdio and
over the websocket, checking after every batch that the server is alive, answered every request it
owes an answer, and keeps its memory bounded.

    python -m bench.soak --transport both --messages 10000 --seed 0

Without ``--model`` it runs on a tiny random model (the test suite's fixture shape): robustness
does not depend on what the model says, and a small model sends many messages per second.

The raw clients here (:class:`StdioServer`, :class:`WsServer`) and the message generators
(:func:`lsp_batch`, :func:`ws_batch`) are what tests/lsp/test_fuzz_*.py drive with hypothesis.

What counts:

- **crashes**: the server process exited;
- **hangs**: a request owed an answer (a well-formed request with a valid id, or a broken one whose
  id the server can read, e.g. JSON sent without a header) got none within ``--answer-timeout``
  after its batch;
- **unanswered** / **duplicates**: requests owed an answer that got none / more than one by the end;
- **peak RSS**: the server's VmHWM (``/proc/PID/status``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERVE = [sys.executable, "-m", "commands.cli", "serve"]
SURROGATE_TEXT = "x = \ud800\ny = "


# ---- process -------------------------------------------------------------------------------
def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak) of a process, in MiB."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":", 1)
                    out[key] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return out


def tiny_model(directory: Path) -> Path:
    """The tests' tiny random model (tests/lsp/conftest.py), written to ``directory``."""
    import sysconfig

    from bench.shapes import save_random_model

    if (directory / "config.json").exists():
        return directory
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    corpus = [(stdlib / name).read_text(encoding="utf-8") for name in ("json/encoder.py", "textwrap.py", "shlex.py")]
    directory.mkdir(parents=True, exist_ok=True)
    return save_random_model(
        directory, corpus, shape=(64, 2, 4, 2, 128), vocab_size=384, seed=3, init_std=0.25, max_context=2048
    )


DEEP = re.compile(r'"@@deep:(\d+)@@"')


def encode(payload: Any) -> str:
    """JSON text of ``payload``; ``nested(n)`` placeholders become n levels of arrays (deeper than
    json.dumps itself can write)."""
    return DEEP.sub(lambda match: "[" * int(match.group(1)) + "1" + "]" * int(match.group(1)), json.dumps(payload))


def frame(payload: Any, header: str = "Content-Length", line_end: bytes = b"\r\n") -> bytes:
    body = payload if isinstance(payload, bytes) else encode(payload).encode()
    return b"%s: %d%s%s" % (header.encode(), len(body), line_end, line_end) + body


class StdioServer:
    """`codespec serve` as a subprocess, driven with raw bytes on its stdin; its stdout parsed on
    a thread. Responses are kept by id (a list: a duplicate answer shows); responses with
    ``"id": null`` separately; server-to-client requests are answered with null."""

    def __init__(
        self, model: Path, workspace: Path, options: dict | None = None, stderr_path: Path | None = None
    ) -> None:
        self.model, self.workspace = Path(model), Path(workspace)
        self.options = options or {}
        self.stderr_path = stderr_path or Path(tempfile.mkstemp(prefix="codespec-stdio-", suffix=".log")[1])
        self._stderr = open(self.stderr_path, "wb")
        self.process = subprocess.Popen(SERVE, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr)
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
                        self.responses.setdefault(_key(message["id"]), []).append(message)
                    self._cond.notify_all()
        finally:
            with self._cond:
                self._eof = True
                self._cond.notify_all()

    def send_bytes(self, data: bytes) -> None:
        with self._write_lock:
            self.process.stdin.write(data)
            self.process.stdin.flush()

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
        keys = {_key(i): i for i in ids}
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


def _key(msg_id: Any) -> Any:
    return ("s", msg_id) if isinstance(msg_id, str) else ("i", msg_id)


# ---- LSP messages --------------------------------------------------------------------------
@dataclass
class Send:
    """Bytes to send, the ids that must be answered exactly once, and those that may be (at most once)."""

    data: bytes
    must: list = field(default_factory=list)
    may: list = field(default_factory=list)
    kind: str = ""


@dataclass
class LspState:
    """What the generator knows: the documents it opened, ids sent, the next id."""

    uris: list[str]
    documents: dict[str, str] = field(default_factory=dict)
    next_id: int = 1
    recent: list = field(default_factory=list)  # ids of recent requests, for $/cancelRequest
    after_fault: bool = False  # the last message was a broken frame (it may swallow a headerless one)

    def new_id(self, rng) -> Any:
        self.next_id += 1
        msg_id = self.next_id if rng.random() < 0.6 else f"id-{self.next_id}"
        self.recent = [*self.recent[-15:], msg_id]
        return msg_id


WEIRD_VALUES: list[Any] = [
    None,
    True,
    -1,
    0,
    2**31,
    2**63,
    -(2**40),
    1.5,
    float("inf"),
    "",
    "x",
    "\ud800",
    [],
    {},
    [1, 2],
    {"a": 1},
    "😀" * 3,
    "a" * 300,
]


def weird_value(rng, big: bool = True) -> Any:
    roll = rng.random()
    if big and roll < 0.04:
        return "é" * rng.choice([10_000, 300_000, 1_100_000])  # huge strings, some over maxDocumentBytes
    if roll < 0.10:
        return nested(rng.choice([5, 40, 70, 200, 1500]))
    return rng.choice(WEIRD_VALUES)


def nested(depth: int) -> Any:
    if depth > 100:
        return f"@@deep:{depth}@@"  # written out by encode()
    value: Any = 1
    for level in range(depth):
        value = {"a": value} if level % 2 else [value]
    return value


def random_text(rng, size: int) -> str:
    pieces = [
        "def f(x):\n",
        "    return x + 1\n",
        "\n",
        "class A:\n    pass\n",
        "é",
        "😀",
        "\t",
        "\r\n",
        "中文",
        "x = 1  # note\n",
        "\x00",
        "\u2028",
        "'''",
        "\\",
        SURROGATE_TEXT,
    ]
    out, length = [], 0
    while length < size:
        piece = rng.choice(pieces)
        out.append(piece)
        length += len(piece)
    return "".join(out)


def position(rng, text: str | None) -> dict:
    lines = text.split("\n") if text else [""]
    roll = rng.random()
    if roll < 0.75:
        line = rng.randrange(len(lines))
        return {"line": line, "character": rng.randrange(len(lines[line]) + 2)}
    return {"line": rng.choice([-1, 0, len(lines) + 3, 2**31 - 1, 2**31]), "character": rng.choice([-5, 0, 3, 2**31])}


def mutate(rng, value: Any) -> Any:
    """``value`` (a JSON message) with one leaf or container replaced by a value of another type."""
    if not isinstance(value, (dict, list)) or not value or rng.random() < 0.15:
        return weird_value(rng)
    if isinstance(value, dict):
        key = rng.choice(list(value))
        out = dict(value)
        if rng.random() < 0.15:
            del out[key]
        else:
            out[key] = mutate(rng, value[key])
        return out
    index = rng.randrange(len(value))
    return [*value[:index], mutate(rng, value[index]), *value[index + 1 :]]


def lsp_request(rng, state: LspState) -> tuple[str, Any]:
    uri = rng.choice(state.uris + ["file:///never-opened.py", "untitled:x" * rng.choice([1, 1, 50_000])])
    text = state.documents.get(uri)
    at = {"textDocument": {"uri": uri}, "position": position(rng, text)}
    choices = [
        ("textDocument/inlineCompletion", {**at, "context": {"triggerKind": rng.choice([1, 2])}}),
        ("textDocument/completion", at),
        ("codespec/stats", {}),
        (
            "codespec/edit",
            {
                "textDocument": {"uri": uri},
                "range": {"start": position(rng, text), "end": position(rng, text)},
                "instruction": rng.choice([None, "rename x", "é" * 20]),
            },
        ),
        (
            "workspace/executeCommand",
            {
                "command": rng.choice(["codespec.accepted", "codespec.clearHistory", "codespec.nothing"]),
                "arguments": rng.choice([[uri, "x = 1"], [], [1, 2, 3], None]),
            },
        ),
        ("textDocument/hover", at),
        ("no/such/method", {"x": 1}),
    ]
    return rng.choice(choices)


def lsp_notification(rng, state: LspState) -> tuple[str, Any]:
    uri = rng.choice(state.uris)
    roll = rng.random()
    if roll < 0.30 or uri not in state.documents:
        size = rng.choice([0, 50, 400, 3000, 3000, 300_000])
        text = random_text(rng, size)
        state.documents[uri] = text
        return "textDocument/didOpen", {
            "textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}
        }
    text = state.documents[uri]
    if roll < 0.65:
        start, end = position(rng, text), position(rng, text)
        change = {"range": {"start": start, "end": end}, "text": random_text(rng, rng.choice([0, 1, 5, 40]))}
        if rng.random() < 0.2:
            change = {"text": random_text(rng, 200)}
            state.documents[uri] = change["text"]
        return "textDocument/didChange", {
            "textDocument": {"uri": uri, "version": rng.randrange(100)},
            "contentChanges": [change],
        }
    if roll < 0.72:
        state.documents.pop(uri, None)
        return "textDocument/didClose", {"textDocument": {"uri": uri}}
    if roll < 0.80:
        return "textDocument/didSave", {"textDocument": {"uri": uri}}
    if roll < 0.95 and state.recent:
        return "$/cancelRequest", {"id": rng.choice(state.recent)}
    return rng.choice([("$/setTrace", {"value": "off"}), ("no/such/notification", {}), ("$/unknown", None)])


FRAME_FAULTS = [
    "lowercase",
    "lf",
    "non-numeric",
    "negative",
    "missing",
    "no-colon",
    "bare",
    "too-small",
    "too-large",
    "huge",
    "garbage",
    "flip",
]


def lsp_message(rng, state: LspState) -> Send:
    """One message: 45% well-formed requests, 30% notifications, the rest broken on purpose."""
    roll = rng.random()
    if roll < 0.75:
        is_request = roll < 0.45
        method, params = lsp_request(rng, state) if is_request else lsp_notification(rng, state)
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        if is_request:
            message["id"] = state.new_id(rng)
        if rng.random() < 0.12:  # a valid method with wrong types
            message["params"] = mutate(rng, message.get("params", {}))
        return Send(frame(message), must=[message["id"]] if is_request else [], kind=method)
    if roll < 0.85:  # a broken envelope around a request
        msg_id = state.new_id(rng)
        envelope: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": "codespec/stats", "params": {}}
        fault = rng.choice(["no-method", "method-type", "jsonrpc", "id-type", "params-type", "deep", "after-id"])
        must = [msg_id]
        if fault == "no-method":
            del envelope["method"]
        elif fault == "method-type":
            envelope["method"] = rng.choice([5, None, ["x"], {"m": 1}])
        elif fault == "jsonrpc":
            envelope["jsonrpc"] = rng.choice(["1.0", None, 2])
        elif fault == "id-type":
            envelope["id"] = rng.choice([1.5, True, None, [1], {"i": 1}])
            must = []  # answered with "id": null
        elif fault == "params-type":
            envelope["params"] = rng.choice([5, "x", True])
        elif fault == "deep":
            envelope["params"] = nested(rng.choice([80, 1200, 3000]))
        elif fault == "after-id":
            envelope["method"] = "textDocument/didOpen"  # a notification sent with an id
        return Send(frame(envelope), must=must, kind=f"envelope:{fault}")
    fault = rng.choice(FRAME_FAULTS)
    msg_id = state.new_id(rng)
    request = {"jsonrpc": "2.0", "id": msg_id, "method": "codespec/stats", "params": {}}
    body = encode(request).encode()
    if fault == "lowercase":
        return Send(frame(request, header="content-length"), must=[msg_id], kind="frame:lowercase")
    if fault == "lf":
        return Send(frame(request, line_end=b"\n"), must=[msg_id], kind="frame:lf")
    if fault in ("non-numeric", "negative", "missing", "no-colon"):
        header = {
            "non-numeric": b"Content-Length: abc\r\n",
            "negative": b"Content-Length: -%d\r\n" % len(body),
            "missing": b"Content-Type: application/vscode-jsonrpc\r\n",
            "no-colon": b"Content-Length %d\r\n" % len(body),
        }[fault]
        return Send(header + b"\r\n" + body, must=[msg_id], kind=f"frame:{fault}")
    if fault == "bare":
        return Send(body, must=[msg_id], kind="frame:bare")
    if fault == "too-small":
        return Send(b"Content-Length: %d\r\n\r\n" % (len(body) // 2) + body, may=[msg_id], kind="frame:too-small")
    if fault == "too-large":
        return Send(
            b"Content-Length: %d\r\n\r\n" % (len(body) + rng.choice([1, 30, 5000])) + body,
            must=[msg_id],
            kind="frame:too-large",
        )
    if fault == "huge":
        return Send(
            b"Content-Length: %d\r\n\r\n" % rng.choice([10**12, 2**40, 10**30]) + body, must=[msg_id], kind="frame:huge"
        )
    if fault == "garbage":
        junk = bytes(rng.getrandbits(8) for _ in range(rng.choice([1, 20, 300])))
        return Send(junk.replace(b"\n", b" ") + b"\r\n", kind="frame:garbage")
    msg_id = f"flip-{state.next_id}-{rng.getrandbits(32):08x}"  # a flipped id cannot be another message's
    request["id"] = msg_id
    data = bytearray(frame(request))  # one byte flipped anywhere in the frame
    data[rng.randrange(len(data))] = rng.getrandbits(8)
    return Send(bytes(data), may=[msg_id], kind="frame:flip")


def in_sequence(state: LspState, send: Send) -> Send:
    """``send`` as the next message of the stream: a message without a (recognisable) header right
    after a frame whose length was wrong (too small, too large, refused, a flipped byte) or junk is
    read as part of that frame, so its answer is not owed."""
    if send.kind in ("frame:bare", "frame:no-colon") and state.after_fault:
        send.may, send.must = send.must, []
    state.after_fault = send.kind.startswith("frame:") and send.kind not in ("frame:lowercase", "frame:lf")
    return send


def lsp_batch(rng, state: LspState, size: int) -> list[Send]:
    return [in_sequence(state, lsp_message(rng, state)) for _ in range(size)]


@dataclass
class Tally:
    sent: int = 0
    owed: int = 0
    answered: int = 0
    unanswered: int = 0
    duplicates: int = 0
    hangs: int = 0
    crashes: int = 0
    internal: int = 0  # answers that were internal errors (-32603 / "internal")
    batches: int = 0
    errors: dict = field(default_factory=dict)  # error code -> count
    peak_rss_mb: float = 0.0
    first_rss_mb: float = 0.0
    elapsed_s: float = 0.0
    failures: list = field(default_factory=list)  # (kind, id) of unanswered or duplicated requests
    pending: list = field(default_factory=list)  # (kind, id) not answered in time (hangs), settled at the end

    def as_dict(self) -> dict:
        return {key: value for key, value in self.__dict__.items() if key not in ("failures", "pending")} | {
            "failures": self.failures[:20]
        }


def settle(server: StdioServer, tally: Tally, timeout: float) -> None:
    """Requests that hung: answered late (still a hang), or never (unanswered)."""
    late = server.wait_for([msg_id for _, msg_id in tally.pending], timeout) if tally.pending else {}
    for kind, msg_id in tally.pending:
        if msg_id in late:
            tally.answered += 1
            tally.failures.append(("late", kind, msg_id))
        else:
            tally.unanswered += 1
            tally.failures.append(("unanswered", kind, msg_id))
    tally.pending = []


def check_lsp_batch(server: StdioServer, sends: list[Send], tally: Tally, answer_timeout: float) -> None:
    """Send ``sends`` then a sentinel request; wait for everything owed; count."""
    for send in sends:
        server.send_bytes(send.data)
    sentinel = f"sentinel-{tally.batches}"
    server.send({"jsonrpc": "2.0", "id": sentinel, "method": "codespec/stats", "params": {}})
    must = [(send.kind, i) for send in sends for i in send.must] + [("sentinel", sentinel)]
    answers = server.wait_for([i for _, i in must], answer_timeout)
    may = [(send.kind, i) for send in sends for i in send.may]
    may_answers = server.wait_for([i for _, i in may], 0)
    tally.batches += 1
    tally.sent += len(sends) + 1
    tally.owed += len(must)
    for kind, msg_id in must:
        got = answers.get(msg_id, [])
        if not got:
            tally.hangs += 1  # counted as unanswered too if no answer comes by the end (settle)
            tally.pending.append((kind, msg_id))
        else:
            tally.answered += 1
            if len(got) > 1:
                tally.duplicates += 1
                tally.failures.append(("duplicate", kind, msg_id))
            error = got[0].get("error")
            code = error.get("code") if isinstance(error, dict) else "result"
            tally.errors[str(code)] = tally.errors.get(str(code), 0) + 1
            if code == -32603:  # an internal error is a bug, even when it is an answer
                tally.internal += 1
                tally.failures.append(("internal", kind, msg_id, str(error.get("message"))[:300]))
    for kind, msg_id in may:
        if len(may_answers.get(msg_id, [])) > 1:
            tally.duplicates += 1
            tally.failures.append(("duplicate", kind, msg_id))
    memory = server.memory()
    tally.peak_rss_mb = max(tally.peak_rss_mb, memory.get("VmHWM", 0.0))
    if not server.alive:
        tally.crashes += 1


def soak_stdio(
    model: Path,
    messages: int,
    seed: int,
    batch: int = 20,
    answer_timeout: float = 120,
    workspace: Path | None = None,
    log=print,
) -> Tally:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="codespec-soak-") as temporary:
        root = Path(workspace or temporary)
        (root / "a.py").write_text("def helper(value):\n    return value * 2\n")
        server = StdioServer(model, root, SOAK_LSP_OPTIONS)
        tally = Tally()
        started = time.monotonic()
        try:
            server.initialize()
            tally.first_rss_mb = server.memory().get("VmRSS", 0.0)
            state = LspState([(root / f"doc{i}.py").as_uri() for i in range(6)])
            while tally.sent < messages and server.alive:
                check_lsp_batch(server, lsp_batch(rng, state, min(batch, messages - tally.sent)), tally, answer_timeout)
                if tally.batches % 25 == 0:
                    log(
                        f"stdio: {tally.sent} messages, {tally.unanswered} unanswered, peak {tally.peak_rss_mb:.0f} MiB"
                    )
            settle(server, tally, answer_timeout)
        finally:
            tally.elapsed_s = time.monotonic() - started
            if not server.alive:
                tally.crashes = max(tally.crashes, 1)
            server.close()
        return tally


SOAK_LSP_OPTIONS = {
    "limits": {"lineTokens": 8, "blockTokens": 12, "editTokens": 16, "deadlineMs": 20_000},
    "maxDocumentBytes": 256_000,
}


# ---- websocket ------------------------------------------------------------------------------
class WsServer:
    """`codespec serve --ws` as a subprocess (its port read from stderr)."""

    def __init__(
        self, model: Path, token: str = "soak-token", max_message_bytes: int = 1 << 20, stderr_path: Path | None = None
    ) -> None:
        self.token = token
        self.stderr_path = stderr_path or Path(tempfile.mkstemp(prefix="codespec-ws-", suffix=".log")[1])
        self._stderr = open(self.stderr_path, "wb")
        self.process = subprocess.Popen(
            [
                *SERVE,
                "--ws",
                "--port",
                "0",
                "--token",
                token,
                "--model",
                str(model),
                "--device",
                "cpu",
                "--max-message-bytes",
                str(max_message_bytes),
            ],
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
        )
        self.url = self._wait_for_port()

    def _wait_for_port(self, timeout: float = 180) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(r"ws://([^\s/]+)/", self.stderr_path.read_text(errors="replace"))
            if match:
                return f"ws://{match.group(1)}/"
            if self.process.poll() is not None:
                raise RuntimeError(f"codespec serve --ws exited: {self.stderr_path.read_text()[-2000:]}")
            time.sleep(0.1)
        raise TimeoutError("codespec serve --ws did not start")

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def memory(self) -> dict[str, float]:
        return memory_mb(self.process.pid)

    def close(self) -> None:
        if self.alive:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        self._stderr.close()


@dataclass
class WsSend:
    text: str
    must: Any = None  # id that gets exactly one final message (done / cancelled / error / stats)
    kind: str = ""


def ws_message(rng, counter: list[int], max_message_bytes: int) -> WsSend:
    counter[0] += 1
    msg_id: Any = counter[0] if rng.random() < 0.5 else f"w-{counter[0]}"
    roll = rng.random()
    if roll < 0.55:
        kind = rng.choice(["complete", "complete", "edit", "stats"])
        if kind == "complete":
            body: dict[str, Any] = (
                {"prefix": random_text(rng, rng.choice([5, 80, 900])), "suffix": "\n"}
                if rng.random() < 0.6
                else {"document": (text := random_text(rng, 200)), "position": position(rng, text)}
            )
            body.update(rng.choice([{}, {"max_tokens": 4}, {"stop": ["\n"]}, {"temperature": 0.5, "max_tokens": 3}]))
        elif kind == "edit":
            body = {"text": random_text(rng, rng.choice([10, 60])), "max_tokens": 6}
        else:
            body = {}
        message = {"type": kind, "id": msg_id, **body}
        if rng.random() < 0.15:
            mutated = mutate(rng, message)
            text = encode(mutated if isinstance(mutated, dict) else message)
            return WsSend(text, kind=f"mutated:{kind}")  # answered, but maybe without its id (or the id mutated)
        return WsSend(json.dumps(message), msg_id, kind)
    if roll < 0.65:
        return WsSend(json.dumps({"type": "cancel", "id": rng.choice([msg_id, counter[0] - 1, "nope"])}), kind="cancel")
    fault = rng.choice(
        ["surrogate", "oversize", "not-json", "deep", "unknown-type", "no-id", "big-int", "array", "wrong-type"]
    )
    if fault == "surrogate":
        return WsSend(json.dumps({"type": "complete", "id": msg_id, "prefix": SURROGATE_TEXT}), msg_id, fault)
    if fault == "oversize":
        return WsSend(
            json.dumps({"type": "complete", "id": msg_id, "prefix": "x" * (max_message_bytes + 10)}), msg_id, fault
        )
    if fault == "not-json":
        return WsSend('{"type": "complete", "id": ' + json.dumps(msg_id) + ', "prefix": "x"', msg_id, fault)
    if fault == "deep":
        return WsSend(
            '{"type": "complete", "id": ' + json.dumps(msg_id) + ', "x": ' + "[" * 3000 + "]" * 3000 + "}",
            msg_id,
            fault,
        )
    if fault == "unknown-type":
        return WsSend(json.dumps({"type": "teleport", "id": msg_id}), msg_id, fault)
    if fault == "no-id":
        return WsSend(json.dumps({"type": "complete", "prefix": "x"}), kind=fault)
    if fault == "big-int":
        return WsSend(
            '{"type": "complete", "id": ' + json.dumps(msg_id) + ', "max_tokens": 1' + "0" * 5000 + "}", msg_id, fault
        )
    if fault == "array":
        return WsSend("[1, 2, 3]", kind=fault)
    return WsSend(
        json.dumps(
            {
                "type": "complete",
                "id": msg_id,
                "prefix": rng.choice([5, None, [1]]),
                "max_tokens": rng.choice([0, -1, "x", 10**9]),
            }
        ),
        msg_id,
        fault,
    )


FINAL_TYPES = {"done", "cancelled", "error", "stats"}


async def ws_connection(url: str, token: str, sends: list[WsSend], answer_timeout: float) -> tuple[dict, int]:
    """Send ``sends`` on one connection; return {id: [final messages]} for owed ids, and how many
    messages arrived in all."""
    import asyncio

    from websockets.asyncio.client import connect

    owed = {_key(send.must) for send in sends if send.must is not None}
    finals: dict[Any, list] = {}
    received = 0
    async with connect(url, additional_headers={"Authorization": f"Bearer {token}"}, max_size=64 << 20) as ws:
        for send in sends:
            await ws.send(send.text)
        deadline = asyncio.get_running_loop().time() + answer_timeout
        while not owed <= set(finals):
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            try:
                message = json.loads(await asyncio.wait_for(ws.recv(), left))
            except TimeoutError:
                break
            received += 1
            if message.get("type") in FINAL_TYPES and message.get("id") is not None:
                if message.get("type") == "error" and message.get("code") in ("unknown_id", "duplicate_id"):
                    continue  # a cancel that came late, or an id reused by a mutated message: not a final
                finals.setdefault(_key(message["id"]), []).append(message)
    return finals, received


def soak_ws(
    model: Path, messages: int, seed: int, batch: int = 12, connections: int = 2, answer_timeout: float = 120, log=print
) -> Tally:
    import asyncio

    rng = random.Random(seed)
    max_message_bytes = 64 << 10
    server = WsServer(model, max_message_bytes=max_message_bytes)
    tally = Tally()
    started = time.monotonic()
    counter = [0]
    try:
        tally.first_rss_mb = server.memory().get("VmRSS", 0.0)
        while tally.sent < messages and server.alive:
            plans = [[ws_message(rng, counter, max_message_bytes) for _ in range(batch)] for _ in range(connections)]
            results = asyncio.run(_gather(server, plans, answer_timeout))
            tally.batches += 1
            for plan, (finals, _) in zip(plans, results):
                tally.sent += len(plan)
                for send in plan:
                    if send.must is None:
                        continue
                    tally.owed += 1
                    got = finals.get(_key(send.must), [])
                    if not got:  # the connection waited answer_timeout: a hang, and (closed since) unanswered
                        tally.unanswered += 1
                        tally.hangs += 1
                        tally.failures.append(("unanswered", send.kind, send.must))
                        continue
                    tally.answered += 1
                    if len(got) > 1:
                        tally.duplicates += 1
                        tally.failures.append(("duplicate", send.kind, send.must))
                    code = got[0].get("code") or got[0].get("type")
                    tally.errors[str(code)] = tally.errors.get(str(code), 0) + 1
                    if code == "internal":
                        tally.internal += 1
                        tally.failures.append(("internal", send.kind, send.must, str(got[0].get("message"))[:300]))
            tally.peak_rss_mb = max(tally.peak_rss_mb, server.memory().get("VmHWM", 0.0))
            if tally.batches % 25 == 0:
                log(f"ws: {tally.sent} messages, {tally.unanswered} unanswered, peak {tally.peak_rss_mb:.0f} MiB")
    finally:
        tally.elapsed_s = time.monotonic() - started
        if not server.alive:
            tally.crashes += 1
        server.close()
    return tally


async def _gather(server: WsServer, plans, answer_timeout: float):
    import asyncio

    return await asyncio.gather(*(ws_connection(server.url, server.token, plan, answer_timeout) for plan in plans))


# ---- report ---------------------------------------------------------------------------------
def report_rows(name: str, tally: Tally) -> str:
    codes = ", ".join(f"{code} {count}" for code, count in sorted(tally.errors.items(), key=lambda kv: -kv[1]))
    return (
        f"| {name} | {tally.sent} | {tally.owed} | {tally.crashes} | {tally.hangs} | {tally.unanswered} | "
        f"{tally.duplicates} | {tally.internal} | {tally.first_rss_mb:.0f} | {tally.peak_rss_mb:.0f} | {tally.elapsed_s:.0f} | {codes} |"
    )


HEADER = (
    "| transport | messages | answers owed | crashes | hangs | unanswered | duplicates | internal errors "
    "| RSS after start, MiB | peak RSS, MiB | seconds | answers by code |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--transport", choices=("stdio", "ws", "both"), default="both")
    parser.add_argument("--messages", type=int, default=10_000, help="per transport")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: a tiny random model)")
    parser.add_argument(
        "--answer-timeout",
        type=float,
        default=120.0,
        help="seconds after a batch by which every owed answer must have come",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    args = parser.parse_args(argv)
    model = args.model or tiny_model(Path(tempfile.gettempdir()) / "codespec-soak-model")
    results = {}
    if args.transport in ("stdio", "both"):
        results["stdio"] = soak_stdio(
            model,
            args.messages,
            args.seed,
            answer_timeout=args.answer_timeout,
            log=lambda line: print(line, file=sys.stderr, flush=True),
        )
    if args.transport in ("ws", "both"):
        results["websocket"] = soak_ws(
            model,
            args.messages,
            args.seed,
            answer_timeout=args.answer_timeout,
            log=lambda line: print(line, file=sys.stderr, flush=True),
        )
    print(HEADER)
    for name, tally in results.items():
        print(report_rows(name, tally))
    for name, tally in results.items():
        for failure in tally.failures[:10]:
            print(f"{name}: {failure}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({name: tally.as_dict() for name, tally in results.items()}, indent=2))
    bad = any(t.crashes or t.hangs or t.unanswered or t.duplicates or t.internal for t in results.values())
    return 1 if bad else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
