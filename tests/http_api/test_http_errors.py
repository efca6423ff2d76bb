"""The HTTP door refuses what it must, in OpenAI's error shape, and stays up: bad requests, unknown
models and routes, oversized bodies, tokens and origins, a full queue, and sixteen clients at once
that leave at random (tests/http_api/hosted.py's real server, the official `openai` client)."""

from __future__ import annotations

import asyncio
import json
import random

import openai
import pytest
from hosted import (
    CODE,
    LIMITS,
    LONG_CHAT,
    TOKEN,
    WAIT_S,
    Hosted,
    assert_error,
    httpx2,
    post,
    wait_for,
)

from codespec.service.engine.service import EngineService
from codespec.service.requests.options import HttpLimits


# ---- errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path, body, code, param",
    [
        ("/v1/completions", {"prompt": 3}, "invalid_type", "prompt"),
        ("/v1/completions", {"max_tokens": 4}, "missing_required_parameter", "prompt"),
        ("/v1/completions", {"prompt": "x", "temperature": "hot"}, "invalid_type", "temperature"),
        ("/v1/completions", {"prompt": "x", "temperature": 2.5}, "invalid_value", "temperature"),
        ("/v1/completions", {"prompt": "x", "top_p": 0}, "invalid_value", "top_p"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "invalid_value", "max_tokens"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 2.5}, "invalid_type", "max_tokens"),
        ("/v1/completions", {"prompt": "x", "stop": [""]}, "invalid_value", "stop"),
        ("/v1/completions", {"prompt": "x", "stop": 7}, "invalid_type", "stop"),
        ("/v1/completions", {"prompt": "x", "n": 2}, "unsupported_parameter", "n"),
        ("/v1/completions", {"prompt": "x", "echo": True}, "unsupported_parameter", "echo"),
        ("/v1/completions", {"prompt": "x", "stream": "yes"}, "invalid_type", "stream"),
        ("/v1/completions", {"prompt": ["a", "b"]}, "unsupported_parameter", "prompt"),
        ("/v1/completions", {"prompt": "x", "proposer": "magic"}, "invalid_value", "proposer"),
        ("/v1/chat/completions", {"messages": []}, "invalid_type", "messages"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "robot", "content": "x"}]},
            "invalid_value",
            "messages[0].role",
        ),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "invalid_type", "messages[0].content"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "no code here"}]},
            "invalid_value",
            "messages",
        ),
        ("/v1/chat/completions", {"messages": LONG_CHAT, "prediction": "text"}, "invalid_type", "prediction"),
        ("/v1/completions", {"prompt": "x", "edits": [{"before": "a"}]}, "invalid_type", "edits"),
        ("/v1/completions", {"prompt": "x", "edits": [{"before": "a", "after": "b"}] * 9}, "invalid_value", "edits"),
        ("/v1/chat/completions", {"messages": LONG_CHAT, "n": 3}, "unsupported_parameter", "n"),
        (
            "/v1/chat/completions",
            {"messages": LONG_CHAT, "tools": [{"type": "function"}]},
            "unsupported_parameter",
            "tools",
        ),
    ],
)
def test_bad_requests_are_400_in_openai_shape(tiny, path, body, code, param):
    assert_error(post(tiny, path, body), 400, code, param)


def test_bad_json_and_non_objects_are_400(tiny):
    assert_error(
        post(tiny, "/v1/completions", content=b"{bad", headers={"Content-Type": "application/json"}),
        400,
        "invalid_json",
    )
    assert_error(post(tiny, "/v1/chat/completions", [1, 2]), 400, "invalid_json")


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_longer_than_the_context_is_400(tiny, stream):
    prompt = " ".join(f"word{i}" for i in range(3000))
    assert len(tiny.service.target.encode(prompt)) > tiny.service.target.max_context
    error = assert_error(
        post(tiny, "/v1/completions", {"prompt": prompt, "stream": stream}), 400, "context_length_exceeded"
    )
    assert "context" in error["message"] and error["param"] == "prompt"  # the endpoint's own field
    with pytest.raises(openai.BadRequestError) as raised:  # the official client sees a plain 400 too
        tiny.client().chat.completions.create(
            model="codespec", messages=[{"role": "user", "content": f"```\n{prompt}\n```"}], stream=stream
        )
    assert raised.value.status_code == 400 and raised.value.code == "context_length_exceeded"
    assert raised.value.param == "messages"
    with pytest.raises(openai.BadRequestError) as raised:
        tiny.client().completions.create(model="codespec", prompt=prompt, stream=stream)
    assert raised.value.code == "context_length_exceeded" and raised.value.param == "prompt"


