"""What the HTTP door's tests share: a real server (uvicorn on a free loopback port, in this process,
on its own event loop thread) for the official `openai` client, raw requests, and checks of the
OpenAI error shape. The fixtures that start one are in conftest.py."""

from __future__ import annotations

import time

import openai

try:  # the HTTP client the openai package depends on (httpx2 in recent releases, httpx before)
    import httpx2
except ImportError:  # pragma: no cover
    import httpx as httpx2

from codespec.core.config import GenerationLimits
from codespec.core.decode import generate_all
from codespec.http_api.server import start_http_server
from codespec.service.doors.auth import Listen
from codespec.service.engine.runtime import LoopThread
from codespec.service.engine.service import EngineService
from codespec.service.requests.options import CompletionOptions, HttpLimits, ServerOptions

TOKEN = "http-test-token"
WAIT_S = 120  # hang guard only: every wait below ends on an event
OPTIONS = ServerOptions(completion=CompletionOptions(deadline_ms=600_000))
LIMITS = HttpLimits(max_body_bytes=64 * 1024, max_requests=24, allowed_origins=("https://trusted.example",))
LONG_CHAT = [{"role": "user", "content": "```\nimport os\n```"}]  # the tiny model writes ~2000 tokens for it
CODE = '''def scale(values, factor):
    """Multiply every value by factor."""
    result = []
    for value in values:
        result.append(value * factor)
    return result


def total(values):
    return sum(values)
'''


class Hosted:
    """A server on its own loop thread, so the synchronous openai client can call it."""

    def __init__(self, service: EngineService, limits: HttpLimits = LIMITS, draft: str | None = None) -> None:
        self.service = service
        self.loop = LoopThread("test-http")
        self.server = self.loop.run(start_http_server(service, Listen(TOKEN), OPTIONS, limits, draft), WAIT_S)
        self.url = f"http://127.0.0.1:{self.server.port}"

    def client(self, **kwargs) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=TOKEN, max_retries=0, timeout=WAIT_S, **kwargs)

    def close(self) -> None:
        self.loop.run(self.server.stop(), WAIT_S)
        self.loop.stop()


def post(hosted: Hosted, path: str, body=None, headers=None, **kwargs) -> httpx2.Response:
    headers = {"Authorization": f"Bearer {TOKEN}", **(headers or {})}
    return httpx2.post(hosted.url + path, json=body, headers=headers, timeout=WAIT_S, **kwargs)


def assert_error(response: httpx2.Response, status: int, code: str | None = None, param: str | None = None):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"] and "Traceback" not in body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code, body
    if param is not None:
        assert body["error"]["param"] == param, body
    return body["error"]


def wait_for(predicate, what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def plain_output(service: EngineService, prompt_text: str, max_tokens: int, stop=(), repeats: int = 0):
    """What plain greedy decoding of ``prompt_text`` produces under the service's end rules."""
    target = service.target
    limits = GenerationLimits(
        max_tokens, (*stop, *service.prompts.end_markers), stop_token_ids=service.stop_token_ids, stop_repeats=repeats
    )
    return generate_all(target, target.encode(prompt_text), None, limits=limits)


def last_request(service: EngineService) -> dict:
    requests = service.snapshot()["last_requests"]
    return requests[-1] if requests else {}


def cancelled_count(service: EngineService) -> int:
    return service.snapshot()["finish_reasons"].get("cancelled", 0)
