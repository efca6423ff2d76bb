"""`codespec serve` over stdio, driven with raw bytes: every request is answered, no input takes
the server down (issue 15). One server for the module; the shutdown test runs last."""

from __future__ import annotations

import json
import time

import pytest

from bench.soak_stdio import StdioServer
from bench.soak_values import frame

pytestmark = pytest.mark.slow  # a subprocess server: `python -m pytest --full` runs it

WAIT_S = 60  # a hang guard only: every wait below ends when the answer arrives
MAX_DOCUMENT_BYTES = 200_000


@pytest.fixture(scope="module")
def server(server_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("jsonrpc-workspace")
    (root / "a.py").write_text("def helper(value):\n    return value * 2\n")
    server = StdioServer(
        server_model_dir,
        root,
        {"limits": {"lineTokens": 6, "blockTokens": 8, "deadlineMs": 60_000}, "maxDocumentBytes": MAX_DOCUMENT_BYTES},
        stderr_path=tmp_path_factory.mktemp("jsonrpc-logs") / "stderr.log",
    )
    server.initialize()
    server.uri = (root / "doc.py").as_uri()
    open_document(server, server.uri, "import os\n\ndef main(argv):\n    return os.path.join(*argv)\n")
    yield server
    server.close()


def open_document(server, uri: str, text: str) -> None:
    server.send(
        {
            "jsonrpc": "2.0",
            "method": "textDocument/didOpen",
            "params": {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}},
        }
    )


_ids = iter(range(1000, 10**9))


def stats_request() -> tuple[int, bytes]:
    msg_id = next(_ids)
    return msg_id, frame({"jsonrpc": "2.0", "id": msg_id, "method": "codespec/stats", "params": {}})


def answer(server, msg_id):
    answers = server.wait_for([msg_id], WAIT_S)
    assert msg_id in answers, f"request {msg_id!r} was never answered"
    assert len(answers[msg_id]) == 1, answers[msg_id]
    return answers[msg_id][0]


def error_of(server, message: dict) -> dict:
    server.send(message)
    reply = answer(server, message["id"])
    assert "error" in reply, reply
    return reply["error"]