def test_an_unknown_model_is_openais_404_naming_what_is_served(tiny):
    client = tiny.client()
    served = [model.id for model in client.models.list().data]
    assert "codespec" in served and tiny.service.target.name in served
    for call in (
        lambda: client.completions.create(model="gpt-4o", prompt="x", max_tokens=1),
        lambda: client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}]),
    ):
        with pytest.raises(openai.NotFoundError) as raised:
            call()
        assert raised.value.code == "model_not_found" and raised.value.param == "model"
        assert "'codespec'" in raised.value.message and "--http-any-model" in raised.value.message
    for name in served:  # every listed name is served
        assert client.completions.create(model=name, prompt="x", max_tokens=1).choices


def test_any_model_serves_every_name_with_the_loaded_target(server_target, one_thread):
    service = EngineService(server_target, proposer="none")
    hosted = Hosted(service, HttpLimits(any_model=True))
    try:
        response = hosted.client().completions.create(model="gpt-4o", prompt="def f():", max_tokens=2)
        assert response.model == tiny_name(service) and response.choices[0].text is not None
    finally:
        hosted.close()
        service.close()


def tiny_name(service) -> str:
    return str(service.target.name)


def test_speculation_counts_every_drafted_token_whatever_proposed_it(tiny):
    body = {"prompt": CODE + "\n\n" + CODE[:60], "max_tokens": 40, "proposer": "context"}
    extra = post(tiny, "/v1/completions", body).json()["codespec"]
    speculation, stats = extra["speculation"], extra["stats"]
    assert speculation["drafted_tokens"] == stats["drafted_tokens"] > 0  # context lookup's drafts count
    assert speculation["accepted_tokens"] == stats["accepted_tokens"] <= speculation["drafted_tokens"]
    assert speculation["target_forwards"] == stats["target_forwards"] > 0
    assert speculation["accepted_prediction_tokens"] == 0  # no prediction was sent


def test_every_body_has_one_json_spelling(tiny):
    ok = post(tiny, "/v1/completions", {"prompt": "x", "max_tokens": 1})
    bad = post(tiny, "/v1/completions", {"prompt": "x", "temperature": 3})
    missing = post(tiny, "/v1/nowhere", {})
    for response in (
        ok,
        bad,
        missing,
        httpx2.get(tiny.url + "/v1/models", headers={"Authorization": f"Bearer {TOKEN}"}),
    ):
        assert json.dumps(response.json(), ensure_ascii=False, separators=(",", ":")) == response.text


def test_the_openai_client_raises_its_typed_errors(tiny):
    client = tiny.client()
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model="codespec", prompt="x", temperature=3)
    assert raised.value.param == "temperature" and raised.value.code == "invalid_value"
    with pytest.raises(openai.BadRequestError) as raised:  # the chat endpoint names its own fields
        client.chat.completions.create(model="codespec", messages=[{"role": "user", "content": "x"}], top_p=5)
    assert raised.value.param == "top_p" and raised.value.code == "invalid_value"
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model="codespec", messages=[{"role": "user", "content": "x"}], max_completion_tokens=0
        )
    assert raised.value.param == "max_completion_tokens"
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="codespec", messages=[{"role": "wizard", "content": "x"}])
    assert raised.value.param == "messages[0].role"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=tiny.url + "/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.PermissionDeniedError):
        tiny.client(default_headers={"Origin": "https://evil.example"}).models.list()


def test_unknown_routes_and_methods(tiny):
    assert_error(post(tiny, "/v1/embeddings", {"input": "x"}), 404, "not_found")
    assert_error(httpx2.get(tiny.url + "/", headers={"Authorization": f"Bearer {TOKEN}"}), 404, "not_found")
    response = httpx2.delete(tiny.url + "/v1/models", headers={"Authorization": f"Bearer {TOKEN}"})
    assert_error(response, 405, "method_not_allowed")
    assert "GET" in response.headers["allow"]
    assert_error(httpx2.get(tiny.url + "/v1/completions", headers={"Authorization": f"Bearer {TOKEN}"}), 405)


def test_a_body_over_the_limit_is_413(tiny):
    big = {"prompt": "x" * (LIMITS.max_body_bytes + 10)}
    assert_error(post(tiny, "/v1/completions", big), 413, "request_too_large")

    def chunked():  # no Content-Length: counted while it is read
        for _ in range(20):
            yield b" " * 4096

    assert_error(post(tiny, "/v1/completions", content=chunked()), 413, "request_too_large")


