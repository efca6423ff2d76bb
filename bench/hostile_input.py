"""Hostile input at every door of one real `codespec serve --stdio --http --ws` (the shipped model):
malformed HTTP requests (``bench.hostile_cases``: bad bodies and bad framing) and malformed
websocket and LSP messages, one at a time, each with a bounded wait. Counted: answers of 5xx (an
``internal`` error at the websocket, JSON-RPC -32603 at the LSP), hangs (no answer in time), error
answers that are not the door's JSON shape, whether the server is still up, RSS before and after.

    python -m bench.hostile_input --seed 48 --http 500 --ws 150 --lsp 150 --json docs/bench/hostile-input.json

The doors' tests (tests/http_api/test_http_hostile.py, tests/websocket_api/test_ws_hostile.py,
tests/lsp/test_lsp_hostile.py) run the same checks on fewer cases.
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11

from bench.hostile_cases import (
    LSP_BASES,
    LSP_KEEP,
    WS_BASES,
    WS_KEEP,
    HttpCase,
    MessageCase,
    http_cases,
    message_cases,
)
from bench.soak_values import answer_key, frame
from codespec.service.doors.jsonpeek import FOUND, peek_id
from codespec.service.requests import jsondecode

ANSWER_S = 60.0  # a hang guard: every answer here normally comes within a second or two
LINGER_S = 0.25  # a case cut short waits this long for an answer before its client ends its side
FINAL_WS_TYPES = {"done", "cancelled", "error", "stats"}


@dataclass
class DoorTally:
    """What one door did with its cases."""

    sent: int = 0
    answered: int = 0
    server_errors: int = 0  # 5xx, websocket "internal", JSON-RPC -32603
    hangs: int = 0
    not_json: int = 0  # an error answer that is not the door's JSON error shape
    statuses: Counter = field(default_factory=Counter)
    failures: list = field(default_factory=list)
    slowest_s: float = 0.0

    def fail(self, what: str, case_kind: str, detail: Any) -> None:
        self.failures.append((what, case_kind, str(detail)[:300]))

    def as_dict(self) -> dict:
        return {
            "sent": self.sent,
            "answered": self.answered,
            "server_errors": self.server_errors,
            "hangs": self.hangs,
            "not_json": self.not_json,
            "answers": dict(sorted(self.statuses.items(), key=lambda item: str(item[0]))),
            "slowest_answer_s": round(self.slowest_s, 3),
            "failures": self.failures[:20],
        }


# ---- HTTP ---------------------------------------------------------------------------------------
@dataclass
class HttpAnswer:
    status: int | None  # None: no response came (closed, or the wait ran out)
    headers: dict
    body: bytes
    timed_out: bool
    elapsed_s: float


def exchange(host: str, port: int, case: HttpCase, timeout: float = ANSWER_S) -> HttpAnswer:
    """Send one raw request; its response as h11 reads it, as soon as it is whole."""
    start = time.monotonic()
    reader = _ResponseReader()
    timed_out = False
    with socket.create_connection((host, port), timeout=timeout) as sock:
        try:
            sock.sendall(case.data)
            if case.cut_short or (case.half_close and not select.select([sock], [], [], LINGER_S)[0]):
                sock.shutdown(socket.SHUT_WR)  # no answer yet: the request waits for more; say there is none
        except OSError:  # the server answered and closed before the whole request was written
            pass
        deadline = start + timeout
        while not reader.done:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                timed_out = True
                break
            except OSError:
                chunk = b""
            reader.feed(chunk)
            if not chunk:
                break
    return HttpAnswer(
        reader.status, reader.headers, reader.body, timed_out and reader.status is None, time.monotonic() - start
    )


class _ResponseReader:
    """One HTTP response, parsed by h11 as its bytes arrive."""

    def __init__(self) -> None:
        self.client = h11.Connection(h11.CLIENT)
        self.client.send(h11.Request(method="POST", target="/", headers=[("Host", "x"), ("Content-Length", "0")]))
        self.client.send(h11.EndOfMessage())
        self.status: int | None = None
        self.headers: dict = {}
        self.body = b""
        self.done = False

    def feed(self, data: bytes) -> None:
        self.client.receive_data(data)  # b"": the end of the connection
        try:
            while not self.done:
                event = self.client.next_event()
                if isinstance(event, h11.Response):
                    self.status = event.status_code
                    self.headers = {k.decode().lower(): v.decode("latin-1") for k, v in event.headers}
                elif isinstance(event, h11.Data):
                    self.body += event.data
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    self.done = True
                elif event is h11.NEED_DATA:
                    return
        except h11.RemoteProtocolError:  # a response cut short: what came is kept
            self.done = True


def check_http(case: HttpCase, answer: HttpAnswer, tally: DoorTally) -> None:
    tally.sent += 1
    tally.slowest_s = max(tally.slowest_s, answer.elapsed_s)
    if answer.status is None:
        if answer.timed_out:
            tally.hangs += 1
            tally.fail("hang", case.kind, case.data[:200])
        else:
            tally.fail("closed without an answer", case.kind, case.data[:200])
        tally.statuses["none"] += 1
        return
    tally.answered += 1
    tally.statuses[answer.status] += 1
    if answer.status >= 500:
        tally.server_errors += 1
        tally.fail(f"status {answer.status}", case.kind, answer.body[:300])
    if answer.status >= 400 and not _json_error(answer):
        tally.not_json += 1
        tally.fail("not a JSON error body", case.kind, (answer.headers.get("content-type"), answer.body[:200]))


def _json_error(answer: HttpAnswer) -> bool:
    if not answer.headers.get("content-type", "").startswith("application/json"):
        return False
    try:
        body = json.loads(answer.body)
    except ValueError:
        return False
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, str):  # Ollama's API: {"error": "..."}
        return bool(error)
    # OpenAI's {"error": {message, type, param, code}}; llama.cpp server's {"error": {code, message, type}}
    return isinstance(error, dict) and {"message", "type", "code"} <= set(error) and bool(error["message"])


def run_http(host: str, port: int, cases: list[HttpCase], timeout: float = ANSWER_S) -> DoorTally:
    tally = DoorTally()
    for case in cases:
        check_http(case, exchange(host, port, case, timeout), tally)
    return tally


# ---- websocket and LSP --------------------------------------------------------------------------
def owed_id(data: bytes) -> tuple[bool, Any]:
    """(whether the message can be matched to its answer by id, that id): the id of a decodable
    object, else the one ``peek_id`` reads from the bytes, as the doors do."""
    try:
        value = jsondecode.loads(data, utf8_errors="surrogatepass")
    except jsondecode.JsonInputError:
        state, found = peek_id(data)
        return (True, found) if state == FOUND else (False, None)
    if isinstance(value, dict) and "id" in value:
        raw = value["id"]
        valid = isinstance(raw, str) or (isinstance(raw, int) and not isinstance(raw, bool))
        return True, raw if valid else None
    return False, None


def run_ws(url: str, token: str, cases: list[MessageCase], timeout: float = ANSWER_S) -> DoorTally:
    """Each message, then its one final answer (matched by id, or any id-less error when the id
    cannot be read); a connection the server closes counts as a failure and is reopened."""
    from websockets.sync.client import connect

    tally = DoorTally()
    index = 0
    while index < len(cases):
        with connect(url, additional_headers={"Authorization": f"Bearer {token}"}, max_size=64 << 20) as ws:
            index = _ws_cases(ws, cases, index, tally, timeout)
    return tally


def _ws_cases(ws, cases: list[MessageCase], index: int, tally: DoorTally, timeout: float) -> int:
    """Cases from ``index`` on one connection; the index to go on from once it closes."""
    from websockets.exceptions import ConnectionClosed

    for number in range(index, len(cases)):
        case = cases[number]
        tally.sent += 1
        _, expected = owed_id(case.data)
        start = time.monotonic()
        try:
            try:
                ws.send(case.data.decode("utf-8"))
            except UnicodeDecodeError:
                ws.send(case.data)  # a binary message
            while True:
                left = timeout - (time.monotonic() - start)
                message = json.loads(ws.recv(timeout=max(0.01, left)))
                if message.get("type") in FINAL_WS_TYPES and message.get("id") in (expected, None):
                    break
        except TimeoutError:
            tally.hangs += 1
            tally.fail("hang", case.kind, case.data[:200])
            continue
        except ConnectionClosed as error:
            tally.fail("closed", case.kind, error)
            return number + 1
        tally.answered += 1
        tally.slowest_s = max(tally.slowest_s, time.monotonic() - start)
        code = message.get("code") if message["type"] == "error" else message["type"]
        tally.statuses[code] += 1
        if code == "internal":
            tally.server_errors += 1
            tally.fail("internal", case.kind, message)
    return len(cases)


def run_lsp(server, cases: list[MessageCase], timeout: float = ANSWER_S) -> DoorTally:
    """Each frame, then its answer when it has an id (a notification gets none, as JSON-RPC says),
    then a ``codespec/stats`` sentinel that must be answered: the server still reads and serves."""
    tally = DoorTally()
    for number, case in enumerate(cases):
        tally.sent += 1
        matched, expected = owed_id(case.data)
        nulls = len(server.null_id)
        start = time.monotonic()
        server.send_bytes(frame(case.data))
        sentinel = f"sentinel-{number}"
        server.send({"jsonrpc": "2.0", "id": sentinel, "method": "codespec/stats", "params": {}})
        answers = server.wait_for([sentinel], timeout)
        if sentinel not in answers:
            tally.hangs += 1
            tally.fail("sentinel unanswered", case.kind, case.data[:200])
            if not server.alive:
                tally.fail("server exited", case.kind, server.stderr_text()[-500:])
                break
            continue
        reply = None
        if expected is not None:
            got = server.wait_for([expected], timeout - (time.monotonic() - start))
            if expected not in got:
                tally.hangs += 1
                tally.fail("unanswered", case.kind, case.data[:200])
                continue
            reply = got[expected][-1]
            server.responses.pop(answer_key(expected), None)  # ids repeat only if a mutation reused one
        elif matched:
            nulls_now = server.wait_null(nulls + 1, timeout - (time.monotonic() - start))
            if len(nulls_now) <= nulls:
                tally.hangs += 1
                tally.fail("no null-id answer", case.kind, case.data[:200])
                continue
            reply = nulls_now[-1]
        tally.answered += 1
        tally.slowest_s = max(tally.slowest_s, time.monotonic() - start)
        code = "notification" if reply is None else (reply.get("error") or {}).get("code", "result")
        tally.statuses[code] += 1
        if code == -32603:
            tally.server_errors += 1
            tally.fail("internal", case.kind, reply)
    return tally


# ---- the probe ----------------------------------------------------------------------------------
TOKEN = "hostile-input-token"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def probe(seed: int, http: int, ws: int, lsp: int, workspace: Path) -> dict:
    from bench.soak_stdio import StdioServer
    from codespec.core.default_model import target_path

    http_port, ws_port = free_port(), free_port()
    (workspace / "a.py").write_text("def helper(value):\n    return value * 2\n")
    args = ("--stdio", "--http", "--ws", "--http-port", str(http_port), "--ws-port", str(ws_port), "--token", TOKEN)
    server = StdioServer(target_path(), workspace, {"maxDocumentBytes": 200_000}, args=args)
    try:
        server.initialize()
        server.send(
            {
                "jsonrpc": "2.0",
                "method": "textDocument/didOpen",
                "params": {
                    "textDocument": {
                        "uri": LSP_BASES[0]["params"]["textDocument"]["uri"],
                        "languageId": "python",
                        "version": 1,
                        "text": "def add(a, b):\n    return a + b\n",
                    }
                },
            }
        )
        _wait_listening(http_port)
        rss_before = server.memory().get("VmRSS", 0.0)
        started = time.monotonic()
        doors = {
            "http": run_http("127.0.0.1", http_port, http_cases(seed, http, TOKEN)),
            "websocket": run_ws(
                f"ws://127.0.0.1:{ws_port}/", TOKEN, message_cases(seed + 1, ws, WS_BASES, "ws", WS_KEEP)
            ),
            "lsp": run_lsp(server, message_cases(seed + 2, lsp, LSP_BASES, "lsp", LSP_KEEP)),
        }
        elapsed = time.monotonic() - started
        alive = server.alive and "result" in server.request("codespec/stats", {}, msg_id="after", timeout=ANSWER_S)
        memory = server.memory()
        log = server.stderr_text()
    finally:
        server.close()
    return {
        "seed": seed,
        "model": "shipped (codespec/models/default)",
        "command": "codespec serve --stdio --http --ws",
        "server_up_after": alive,
        "rss_mb_before": round(rss_before, 1),
        "rss_mb_after": round(memory.get("VmRSS", 0.0), 1),
        "rss_mb_peak": round(memory.get("VmHWM", 0.0), 1),
        "elapsed_s": round(elapsed, 1),
        "tracebacks_in_log": log.count("Traceback"),
        "doors": {name: tally.as_dict() for name, tally in doors.items()},
    }


def _wait_listening(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {port}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=48)
    parser.add_argument("--http", type=int, default=500, help="malformed HTTP requests")
    parser.add_argument("--ws", type=int, default=150, help="malformed websocket messages")
    parser.add_argument("--lsp", type=int, default=150, help="malformed LSP messages")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="codespec-hostile-") as workspace:
        report = probe(args.seed, args.http, args.ws, args.lsp, Path(workspace))
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    bad = not report["server_up_after"] or any(
        door["server_errors"] or door["hangs"] or door["not_json"] or door["failures"]
        for door in report["doors"].values()
    )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
