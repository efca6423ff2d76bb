"""The websocket endpoint under bad input: every request gets exactly one final message (with its
id whenever it can be read), text no encoder accepts is an invalid_request, the connection stays
usable. Literal cases, then a hypothesis fuzz through bench/soak_ws.py's websocket generator."""

from __future__ import annotations

import asyncio
import json

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect

from bench.soak_values import answer_key
from bench.soak_ws import FINAL_TYPES, ws_message
from codespec.service.doors.auth import Listen
from codespec.service.engine.service import EngineService
from codespec.service.requests.options import CompletionOptions, ServerOptions, WsLimits
from codespec.websocket_api.server import bound_port, start_ws_server

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKEN = "fuzz-token"
WAIT_S = 60  # a hang guard only: every wait ends on a message
LIMITS = WsLimits(max_message_bytes=8192, max_in_flight=4)
OPTIONS = ServerOptions(completion=CompletionOptions(line_tokens=6, block_tokens=8, edit_tokens=8, deadline_ms=60_000))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def endpoint(server_target):
    service = EngineService(server_target, proposer="auto", max_draft=8)
    server = await start_ws_server(service, Listen(TOKEN), OPTIONS, LIMITS)
    yield f"ws://127.0.0.1:{bound_port(server)}/"
    server.close()
    await server.wait_closed()
    service.close()


def authorized(url: str):
    return connect(url, additional_headers={"Authorization": f"Bearer {TOKEN}"}, max_size=64 << 20)


async def final(ws, request_id) -> dict:
    while True:
        message = json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))
        if message.get("id") == request_id and message["type"] != "delta":
            return message


SURROGATE = '"x = \\ud800\\ny = "'  # JSON text: decodes to a lone surrogate
CASES = [  # raw message, code, id in the answer, text the message must contain
    (
        '{"type": "complete", "id": "s1", "prefix": ' + SURROGATE + "}",
        "invalid_request",
        "s1",
        "prefix is not valid Unicode",
    ),
    ('{"type": "complete", "id": "s2", "prefix": "x", "suffix": ' + SURROGATE + "}", "invalid_request", "s2", "suffix"),
    (
        '{"type": "complete", "id": "s3", "document": ' + SURROGATE + ', "position": {"line": 0, "character": 0}}',
        "invalid_request",
        "s3",
        "document",
    ),
    ('{"type": "complete", "id": "s4", "prefix": "x", "stop": ["\\udfff"]}', "invalid_request", "s4", "stop"),
    (
        '{"type": "edit", "id": "s5", "text": "x", "instruction": ' + SURROGATE + "}",
        "invalid_request",
        "s5",
        "instruction",
    ),
    (json.dumps({"type": "complete", "id": "big", "prefix": "x" * 9000}), "message_too_large", "big", "limit"),
    (json.dumps({"type": "complete", "prefix": "x" * 9000, "id": 77}), "message_too_large", 77, "limit"),
    ('{"type": "complete", "id": "cut", "prefix": "x', "invalid_json", "cut", "not valid JSON"),
    ('{"type": "complete", "id": "digits", "max_tokens": 1' + "0" * 5000 + "}", "invalid_json", "digits", "JSON"),
    ('{"type": "complete", "id": "deep", "x": ' + "[" * 3000 + "]" * 3000 + "}", "invalid_json", "deep", "nested"),
]


@pytest.mark.parametrize("raw, code, request_id, text", CASES, ids=[str(case[2]) for case in CASES])
async def test_bad_messages_are_answered_with_their_id(endpoint, raw, code, request_id, text):
    async with authorized(endpoint) as ws:
        await ws.send(raw)
        message = await final(ws, request_id)
        assert message["type"] == "error" and message["code"] == code, message
        assert text in message["message"], message
        await ws.send(
            json.dumps({"type": "complete", "id": "after", "prefix": "def f(x):\n    return ", "max_tokens": 3})
        )
        assert (await final(ws, "after"))["type"] == "done"  # the connection is still usable


async def test_an_oversized_binary_message_is_answered_with_its_id(endpoint):
    async with authorized(endpoint) as ws:
        await ws.send(json.dumps({"type": "complete", "id": "bin", "prefix": "é" * 9000}).encode())
        message = await final(ws, "bin")
        assert message["code"] == "message_too_large"


@settings(
    max_examples=25,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
@given(rng=st.randoms(use_true_random=False), size=st.integers(4, 12))
async def test_fuzzed_messages_each_get_one_final_answer(endpoint, rng, size):
    counter = [rng.randrange(10**9) * 100]  # ids unique across examples
    sends = [ws_message(rng, counter, LIMITS.max_message_bytes) for _ in range(size)]
    owed = {answer_key(send.must) for send in sends if send.must is not None} | {answer_key("sentinel")}
    finals: dict = {}
    async with authorized(endpoint) as ws:
        for send in sends:
            await ws.send(send.text)
        await ws.send(json.dumps({"type": "stats", "id": "sentinel"}))
        while not owed <= set(finals):
            message = json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))
            if message.get("type") in FINAL_TYPES and message.get("id") is not None:
                if message["type"] == "error" and message["code"] in ("unknown_id", "duplicate_id"):
                    continue  # a cancel for a request that ended, or an id a mutation reused
                finals.setdefault(answer_key(message["id"]), []).append(message)
    for send in sends:
        if send.must is not None:
            answers = finals[answer_key(send.must)]
            assert len(answers) == 1, (send.kind, answers)
            assert answers[0].get("code") != "internal", (send.kind, answers[0])