@pytest.mark.parametrize(
    "headers, status",
    [
        ({}, 401),
        ({"Authorization": "Bearer wrong"}, 401),
        ({"Authorization": "Basic " + TOKEN}, 401),
        ({"Authorization": f"Bearer {TOKEN}", "Origin": "https://evil.example"}, 403),
        ({"Origin": "https://evil.example"}, 403),
    ],
)
def test_token_and_origin_refusals(tiny, headers, status):
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions")):
        response = httpx2.request(method, tiny.url + path, headers=headers, json={"prompt": "x"}, timeout=WAIT_S)
        assert_error(response, status, "invalid_api_key" if status == 401 else "origin_not_allowed")
    query = httpx2.get(tiny.url + f"/v1/models?token={TOKEN}", headers=headers)  # no token in URLs over HTTP
    assert query.status_code == status


def test_an_allowed_origin_gets_cors_headers(tiny):
    origin = {"Origin": "https://trusted.example"}
    preflight = httpx2.options(
        tiny.url + "/v1/chat/completions",
        headers={**origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"},
    )
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == "https://trusted.example"
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    response = httpx2.get(tiny.url + "/v1/models", headers={**origin, "Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200 and response.headers["access-control-allow-origin"] == "https://trusted.example"
    assert httpx2.get(tiny.url + "/v1/models", headers=origin).status_code == 401  # still needs the token


def test_a_full_queue_is_429(tiny):
    small = Hosted(tiny.service, HttpLimits(max_requests=1))
    try:
        body = {"model": "codespec", "messages": LONG_CHAT, "max_tokens": 2000, "stream": True}
        with httpx2.Client(timeout=WAIT_S) as client:
            with client.stream(
                "POST", small.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
            ) as response:
                lines = response.iter_lines()  # kept: a dropped line iterator closes the response
                next(lines)  # running
                refused = post(small, "/v1/completions", {"prompt": "x"})
                assert_error(refused, 429, "rate_limit_exceeded")
                assert refused.headers["retry-after"] == "1"
                with pytest.raises(openai.RateLimitError):
                    small.client().completions.create(model="codespec", prompt="x")
        wait_for(lambda: small.server.door.running == 0, "the slot to be released")
        assert (
            small.client().completions.create(model="codespec", prompt="x", max_tokens=2).usage.completion_tokens >= 1
        )
    finally:
        small.close()


# ---- many clients at once ------------------------------------------------------------------------
def test_sixteen_concurrent_clients_with_random_disconnects(tiny):
    rng = random.Random(16)
    plans = [(rng.choice(["completion", "chat"]), rng.choice([True, False]), rng.random() < 0.4) for _ in range(16)]
    assert any(p[2] for p in plans) and not all(p[2] for p in plans)

    async def one(kind: str, stream: bool, leave: bool, number: int) -> str:
        client = openai.AsyncOpenAI(base_url=tiny.url + "/v1", api_key=TOKEN, max_retries=0, timeout=WAIT_S)
        try:
            if kind == "completion":
                kwargs = dict(
                    model="codespec", prompt=f"def f{number}(x):\n    return ", max_tokens=rng.choice([8, 64, 400])
                )
                create = client.completions.create
            else:
                messages = LONG_CHAT if leave else [{"role": "user", "content": f"```\nx{number} = {number}\n```"}]
                kwargs = dict(model="codespec", messages=messages, max_tokens=rng.choice([16, 200, 1500]))
                create = client.chat.completions.create
            if leave and not stream:
                async with httpx2.AsyncClient() as raw:
                    path = "/v1/completions" if kind == "completion" else "/v1/chat/completions"
                    try:
                        await raw.post(
                            tiny.url + path,
                            json={**kwargs, "max_tokens": 2000},
                            headers={"Authorization": f"Bearer {TOKEN}"},
                            timeout=0.05,
                        )
                    except httpx2.TimeoutException:
                        return "left"
                    return "finished before leaving"
            if stream:
                chunks = await create(**kwargs, stream=True)
                async for _ in chunks:
                    if leave:
                        await chunks.close()
                        return "left"
                return "streamed"
            await create(**kwargs)
            return "answered"
        finally:
            await client.close()

    async def everyone():
        return await asyncio.wait_for(asyncio.gather(*(one(*plan, n) for n, plan in enumerate(plans))), WAIT_S)

    outcomes = asyncio.run(everyone())
    assert len(outcomes) == 16 and set(outcomes) <= {"left", "streamed", "answered", "finished before leaving"}
    wait_for(lambda: tiny.server.door.running == 0, "every request slot to be released")
    wait_for(lambda: tiny.service.snapshot()["active_requests"] == 0, "the engine to be idle")
    client = tiny.client()
    assert client.models.list().data
    assert client.completions.create(model="codespec", prompt="y = ", max_tokens=3).usage.completion_tokens >= 1
