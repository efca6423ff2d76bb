"""Robustness soak: random, truncated and mutated messages against `codespec serve`, over stdio and
over the websocket, checking after every batch that the server is alive, answered every request it
owes an answer, and keeps its memory bounded.

    python -m bench.soak --transport both --messages 10000 --seed 0

Without ``--model`` it runs on a tiny random model (the test suite's fixture shape): robustness
does not depend on what the model says, and a small model sends many messages per second.

The LSP half is here (messages: :func:`lsp_message`, :func:`lsp_batch`), the websocket half in
``bench.soak_ws``, the raw stdio client in ``bench.soak_stdio`` and what both send and count in
``bench.soak_values``; tests/lsp/test_fuzz_stdio.py and tests/websocket_api/test_fuzz_ws.py drive
the same generators with hypothesis.

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
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.soak_stdio import StdioServer
from bench.soak_values import (
    Tally,
    encode,
    frame,
    mutate,
    nested,
    position,
    random_text,
    tiny_model,
)
from bench.soak_ws import soak_ws


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
        change: dict[str, Any] = {
            "range": {"start": start, "end": end},
            "text": random_text(rng, rng.choice([0, 1, 5, 40])),
        }
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
            error = error if isinstance(error, dict) else {}
            code = error.get("code", "result")
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
