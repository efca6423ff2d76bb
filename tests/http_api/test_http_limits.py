"""What the HTTP door holds, bounded before it decodes anything: a body past the bodies' budget is a
429 before it is read, and a prompt that surely cannot fit the context is a 400 at once, before it
counts as running (so never a 429, never a wait for the batch). Orderings by events and held
connections, never by timing (tests/http_api/hosted.py's real server)."""

from __future__ import annotations

import json
import socket

from hosted import LONG_CHAT, TOKEN, WAIT_S, Hosted, assert_error, httpx2, post, wait_for

from codespec.http_api.bodies import BODIES_IN_FLIGHT
from codespec.service.engine.preparing import TokenBound
from codespec.service.requests.options import HttpLimits


def held_body(port: int, size: int) -> socket.socket:
    """A connection that declares a ``size``-byte body and sends none of it (yet)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    sock.sendall(
        (
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {size}\r\n\r\n"
        ).encode()
    )
    return sock


def test_bodies_past_the_budget_are_429_before_they_are_read(tiny):
    limit = 2048
    hosted = Hosted(tiny.service, HttpLimits(max_body_bytes=limit))
    body = json.dumps({"model": "not-served", "prompt": "x"}).encode()
    body += b" " * (limit - len(body))  # a whole body's room; answered 404 whenever it is read

    def status() -> int:
        return post(hosted, "/v1/completions", content=body, headers={"content-type": "application/json"}).status_code

    held = [held_body(hosted.server.port, limit) for _ in range(BODIES_IN_FLIGHT)]
    try:
        refused = wait_for(lambda: status() == 429, "the held bodies to fill the budget")
        assert refused
        answer = post(hosted, "/v1/completions", content=body, headers={"content-type": "application/json"})
        error = assert_error(answer, 429, "rate_limit_exceeded")
        assert "request bodies" in error["message"] and answer.headers["retry-after"] == "1"
    finally:
        for sock in held:
            sock.close()
    wait_for(lambda: status() == 404, "the budget to come back when the held clients leave")
    hosted.close()


def test_a_prompt_surely_over_the_context_is_400_even_when_the_door_is_full(tiny):
    full = Hosted(tiny.service, HttpLimits(max_requests=1))
    target = tiny.service.target
    bound = TokenBound.of(target.tokenizer)
    assert bound is not None
    over = "x = 1\n" * (bound.chars_per_token * target.max_context // 6 + 1)
    try:
        chat = {"model": "codespec", "messages": LONG_CHAT, "max_tokens": 2000, "stream": True}
        with httpx2.Client(timeout=WAIT_S) as client:
            with client.stream(
                "POST", full.url + "/v1/chat/completions", json=chat, headers={"Authorization": f"Bearer {TOKEN}"}
            ) as running:
                lines = running.iter_lines()
                next(lines)  # the one place is taken
                assert_error(post(full, "/v1/completions", {"prompt": "x"}), 429, "rate_limit_exceeded")
                answer = post(full, "/v1/completions", {"prompt": over})
                error = assert_error(answer, 400, "context_length_exceeded", "prompt")
                assert f"context is {target.max_context}" in error["message"]
                messages = [{"role": "user", "content": f"```\n{over}```"}]
                answer = post(full, "/v1/chat/completions", {"messages": messages})
                assert_error(answer, 400, "context_length_exceeded", "messages")
                answer = post(
                    full, "/v1/completions", {"prompt": "x", "prediction": {"type": "content", "content": over}}
                )
                assert_error(answer, 400, "context_length_exceeded", "prediction")
                # the llama.cpp server and Ollama routes refuse it the same way, in their own shapes
                # (an /infill's prefix is windowed around the cursor, as an editor's completion is)
                answer = post(full, "/completion", {"prompt": over, "n_predict": 4})
                assert_error(answer, 400, "context_length_exceeded", "prompt")
                answer = post(full, "/api/generate", {"model": "codespec", "prompt": over, "stream": False})
                assert answer.status_code == 400 and "context is" in answer.json()["error"]
    finally:
        full.close()
