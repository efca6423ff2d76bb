"""Ollama's API refuses bad input with a 4xx in Ollama's shape (``{"error": "..."}``), names the
field, and never answers 5xx: literal cases, then a seeded fuzz over every endpoint (the tiny
random model's server, tests/http_api/hosted.py); and the parsing rules as plain functions."""

from __future__ import annotations

import json
import random

import ollama
import pytest
from hosted import LONG_CHAT, TOKEN, WAIT_S, Hosted, cancelled_count, httpx2, post, wait_for

from codespec.http_api import ollama_schema as wire
from codespec.service.requests.options import HttpLimits

ENDPOINTS = ("/api/generate", "/api/chat", "/api/show")


def assert_ollama_error(response, status: int, fragment: str = "") -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and isinstance(body["error"], str) and "Traceback" not in body["error"], body
    assert fragment in body["error"], body
    return body["error"]


@pytest.mark.parametrize(
    "path, body, fragment",
    [
        ("/api/generate", {"prompt": "x"}, "model is required"),
        ("/api/generate", {"model": 3, "prompt": "x"}, "model must be a string"),
        ("/api/generate", {"model": "codespec", "prompt": 5}, "prompt must be a string"),
        ("/api/generate", {"model": "codespec", "prompt": "x", "stream": "yes"}, "stream must be true or false"),
        ("/api/generate", {"model": "codespec", "prompt": "x", "options": []}, "options must be an object"),
        ("/api/generate", {"model": "codespec", "prompt": "x", "options": {"num_predict": 0}}, "options.num_predict"),
        ("/api/generate", {"model": "codespec", "prompt": "x", "options": {"num_predict": 1.5}}, "options.num_predict"),
        ("/api/generate", {"model": "codespec", "prompt": "x", "options": {"temperature": 9}}, "options.temperature"),
        ("/api/generate", {"model": "codespec", "prompt": "x", "options": {"top_p": 0}}, "options.top_p"),
        ("/api/generate", {"model": "codespec", "prompt": "x", "options": {"stop": [""]}}, "options.stop"),
        ("/api/generate", {"model": "codespec", "prompt": "x", "options": {"seed": "a"}}, "options.seed"),
        ("/api/generate", {"model": "codespec", "prompt": "x", "options": {"num_ctx": 0}}, "options.num_ctx"),
        ("/api/generate", {"model": "codespec", "prompt": "x", "options": {"top_k": -1}}, "options.top_k"),
        ("/api/generate", {"model": "codespec", "prompt": "x", "options": {"mirostat": 2}}, "options.mirostat"),
        ("/api/generate", {"model": "codespec", "prompt": "x", "options": {"min_p": "x"}}, "options.min_p"),
        ("/api/generate", {"model": "codespec", "prompt": "x", "images": ["aGk="]}, "images:"),
        ("/api/generate", {"model": "codespec", "prompt": "x", "template": "{{ .Prompt }}"}, "template:"),
        ("/api/generate", {"model": "codespec", "prompt": "x", "context": [1, 2]}, "context:"),
        ("/api/generate", {"model": "codespec", "prompt": "x", "think": True}, "think:"),
        ("/api/generate", {"model": "codespec", "prompt": "x", "format": {"type": "object"}}, "format:"),
        ("/api/generate", {"model": "codespec", "prompt": "x", "raw": True, "system": "s"}, "raw mode"),
        ("/api/generate", {"model": "codespec", "prompt": "x", "raw": True, "suffix": "y"}, "raw mode"),
        ("/api/generate", {"model": "codespec", "prompt": "x", "keep_alive": "soon"}, "keep_alive"),
        ("/api/generate", {"model": "codespec", "keep_alive": 0}, "cannot be unloaded"),
        ("/api/generate", {"model": "codespec", "prompt": "\ud800"}, "lone surrogate"),
        ("/api/generate", {"model": "codespec", "prompt": "x", "proposer": "magic"}, "proposer"),
        ("/api/chat", {"model": "codespec", "messages": {}}, "messages must be a list"),
        ("/api/chat", {"model": "codespec", "messages": ["hi"]}, "messages[0] must be an object"),
        ("/api/chat", {"model": "codespec", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ("/api/chat", {"model": "codespec", "messages": [{"role": "user", "content": 5}]}, "content must be a string"),
        ("/api/chat", {"model": "codespec", "messages": [{"role": "user", "content": "x", "images": ["a"]}]}, "images"),
        ("/api/chat", {"model": "codespec", "messages": [{"role": "user", "content": "x"}], "tools": [{}]}, "tools:"),
        ("/api/chat", {"model": "codespec", "messages": [{"role": "user", "content": "no code"}]}, "fenced block"),
        ("/api/show", {}, "model is required"),
        ("/api/show", {"model": ["codespec"]}, "model must be a string"),
    ],
)
def test_bad_requests_are_400_naming_the_field(tiny, path, body, fragment):
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    content = json.dumps(body).encode()  # ASCII-escaped: a lone surrogate travels as JSON spells it
    assert_ollama_error(httpx2.post(tiny.url + path, content=content, headers=headers, timeout=WAIT_S), 400, fragment)


def test_unknown_models_are_404(tiny):
    for path, body in [
        ("/api/generate", {"model": "llama3.2", "prompt": "x"}),
        ("/api/chat", {"model": "llama3.2", "messages": [{"role": "user", "content": "x"}]}),
        ("/api/show", {"model": "llama3.2"}),
    ]:
        message = assert_ollama_error(post(tiny, path, body), 404, "model 'llama3.2' not found")
        assert "codespec:latest" in message  # it says what is served


def test_bad_bodies_routes_and_methods(tiny):
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    for raw, fragment in ((b"{", "JSON"), (b"[1]", "JSON"), (b"\xff", "UTF-8")):
        response = httpx2.post(tiny.url + "/api/generate", content=raw, headers=headers, timeout=WAIT_S)
        assert_ollama_error(response, 400, fragment)
    too_big = httpx2.post(
        tiny.url + "/api/chat", content=b" " * (1 << 17), headers=headers, timeout=WAIT_S
    )  # over the test server's 64 KiB limit
    assert_ollama_error(too_big, 413, "limit")
    assert_ollama_error(httpx2.get(tiny.url + "/api/generate", headers=headers, timeout=WAIT_S), 405, "use POST")
    assert_ollama_error(post(tiny, "/api/embed", {"model": "codespec", "input": "x"}), 404, "/api/embed")
    assert_ollama_error(post(tiny, "/api/pull", {"model": "codespec"}), 404, "/api/pull")


def test_a_prompt_longer_than_the_context_is_400_streamed_or_not(tiny):
    prompt = "x = 1\n" * 4000
    for stream in (False, True):
        body = {"model": "codespec", "prompt": prompt, "raw": True, "stream": stream}
        assert_ollama_error(post(tiny, "/api/generate", body), 400, "context")


def test_values_that_change_nothing_are_accepted(tiny):
    options = {
        "num_ctx": 4096,
        "num_thread": 4,
        "use_mmap": True,
        "repeat_penalty": 1.0,
        "top_k": 40,
        "num_predict": -1,
    }
    body = {"model": "codespec:latest", "prompt": "def f(x):\n", "raw": True, "stream": False, "keep_alive": "30m"}
    response = post(
        tiny, "/api/generate", {**body, "options": {**options, "num_predict": 4}, "format": "", "think": False}
    )
    assert response.status_code == 200 and response.json()["done"] is True, response.text
    response = post(tiny, "/api/generate", {**body, "options": options, "keep_alive": 1800})  # top_k with greedy: no-op
    assert response.status_code == 200 and response.json()["eval_count"] >= 1, response.text


def test_a_client_that_leaves_a_stream_cancels_its_generation(tiny):
    before = cancelled_count(tiny.service)
    body = {"model": "codespec", "messages": LONG_CHAT}  # ~2000 tokens from the tiny model, no loop stop
    with httpx2.stream(
        "POST", tiny.url + "/api/chat", json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=WAIT_S
    ) as response:
        first = json.loads(next(response.iter_lines()))
        assert first["done"] is False
    wait_for(lambda: cancelled_count(tiny.service) > before, "the engine to cancel the abandoned job")
    assert post(tiny, "/api/generate", {"model": "codespec", "prompt": "x", "stream": False}).status_code == 200


def test_a_full_server_is_429_with_retry_after(tiny):
    small = Hosted(tiny.service, HttpLimits(max_requests=1))
    try:
        body = {"model": "codespec", "messages": LONG_CHAT}
        with httpx2.Client(timeout=WAIT_S) as client:
            with client.stream(
                "POST", small.url + "/api/chat", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
            ) as response:
                lines = response.iter_lines()  # kept: a dropped line iterator closes the response
                next(lines)  # running
                refused = post(small, "/api/generate", {"model": "codespec", "prompt": "x"})
                assert_ollama_error(refused, 429, "--http-max-requests")
                assert refused.headers["retry-after"] == "1"
                with pytest.raises(ollama.ResponseError) as busy:
                    ollama.Client(host=small.url, headers={"Authorization": f"Bearer {TOKEN}"}).generate(
                        model="codespec", prompt="x"
                    )
                assert busy.value.status_code == 429
        wait_for(lambda: small.server.door.running == 0, "the slot to be released")
    finally:
        small.close()


# ---- a seeded fuzz: every answer is JSON, none is 5xx -------------------------------------------
JUNK = [None, True, 0, -1, 1.5, float("inf"), "", "x", "\ud83d", [], [1, "a"], {}, {"a": {"b": []}}, "5m", -2]
FIELDS = {
    "/api/generate": ["model", "prompt", "suffix", "system", "raw", "stream", "options", "keep_alive", "format",
                      "images", "template", "context", "think", "proposer"],
    "/api/chat": ["model", "messages", "stream", "options", "keep_alive", "format", "tools", "think"],
    "/api/show": ["model", "name", "verbose"],
}  # fmt: skip
OPTION_KEYS = ["num_predict", "temperature", "top_p", "top_k", "seed", "stop", "num_ctx", "repeat_penalty", "min_p"]


def fuzz_body(rng: random.Random, path: str) -> dict:
    """A valid small request with one to three fields replaced by junk."""
    base: dict = {"model": "codespec", "stream": rng.random() < 0.5, "options": {"num_predict": 3}}
    if path == "/api/generate":
        base |= {"prompt": "def f(x):\n", "raw": rng.random() < 0.5}
    elif path == "/api/chat":
        base |= {"messages": [{"role": "user", "content": "```\nx = 1\n```"}]}
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.4:
            options = dict(base["options"]) if isinstance(base.get("options"), dict) else {}
            options[rng.choice(OPTION_KEYS)] = rng.choice(JUNK)
            options["num_predict"] = rng.choice([3, 3, 0, -3, "x", 1.5])  # never a long generation
            base["options"] = options
        else:
            base[rng.choice(FIELDS[path])] = rng.choice(JUNK)
    return base


def test_seeded_fuzz_never_answers_5xx(tiny):
    rng = random.Random(50)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    statuses: dict[int, int] = {}
    for _ in range(240):
        path = rng.choice(ENDPOINTS)
        body = fuzz_body(rng, path)
        content = json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")
        response = httpx2.post(tiny.url + path, content=content, headers=headers, timeout=WAIT_S)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert response.status_code < 500, (path, body, response.text)
        for line in response.text.splitlines():  # one JSON object, or NDJSON lines
            assert isinstance(json.loads(line), dict), (path, body, response.text)
        if response.status_code >= 400:
            assert set(response.json()) == {"error"}, (path, body, response.text)
    assert statuses.get(200, 0) >= 20 and sum(count for status, count in statuses.items() if status >= 400) >= 100
    assert post(tiny, "/api/generate", {"model": "codespec", "prompt": "x", "stream": False}).status_code == 200


# ---- parsing, as plain functions ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "value, zero",
    [(None, False), (0, True), (0.0, True), ("0", True), ("0s", True), ("0m0s", True), ("5m", False),
     ("1h30m", False), (-1, False), ("-1", False), ("300ms", False), (1800, False)],
)  # fmt: skip
def test_keep_alive_reads_seconds_and_go_durations(value, zero):
    assert wire.keep_alive_is_zero(value) is zero


@pytest.mark.parametrize("value", ["soon", "5 minutes", True, [5], float("nan"), "1e999"])
def test_keep_alive_refuses_what_is_not_a_duration(value):
    with pytest.raises(wire.OllamaError, match="keep_alive"):
        wire.keep_alive_is_zero(value)


def test_options_map_to_codespecs_sampling():
    options = wire.parse_options({"num_predict": 12, "temperature": 0.5, "top_p": 0.9, "seed": 3, "stop": "\n\n"})
    sampling = options.sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p, sampling.seed, sampling.stop) == (
        12, 0.5, 0.9, 3, ("\n\n",)
    )  # fmt: skip
    assert wire.parse_options(None).sampling.stop == ()  # no stop rule beyond the format's end markers
    assert wire.parse_options({"num_predict": -1}).sampling.max_tokens is None  # the request's own budget
    assert wire.parse_options({"num_predict": -2}).sampling.max_tokens is None
    assert wire.parse_options({"temperature": 0, "top_k": 40}).sampling.temperature == 0  # greedy: top_k is moot
    assert wire.parse_options({"num_ctx": 8192, "unknown_knob": [1]}).num_ctx == 8192  # unknown keys ignored


def test_ollama_names_of_the_served_model():
    names = wire.OllamaNames.of(
        "ollama:qwen2.5-coder:0.5b", ("ollama:qwen2.5-coder:0.5b", "codespec"), "qwen2.5-coder", False, "/d"
    )
    assert names.listed == ("qwen2.5-coder:0.5b", "codespec:latest", "qwen2.5-coder:codespec")
    for name in (
        "qwen2.5-coder:0.5b",
        "codespec",
        "codespec:latest",
        "qwen2.5-coder:codespec",
        "ollama:qwen2.5-coder:0.5b",
    ):
        assert names.check(name) == name
    with pytest.raises(wire.OllamaError) as draft:
        names.check("/d")
    assert draft.value.status == 404 and "draft model" in draft.value.message
    assert wire.OllamaNames.of("x", ("x", "codespec"), None, True, None).check("anything:7b") == "anything:7b"
    assert wire.OllamaNames.of("ollama:llama3.2", ("codespec",), None, False, None).listed == (
        "llama3.2:latest", "codespec:latest"
    )  # fmt: skip
    assert wire.tagged("library/x") == "library/x:latest" and wire.tagged("host:5000/x") == "host:5000/x:latest"
