"""Hostile input at the websocket door (the shipped model, a real websockets server): 300 seeded
mutations of valid messages (``bench.hostile_cases``: lone surrogates, 5,000-digit and non-finite
numbers, wrong types, deep nesting, truncation, bytes that are not UTF-8) each get one final
answer, none of them ``internal``, none late; the connection and the server keep serving."""

from __future__ import annotations

import json

import pytest

from bench.hostile_cases import WS_BASES, WS_KEEP, message_cases
from bench.hostile_input import run_ws
from codespec.service.doors.auth import Listen
from codespec.service.engine.runtime import LoopThread
from codespec.service.engine.service import EngineService
from codespec.service.requests.options import CompletionOptions, ServerOptions, WsLimits
from codespec.websocket_api.server import bound_port, start_ws_server

TOKEN = "hostile-token"
FUZZ_SEED = 4812
FUZZ_CASES = 300
ANSWER_S = 60  # a hang guard: each answer normally comes within a second
OPTIONS = ServerOptions(completion=CompletionOptions(deadline_ms=60_000))
LIMITS = WsLimits(max_message_bytes=256 * 1024, max_in_flight=4)


@pytest.fixture(scope="module")
def shipped_ws():
    import torch

    from codespec.core.default_model import target_path
    from codespec.core.model import TargetModel

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    service = EngineService(TargetModel.load(str(target_path()), device="cpu"), proposer="auto", max_draft=32)
    loop = LoopThread("test-ws-hostile")
    server = loop.run(start_ws_server(service, Listen(TOKEN), OPTIONS, LIMITS), ANSWER_S)
    yield f"ws://127.0.0.1:{bound_port(server)}/"
    server.close()
    loop.run(server.wait_closed(), ANSWER_S)
    loop.stop()
    service.close()
    torch.set_num_threads(threads)


def test_seeded_mutations_each_get_one_answer_and_none_is_internal(shipped_ws):
    cases = message_cases(FUZZ_SEED, FUZZ_CASES, WS_BASES, "ws", WS_KEEP)
    tally = run_ws(shipped_ws, TOKEN, cases, ANSWER_S)
    assert tally.sent == FUZZ_CASES and tally.answered == FUZZ_CASES, tally.as_dict()
    assert not tally.server_errors and not tally.hangs and not tally.failures, tally.as_dict()
    for code in ("invalid_json", "invalid_request", "done"):  # it refused, and it served
        assert tally.statuses[code] > 0, tally.as_dict()


@pytest.mark.parametrize(
    ("raw", "code", "says"),
    [
        ('{"type": "complete", "id": "u", "prefix": "x", "path": "\\udfff"}', "invalid_request", "path"),
        ('{"type": "complete", "id": "u", "prefix": "x", "note": ["ok", "\\ud800"]}', "invalid_request", "note[1]"),
        ('{"type": "complete", "id": "u", "prefix": "x", "max_tokens": NaN}', "invalid_json", "NaN"),
        ('{"type": "complete", "id": "u", "prefix": "x", "temperature": 1e999}', "invalid_json", "64-bit float"),
        ('{"type": "complete", "id": "u", "prefix": "x", "seed": 18446744073709551616}', "invalid_request", "seed"),
    ],
)
def test_literal_cases_name_what_is_wrong(shipped_ws, raw, code, says):
    from websockets.sync.client import connect

    with connect(shipped_ws, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        ws.send(raw)
        answer = json.loads(ws.recv(timeout=ANSWER_S))
        assert answer["type"] == "error" and answer["id"] == "u" and answer["code"] == code, answer
        assert says in answer["message"], answer
        ws.send(json.dumps({"type": "complete", "id": "after", "prefix": "def f(x):\n    return ", "max_tokens": 2}))
        while (answer := json.loads(ws.recv(timeout=ANSWER_S)))["type"] == "delta":
            pass
        assert answer["type"] == "done" and answer["id"] == "after", answer


UPGRADE = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"


@pytest.mark.parametrize(
    ("head", "status", "code"),
    [
        ("GET / HTTP/1.1\r\nHost: x\r\n" + UPGRADE + "Sec-WebSocket-Version: 13\r\n", 401, "unauthorized"),
        (
            f"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nOrigin: https://evil.example\r\n"
            + UPGRADE
            + "Sec-WebSocket-Version: 13\r\n",
            403,
            "origin_not_allowed",
        ),
        (f"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n", 426, "invalid_handshake"),  # no upgrade
        (
            f"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            + UPGRADE
            + "Sec-WebSocket-Version: 99\r\n",
            400,
            "invalid_handshake",
        ),
    ],
)
def test_a_refused_handshake_is_a_json_error(shipped_ws, head, status, code):
    from bench.hostile_cases import HttpCase
    from bench.hostile_input import exchange

    port = int(shipped_ws.rsplit(":", 1)[1].strip("/"))
    answer = exchange("127.0.0.1", port, HttpCase("handshake", (head + "\r\n").encode()), ANSWER_S)
    assert answer.status == status and answer.headers["content-type"] == "application/json", answer
    body = json.loads(answer.body)
    assert body["type"] == "error" and body["code"] == code and body["message"], body