# ---- frames: a bad one is answered, the next one is served -----------------------------------
BODY = b'{"jsonrpc": "2.0", "id": "bad-frame", "method": "codespec/stats", "params": {}}'
FRAMES = {  # bytes, the error the bad frame gets (None: served normally), whether its id is readable
    "lowercase content-length": (b"content-length: %d\r\n\r\n" % len(BODY) + BODY, None, True),
    "LF-only line ends": (b"Content-Length: %d\n\n" % len(BODY) + BODY, None, True),
    "non-numeric length": (b"Content-Length: twelve\r\n\r\n" + BODY, -32700, True),
    "negative length": (b"Content-Length: -%d\r\n\r\n" % len(BODY) + BODY, -32700, True),
    "missing length": (b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n\r\n" + BODY, -32700, True),
    "length too small": (b"Content-Length: 20\r\n\r\n" + BODY, -32700, False),
    "length too large": (b"Content-Length: %d\r\n\r\n" % (len(BODY) + 25) + BODY, -32700, True),
    "header line without a colon": (b"Content-Length %d\r\n\r\n" % len(BODY) + BODY, -32700, True),
    "bare JSON": (BODY, -32700, True),
    "Content-Length 10**12": (b"Content-Length: 1000000000000\r\n\r\n" + BODY, -32600, True),
    "body not JSON": (b"Content-Length: 9\r\n\r\n{not json", -32700, False),
}


@pytest.mark.parametrize("case", FRAMES)
def test_a_bad_frame_is_answered_and_the_server_keeps_serving(server, case):
    data, code, has_id = FRAMES[case]
    null_before = len(server.null_id)
    server.responses.pop(("s", "bad-frame"), None)
    msg_id, follow_up = stats_request()
    server.send_bytes(data)
    if case == "length too large":  # answered once nothing more comes (a live pipe), not later
        reply = answer(server, "bad-frame")
        assert reply["error"]["code"] == code
    server.send_bytes(follow_up)
    assert "result" in answer(server, msg_id), "the message after the bad frame was not served"
    if code is None:
        assert "result" in answer(server, "bad-frame")
    elif has_id:
        reply = answer(server, "bad-frame")
        assert reply["error"]["code"] == code and reply["error"]["message"]
    else:
        nulls = server.wait_null(null_before + 1, WAIT_S)
        assert nulls[-1]["error"]["code"] == code
    assert server.alive


def test_a_huge_length_costs_no_memory(server):
    before = server.memory()["VmHWM"]
    msg_id, follow_up = stats_request()
    server.send_bytes(b"Content-Length: 1000000000000\r\n\r\n" + BODY.replace(b"bad-frame", b"huge") + follow_up)
    assert answer(server, "huge")["error"]["code"] == -32600
    assert "result" in answer(server, msg_id)
    assert server.memory()["VmHWM"] - before < 50


# ---- envelopes and params ---------------------------------------------------------------------
def inline_params(**overrides) -> dict:
    params = {
        "textDocument": {"uri": "file:///x.py"},
        "position": {"line": 0, "character": 0},
        "context": {"triggerKind": 1},
    }
    params.update(overrides)
    return {key: value for key, value in params.items() if value is not ...}


INVALID = {  # method, params, code, text the message must contain
    "inline: params {}": ("textDocument/inlineCompletion", {}, -32602, "params.context"),
    "inline: no context": (
        "textDocument/inlineCompletion",
        inline_params(context=...),
        -32602,
        "required field missing @ params.context",
    ),
    "inline: line -1": (
        "textDocument/inlineCompletion",
        inline_params(position={"line": -1, "character": 0}),
        -32602,
        "but was -1",
    ),
    "inline: line 2**31": (
        "textDocument/inlineCompletion",
        inline_params(position={"line": 2**31, "character": 0}),
        -32602,
        "but was 2147483648",
    ),
    "inline: position null": ("textDocument/inlineCompletion", inline_params(position=None), -32602, "params.position"),
    "inline: uri a number": (
        "textDocument/inlineCompletion",
        inline_params(textDocument={"uri": 5}),
        -32602,
        "expected a string, got int @ params.textDocument.uri",
    ),
    "completion: params {}": ("textDocument/completion", {}, -32602, "params.textDocument"),
    "completion: line -1": (
        "textDocument/completion",
        {"textDocument": {"uri": "file:///x.py"}, "position": {"line": -1, "character": 0}},
        -32602,
        "-1",
    ),
    "completion: trigger kind a string": (
        "textDocument/completion",
        {
            "textDocument": {"uri": "file:///x.py"},
            "position": {"line": 0, "character": 0},
            "context": {"triggerKind": "invoked"},
        },
        -32602,
        "params.context.triggerKind",
    ),
    "completion: line a string": (
        "textDocument/completion",
        {"textDocument": {"uri": "file:///x.py"}, "position": {"line": "3", "character": 0}},
        -32602,
        "expected an integer, got str @ params.position.line",
    ),
    "edit: params a list": ("codespec/edit", [1, 2], -32602, "textDocument.uri"),
    "params a number": ("codespec/stats", 5, -32602, "must be an object or an array"),
    "command: no arguments": ("workspace/executeCommand", {"command": "codespec.accepted"}, -32602, "arguments"),
    "command: unknown": ("workspace/executeCommand", {"command": "codespec.nothing"}, -32602, "codespec.nothing"),
    "hover (not implemented)": ("textDocument/hover", {"x": 1}, -32601, "textDocument/hover"),
    "unknown method": ("no/such/method", {}, -32601, "no/such/method"),
    "a notification sent with an id": ("textDocument/didOpen", {}, -32600, "notification"),
    "a second initialize": ("initialize", {"capabilities": {}}, -32600, "already initialized"),
}


@pytest.mark.parametrize("case", INVALID)
def test_invalid_params_and_methods_get_the_right_error(server, case):
    method, params, code, text = INVALID[case]
    error = error_of(server, {"jsonrpc": "2.0", "id": f"invalid-{case}", "method": method, "params": params})
    assert error["code"] == code, error
    assert text in error["message"], error


def test_position_errors_after_the_schema_are_invalid_params_too(server):
    error = error_of(
        server,
        {
            "jsonrpc": "2.0",
            "id": "past-the-end",
            "method": "textDocument/inlineCompletion",
            "params": inline_params(textDocument={"uri": server.uri}, position={"line": 500, "character": 0}),
        },
    )
    assert error["code"] == -32602 and "out of range" in error["message"]
    error = error_of(
        server,
        {
            "jsonrpc": "2.0",
            "id": "not-open",
            "method": "textDocument/completion",
            "params": {"textDocument": {"uri": "file:///never.py"}, "position": {"line": 0, "character": 0}},
        },
    )
    assert error["code"] == -32602 and "not open" in error["message"]


@pytest.mark.parametrize(
    "message, code, reply_id",
    [
        ({"jsonrpc": "2.0", "id": "no-method"}, -32600, "no-method"),
        ({"jsonrpc": "2.0", "id": "method-5", "method": 5}, -32600, "method-5"),
        ({"jsonrpc": "2.0", "id": "method-null", "method": None}, -32600, "method-null"),
        ({"jsonrpc": "1.0", "id": "old-jsonrpc", "method": "codespec/stats"}, -32600, "old-jsonrpc"),
        ({"jsonrpc": "2.0", "id": 1.5, "method": "codespec/stats"}, -32600, None),
        ({"jsonrpc": "2.0", "id": True, "method": "codespec/stats"}, -32600, None),
        ({"jsonrpc": "2.0", "id": ["x"], "method": "codespec/stats"}, -32600, None),
        ([{"jsonrpc": "2.0", "id": "batch", "method": "codespec/stats"}], -32600, None),
        ("just a string", -32600, None),
    ],
)
def test_invalid_envelopes(server, message, code, reply_id):
    null_before = len(server.null_id)
    server.send(message)
    if reply_id is None:
        reply = server.wait_null(null_before + 1, WAIT_S)[-1]
    else:
        reply = answer(server, reply_id)
    assert reply["error"]["code"] == code and reply["error"]["message"]


@pytest.mark.parametrize("depth, code", [(100, -32602), (1000, -32602), (100_000, -32602)])
def test_deeply_nested_params(server, depth, code):
    msg_id = f"deep-{depth}"
    body = (
        b'{"jsonrpc": "2.0", "id": "%s", "method": "textDocument/completion", "params": ' % msg_id.encode()
        + b'{"a": ' * depth
        + b"1"
        + b"}" * depth
        + b"}"
    )
    server.send_bytes(frame(body))
    error = answer(server, msg_id)["error"]
    assert error["code"] == code and "nested" in error["message"]
    assert server.alive


def test_a_cancel_with_a_bad_id_is_ignored(server):
    server.send({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": [1]}})
    server.send({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": "x"})
    msg_id, follow_up = stats_request()
    server.send_bytes(follow_up)
    assert "result" in answer(server, msg_id)


# ---- text that no encoder accepts ----------------------------------------------------------------
def test_a_document_with_a_lone_surrogate_is_served(server):
    """The JSON escape \\ud800 decodes to a lone surrogate, which the tokenizer cannot encode: it
    is replaced by U+FFFD (one code point, one UTF-16 unit: positions stay where they were)."""
    uri = server.uri.replace("doc.py", "surrogate.py")
    server.send_bytes(
        frame(
            b'{"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": '
            b'{"uri": "%s", "languageId": "python", "version": 1, "text": "x = \\ud800\\ny = "}}}' % uri.encode()
        )
    )
    for n, method in enumerate(["textDocument/completion", "textDocument/inlineCompletion"]):
        msg_id = f"surrogate-{n}"
        server.send(
            {
                "jsonrpc": "2.0",
                "id": msg_id,
                "method": method,
                "params": inline_params(textDocument={"uri": uri}, position={"line": 1, "character": 4}),
            }
        )
        reply = answer(server, msg_id)
        assert "result" in reply, reply
    server.send_bytes(
        frame(
            b'{"jsonrpc": "2.0", "id": "surrogate-position", "method": "textDocument/completion", '
            b'"params": {"textDocument": {"uri": "%s"}, "position": {"line": 0, "character": 5}}}' % uri.encode()
        )
    )  # just after the replaced character: a real position
    assert "result" in answer(server, "surrogate-position")


# ---- a document over maxDocumentBytes ---------------------------------------------------------
def test_a_huge_document_is_served_without_the_index(server):
    uri = server.uri.replace("doc.py", "huge.py")
    line = "    value_%d = compute(alpha, beta) + other[index] * 3  # a comment\n"
    text = "def f():\n" + "".join(line % i for i in range(50_000))  # 3.4 MB
    before = server.memory()["VmHWM"]
    log_before = server.stderr_text().count("over maxDocumentBytes")
    started = time.monotonic()
    open_document(server, uri, text)
    msg_id, follow_up = stats_request()
    server.send_bytes(follow_up)
    stats = answer(server, msg_id)["result"]
    assert time.monotonic() - started < 10  # the engine was not held by a tokenization of 3.4 MB
    assert [entry["indexed"] for entry in stats["documents"] if entry["uri"] == uri] == [False]
    server.send(
        {
            "jsonrpc": "2.0",
            "id": "huge-completion",
            "method": "textDocument/completion",
            "params": {"textDocument": {"uri": uri}, "position": {"line": 40_000, "character": 12}},
        }
    )
    assert "result" in answer(server, "huge-completion")
    assert server.memory()["VmHWM"] - before < 300  # was ~1.2 GB with the document indexed
    assert server.stderr_text().count("over maxDocumentBytes") == log_before + 1  # one line
    server.send({"jsonrpc": "2.0", "method": "textDocument/didClose", "params": {"textDocument": {"uri": uri}}})


def test_a_large_open_is_decoded_after_the_keystroke_behind_it_and_before_what_needs_it(server):
    """lsp.held: a large didOpen of another document, then a keystroke's inline completion and a
    request about the large document, in one write: all answered, the last one on its text."""
    big_uri = server.uri.replace("doc.py", "held.py")
    text = "x = 1\n" * 60_000 + "def tail_marker():\n"  # 360 kB
    open_big = {
        "jsonrpc": "2.0",
        "method": "textDocument/didOpen",
        "params": {"textDocument": {"uri": big_uri, "languageId": "python", "version": 1, "text": text}},
    }
    typed = {
        "jsonrpc": "2.0",
        "id": "held-typed",
        "method": "textDocument/inlineCompletion",
        "params": inline_params(textDocument={"uri": server.uri}, position={"line": 3, "character": 4}),
    }
    on_big = {
        "jsonrpc": "2.0",
        "id": "held-on-big",
        "method": "textDocument/completion",
        "params": {"textDocument": {"uri": big_uri}, "position": {"line": 60_000, "character": 17}},
    }
    msg_id, stats = stats_request()
    server.send_bytes(b"".join(frame(m) for m in (open_big, typed, on_big)) + stats)
    assert "result" in answer(server, "held-typed")
    assert "result" in answer(server, "held-on-big")  # not "document not open": released before it
    snapshot = answer(server, msg_id)["result"]
    assert snapshot["held_frames"] >= 1 and big_uri in [entry["uri"] for entry in snapshot["documents"]]
    server.send({"jsonrpc": "2.0", "method": "textDocument/didClose", "params": {"textDocument": {"uri": big_uri}}})


# ---- logs -----------------------------------------------------------------------------------
def test_logs_and_errors_clip_what_they_quote(server):
    log_before = len(server.stderr_text())
    uri = "file:///" + "u" * 1_000_000
    error = error_of(
        server,
        {
            "jsonrpc": "2.0",
            "id": "long-uri",
            "method": "textDocument/completion",
            "params": {"textDocument": {"uri": uri}, "position": {"line": 0, "character": 0}},
        },
    )
    assert error["code"] == -32602 and len(error["message"]) < 1000
    server.send(
        {
            "jsonrpc": "2.0",
            "method": "textDocument/didOpen",  # malformed: dropped with a log line
            "params": {"textDocument": {"uri": uri, "languageId": 5, "version": "x", "text": uri}},
        }
    )
    server.send(
        {
            "jsonrpc": "2.0",
            "method": "textDocument/didChange",
            "params": {"textDocument": {"uri": uri, "version": 2}, "contentChanges": [{"text": "x"}]},
        }
    )
    msg_id, follow_up = stats_request()
    server.send_bytes(follow_up)
    answer(server, msg_id)
    logged = server.stderr_text()[log_before:]
    assert len(logged) < 20_000, f"{len(logged)} characters logged"
    assert max((len(line) for line in logged.splitlines()), default=0) < 5000


# ---- last: shutdown -----------------------------------------------------------------------------
def test_requests_after_shutdown_are_invalid_and_exit_ends_the_process(server):
    assert "result" in answer(server, _send(server, {"jsonrpc": "2.0", "id": "shutdown", "method": "shutdown"}))
    error = error_of(server, {"jsonrpc": "2.0", "id": "after-shutdown", "method": "codespec/stats", "params": {}})
    assert error["code"] == -32600 and "shut down" in error["message"]
    server.send({"jsonrpc": "2.0", "method": "exit"})
    assert server.process.wait(WAIT_S) == 0


def _send(server, message: dict):
    server.send(message)
    return message["id"]


def test_the_module_server_answered_nothing_twice(server):
    assert all(len(replies) == 1 for replies in server.responses.values()), json.dumps(
        {str(k): v for k, v in server.responses.items() if len(v) > 1}
    )[:2000]
