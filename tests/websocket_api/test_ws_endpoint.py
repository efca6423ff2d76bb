"""The websocket endpoint with a real `websockets` client against the real server (in process)."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
import pytest_asyncio
import websockets
from websockets.asyncio.client import connect

from codespec.core.prompts import PromptRenderer
from codespec.service.doors.auth import Listen
from codespec.service.engine.service import EngineService
from codespec.service.requests.inline import completion_context, completion_prompt
from codespec.service.requests.options import CompletionOptions, ServerOptions, WsLimits
from codespec.websocket_api.server import bound_port, start_ws_server

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKEN = "test-token-123"
WAIT_S = 120  # a hang guard only: every wait ends on a message
OPTIONS = ServerOptions(
    completion=CompletionOptions(line_tokens=10, block_tokens=16, edit_tokens=24, deadline_ms=600_000)
)
LIMITS = WsLimits(max_message_bytes=8192, max_in_flight=4, allowed_origins=("https://trusted.example",))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def endpoint(server_target):
    service = EngineService(server_target, proposer="auto", max_draft=8)
    server = await start_ws_server(service, Listen(TOKEN), OPTIONS, LIMITS)
    yield f"ws://127.0.0.1:{bound_port(server)}/"
    server.close()
    await server.wait_closed()
    service.close()


def authorized(url: str, **kwargs):
    return connect(url, additional_headers={"Authorization": f"Bearer {TOKEN}"}, **kwargs)


async def receive(ws) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))


async def until_final(ws, request_id) -> tuple[list[str], dict]:
    """Deltas of ``request_id`` and its final message (done, cancelled or error)."""
    deltas = []
    while True:
        message = await receive(ws)
        if message.get("id") != request_id:
            continue
        if message["type"] == "delta":
            deltas.append(message["text"])
        else:
            return deltas, message


async def test_complete_streams_what_the_engine_returns(endpoint, server_target):
    from codespec.core.config import GenerationLimits
    from codespec.core.decode import generate_all

    prefix, suffix = "def scale(values, factor):\n    return [value * ", "\n"
    async with authorized(endpoint) as ws:
        await ws.send(json.dumps({"type": "complete", "id": "c1", "prefix": prefix, "suffix": suffix}))
        deltas, done = await until_final(ws, "c1")
    assert done["type"] == "done", done
    assert "".join(deltas) == done["text"]
    from codespec.service.engine.service import COMPLETION_STOP_REPEATS
    from codespec.service.requests.inline import target_windows

    windows = target_windows(
        server_target, OPTIONS.completion.prefix_chars, OPTIONS.completion.suffix_chars, OPTIONS.completion.block_tokens
    )
    context = completion_context(
        prefix + suffix,
        len(prefix),
        OPTIONS.completion.line_tokens,
        OPTIONS.completion.block_tokens,
        *windows,
        invoked=True,
    )
    plain = generate_all(
        server_target,
        server_target.encode(
            completion_prompt(context, PromptRenderer(server_target.tokenizer, server_target.prompt_format))
        ),
        None,
        limits=GenerationLimits(context.max_tokens, context.stop, stop_repeats=COMPLETION_STOP_REPEATS),
    )
    assert done["text"] == plain.text  # lossless: speculative output == plain greedy output
    assert done["usage"]["completion_tokens"] == len(plain.token_ids)
    assert set(done["usage"]) >= {"accepted_prediction_tokens", "rejected_prediction_tokens", "prompt_tokens"}


async def test_edit_streams_and_reports_prediction_usage(endpoint):
    original = "def area(width, height):\n    return width * height\n"
    async with authorized(endpoint) as ws:
        await ws.send(json.dumps({"type": "edit", "id": 7, "text": original, "instruction": "rename width to w"}))
        deltas, done = await until_final(ws, 7)
    assert done["type"] == "done", done
    assert "".join(deltas) == done["text"]
    usage = done["usage"]
    assert usage["completion_tokens"] > 0
    assert usage["accepted_prediction_tokens"] >= 0 and usage["rejected_prediction_tokens"] >= 0


async def test_prediction_tokens_are_counted_as_the_http_door_counts_them(endpoint, server_target):
    """OpenAI's definition (docs/http.md, "Usage"): the prediction's tokens found in the output, in
    order. An ``auto`` edit whose output repeats its prediction accepts them, whatever drafted the
    steps (the engine's own count of reference-drafted tokens is in ``speculation``)."""
    original = "def area(width, height):\n    return width * height\n"
    request = {"type": "edit", "text": original, "instruction": "rename width to w", "proposer": "auto"}
    async with authorized(endpoint) as ws:
        await ws.send(json.dumps({**request, "id": "plain"}))
        _, first = await until_final(ws, "plain")
        assert first["usage"]["accepted_prediction_tokens"] == first["usage"]["rejected_prediction_tokens"] == 0
        answer = first["text"]
        await ws.send(json.dumps({**request, "id": "same", "prediction": answer}))
        _, same = await until_final(ws, "same")
    assert same["type"] == "done"
    # The budget is the reference's length plus edit_tokens, so this random model writes past the
    # first answer (lossless: the first answer is its start).
    assert same["text"].startswith(answer)
    predicted = len(server_target.tokenizer.encode(answer, add_special_tokens=False))
    accepted, rejected = same["usage"]["accepted_prediction_tokens"], same["usage"]["rejected_prediction_tokens"]
    assert accepted + rejected == predicted
    assert accepted >= predicted - 1  # all of it (the last token may merge with what follows)
    assert set(same["speculation"]) >= {"drafted_tokens", "accepted_prediction_tokens", "target_forwards"}


async def test_an_edit_with_the_users_recent_edits_drafts_them_and_refuses_bad_ones(endpoint):
    original = "def area(width, height):\n    return width * height\n"
    edits = [{"before": "    w = width\n", "after": "    w = size\n"}]
    async with authorized(endpoint) as ws:
        body = {"type": "edit", "id": 8, "text": original, "edits": edits, "proposer": "next-edit", "max_tokens": 8}
        await ws.send(json.dumps(body))
        _, done = await until_final(ws, 8)
        assert done["type"] == "done", done
        assert done["proposer"] == "next-edit"  # built from the edits: no fallback to the plain pointer
        await ws.send(json.dumps({**body, "id": 9, "edits": [{"before": 1}]}))
        _, error = await until_final(ws, 9)
    assert error["type"] == "error" and error["code"] == "invalid_request" and "each edit" in error["message"]


async def test_cancel_ends_a_running_request(endpoint):
    original = "".join(f"def function_{i}(value):\n    return value + {i}\n\n" for i in range(12))
    async with authorized(endpoint) as ws:
        await ws.send(json.dumps({"type": "edit", "id": "long", "text": original, "max_tokens": 2000}))
        first = await receive(ws)
        assert first["type"] == "delta" and first["id"] == "long"  # running
        await ws.send(json.dumps({"type": "cancel", "id": "long"}))
        deltas, final = await until_final(ws, "long")
        assert final["type"] == "cancelled"
        assert final["usage"]["completion_tokens"] < 2000
        await ws.send(json.dumps({"type": "stats", "id": "s"}))
        stats = await until_final(ws, "s")
        assert stats[1]["stats"]["finish_reasons"]["cancelled"] >= 1


async def test_a_cancel_right_behind_its_request_is_not_lost(endpoint):
    original = "".join(f"def function_{i}(value):\n    return value + {i}\n\n" for i in range(12))
    async with authorized(endpoint) as ws:
        for n in range(3):  # the cancel may arrive before the request's job exists: it must still count
            await ws.send(json.dumps({"type": "edit", "id": f"quick-{n}", "text": original, "max_tokens": 2000}))
            await ws.send(json.dumps({"type": "cancel", "id": f"quick-{n}"}))
            _, final = await until_final(ws, f"quick-{n}")
            assert final["type"] == "cancelled"


async def test_stats(endpoint):
    async with authorized(endpoint) as ws:
        await ws.send(json.dumps({"type": "stats", "id": "s1"}))
        message = await receive(ws)
    assert message["type"] == "stats" and message["id"] == "s1"
    stats = message["stats"]
    assert stats["requests"].get("complete", 0) >= 1 or stats["requests"].get("edit", 0) >= 1
    assert "tokens_per_forward" in stats["engine"]


@pytest.mark.parametrize(
    "headers, query, status",
    [
        ({}, "", 401),  # no token
        ({"Authorization": "Bearer wrong"}, "", 401),
        ({}, "?token=wrong", 401),
        ({"Authorization": f"Bearer {TOKEN}", "Origin": "https://evil.example"}, "", 403),
        ({"Origin": "https://evil.example"}, f"?token={TOKEN}", 403),
    ],
)
async def test_refused_handshakes(endpoint, headers, query, status):
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with connect(endpoint + query, additional_headers=headers):
            pass
    assert refused.value.response.status_code == status


@pytest.mark.parametrize(
    "headers, query",
    [
        ({"Authorization": f"Bearer {TOKEN}"}, ""),
        ({}, f"?token={TOKEN}"),
        ({"Origin": "https://trusted.example"}, f"?token={TOKEN}"),
    ],
)
async def test_accepted_handshakes(endpoint, headers, query):
    async with connect(endpoint + query, additional_headers=headers) as ws:
        await ws.send(json.dumps({"type": "stats", "id": 1}))
        assert (await receive(ws))["type"] == "stats"


BAD_MESSAGES = [
    ("x" * 9000, "message_too_large"),
    ("{not json", "invalid_json"),
    ("[" * 4000, "invalid_json"),  # nested deeper than the JSON decoder recurses
    ("[1, 2]", "invalid_request"),
    (json.dumps({"type": "teleport", "id": 1}), "unknown_type"),
    (json.dumps({"type": "complete", "prefix": "x"}), "invalid_request"),  # no id
    (json.dumps({"type": "complete", "id": 2, "prefix": 3}), "invalid_request"),
    (json.dumps({"type": "complete", "id": 3, "prefix": "x", "max_tokens": 0}), "invalid_request"),
    (
        json.dumps({"type": "complete", "id": 4, "document": "a\nb", "position": {"line": 5, "character": 0}}),
        "invalid_position",
    ),
    (
        json.dumps({"type": "complete", "id": 5, "document": "a\nb", "position": {"line": 0, "character": 9}}),
        "invalid_position",
    ),
    (
        json.dumps({"type": "complete", "id": 6, "document": "x = '😀'", "position": {"line": 0, "character": 6}}),
        "invalid_position",
    ),  # between the two UTF-16 units of the emoji
    (
        json.dumps(
            {
                "type": "edit",
                "id": 8,
                "document": "ab",
                "range": {"start": {"line": 0, "character": 2}, "end": {"line": 0, "character": 1}},
            }
        ),
        "invalid_position",
    ),
    (json.dumps({"type": "cancel", "id": "nothing-running"}), "unknown_id"),
]


async def test_bad_messages_get_errors_and_the_connection_stays_usable(endpoint):
    async with authorized(endpoint) as ws:
        for raw, code in BAD_MESSAGES:
            await ws.send(raw)
            message = await receive(ws)
            assert message["type"] == "error" and message["code"] == code, (raw[:60], message)
            assert message["message"]
        # a valid position next to the emoji still works on the same connection
        await ws.send(
            json.dumps(
                {"type": "complete", "id": "ok", "document": "x = '😀'\n", "position": {"line": 0, "character": 7}}
            )
        )
        _, final = await until_final(ws, "ok")
        assert final["type"] == "done"


async def test_per_connection_limit(endpoint):
    async with authorized(endpoint) as ws:
        original = "value = 1\n" * 40
        for i in range(LIMITS.max_in_flight + 1):
            await ws.send(json.dumps({"type": "edit", "id": i, "text": original, "max_tokens": 500}))
        refused = None
        finals = {}
        while len(finals) < LIMITS.max_in_flight or refused is None:
            message = await receive(ws)
            if message["type"] == "error" and message["code"] == "too_many_requests":
                refused = message
                for i in range(LIMITS.max_in_flight):
                    await ws.send(json.dumps({"type": "cancel", "id": i}))
            elif message["type"] in ("done", "cancelled", "error"):
                finals[message["id"]] = message["type"]
        assert refused["id"] == LIMITS.max_in_flight
        assert set(finals) == set(range(LIMITS.max_in_flight))


async def test_eight_clients_with_random_cancellations(endpoint):
    rng = random.Random(5)
    plans = [
        [(f"c{client}-{n}", rng.choice(["complete", "edit"]), rng.random() < 0.4) for n in range(3)]
        for client in range(8)
    ]

    async def run_client(plan) -> dict:
        outcomes = {}
        async with authorized(endpoint) as ws:
            for request_id, kind, cancel in plan:
                if kind == "complete":
                    body = {"prefix": f"def {request_id.replace('-', '_')}(x):\n    return x", "suffix": "\n"}
                else:
                    body = {"text": "for item in items:\n    print(item)\n", "max_tokens": 12}
                await ws.send(json.dumps({"type": kind, "id": request_id, **body}))
                if cancel:
                    await ws.send(json.dumps({"type": "cancel", "id": request_id}))
            while len(outcomes) < len(plan):
                message = await receive(ws)
                if message["type"] in ("done", "cancelled", "error") and message.get("id") is not None:
                    # a cancel that arrives after its request ended is answered with unknown_id
                    if message["type"] == "error" and message["code"] == "unknown_id":
                        continue
                    outcomes[message["id"]] = message["type"]
        return outcomes

    results = await asyncio.wait_for(asyncio.gather(*(run_client(plan) for plan in plans)), WAIT_S)
    for plan, outcomes in zip(plans, results):
        assert set(outcomes) == {request_id for request_id, _, _ in plan}
        assert set(outcomes.values()) <= {"done", "cancelled"}
        for request_id, _, cancel in plan:
            if not cancel:
                assert outcomes[request_id] == "done"
