"""Hostile input at the HTTP door (the shipped model behind a real uvicorn): invalid Unicode in any
field, absurd numbers and broken HTTP framing are each a 4xx with the door's JSON error body, and
300 seeded mutations of valid requests (``bench.hostile_cases``) get 0 answers of 5xx and 0 hangs,
with the server still serving after them."""

from __future__ import annotations

import pytest
from hosted import TOKEN, assert_error, httpx2, post

from bench.hostile_cases import HttpCase, http_cases, http_request
from bench.hostile_input import exchange, run_http

FUZZ_SEED = 4811
FUZZ_CASES = 300
ANSWER_S = 60  # a hang guard: each answer normally comes within a second

CHAT = '{"messages": [{"role": "user", "content": "```\\nx = 1\\n```"}], "max_tokens": 2'
LONE_SURROGATES = [  # raw body, the field the 400 names
    ("/v1/completions", '{"prompt": "def f(x):\\n    \\ud800", "max_tokens": 2}', "prompt"),
    ("/v1/completions", '{"prompt": "a", "suffix": "\\udfff b", "max_tokens": 2}', "suffix"),
    ("/v1/completions", '{"prompt": "a", "prediction": "x\\ud83d", "max_tokens": 2}', "prediction"),
    ("/v1/completions", '{"prompt": "a", "max_tokens": 2, "user": "\\udc00"}', "user"),  # a field no one reads
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages[0].content"),
    ("/v1/chat/completions", CHAT + ', "prediction": {"type": "content", "content": "\\udbff"}}', "prediction.content"),
    (
        "/v1/chat/completions",
        '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}',
        "messages[0].content[0].text",
    ),
]


def raw_post(hosted, path: str, body: str | bytes):
    data = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    return httpx2.post(hosted.url + path, content=data, headers=headers, timeout=ANSWER_S)


@pytest.mark.parametrize(("path", "body", "param"), LONE_SURROGATES, ids=[case[2] for case in LONE_SURROGATES])
def test_a_lone_surrogate_anywhere_is_a_400_naming_the_field(shipped, path, body, param):
    error = assert_error(raw_post(shipped, path, body), 400, "invalid_value", param)
    assert "lone surrogate" in error["message"]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('{"prompt": "a", "max_tokens": 1' + "0" * 5000 + "}", "5001 digits"),
        ('{"prompt": "a", "seed": -' + "9" * 4400 + "}", "digits"),
        ('{"prompt": "a", "temperature": NaN}', "NaN"),
        ('{"prompt": "a", "top_p": Infinity}', "Infinity"),
        ('{"prompt": "a", "temperature": 1e999}', "64-bit float"),
        (b'{"prompt": "a\xff"}', "not UTF-8"),
        (b"\xff\xfe{\x00}\x00", "not UTF-8"),
        ('{"prompt": "a", "x": ' + "[" * 5000 + "]" * 5000 + "}", "nested too deeply"),
    ],
)
def test_what_is_not_strict_json_is_invalid_json(shipped, body, says):
    error = assert_error(raw_post(shipped, "/v1/completions", body), 400, "invalid_json")
    assert says in error["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "a", "seed": 2**64, "temperature": 0.5}, "seed"),  # a torch generator refused it: 500
        ({"prompt": "a", "seed": -(2**63) - 1}, "seed"),
        ({"prompt": "a", "max_tokens": -0}, "max_tokens"),
        ({"prompt": "a", "max_tokens": -1}, "max_tokens"),
        ({"prompt": "a", "max_tokens": 10**30}, "max_tokens"),
        ({"prompt": "a", "max_tokens": 1e3}, "max_tokens"),
        ({"prompt": {"a": 1}}, "prompt"),
        ({"prompt": "a", "suffix": ["b"]}, "suffix"),
        ({"prompt": "a", "stream_options": [1]}, "stream_options"),
    ],
)
def test_absurd_numbers_and_wrong_types_name_the_field(shipped, body, param):
    assert_error(post(shipped, "/v1/completions", body), 400, None, param)


def test_the_largest_seed_a_generator_takes_is_served(shipped):
    body = {"prompt": "def f(x):\n    return ", "max_tokens": 2, "temperature": 0.5, "seed": 2**64 - 1}
    assert post(shipped, "/v1/completions", body).status_code == 200


AUTH = f"Authorization: Bearer {TOKEN}\r\n".encode()
FRAMING = [  # request bytes, whether the client ends its side after them, what the 400 says
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}", False, "Content-Length"),
    (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n",
        False,
        "chunk",
    ),
    (b"GARBAGE\r\n\r\n", False, "request line"),
    (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nNo Colon\r\n\r\n", False, "header line"),
    (b"GET /v1/models HTTP/1.1\r\n\r\n", False, "Host"),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Length: 50\r\n\r\n{}", True, "50"),
    (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Transfer-Encoding: chunked\r\n\r\n9\r\n{}",
        True,
        "chunked",
    ),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthoriz", True, "closed"),
]


@pytest.mark.parametrize(("data", "half_close", "says"), FRAMING, ids=[case[2] for case in FRAMING])
def test_broken_http_framing_gets_the_json_error_body(shipped, data, half_close, says):
    answer = exchange("127.0.0.1", shipped.server.port, HttpCase("framing", data, half_close), ANSWER_S)
    assert answer.status == 400 and answer.headers["content-type"] == "application/json", answer
    error = httpx2.Response(400, content=answer.body).json()["error"]
    assert error["code"] == "invalid_http" and error["type"] == "invalid_request_error", error
    assert says in error["message"], error


def test_the_guard_still_answers_well_framed_requests_first(shipped):
    body = b'{"prompt": "\\ud800"}'
    answer = exchange(
        "127.0.0.1", shipped.server.port, HttpCase("no token", http_request("/v1/completions", body, "x"))
    )
    assert answer.status == 401  # the token is checked before the body is read
    origin = http_request("/v1/completions", body, TOKEN, [("Origin", "https://evil.example")])
    assert exchange("127.0.0.1", shipped.server.port, HttpCase("origin", origin)).status == 403


def test_seeded_mutations_get_no_5xx_no_hang_and_the_server_stays_up(shipped):
    cases = http_cases(FUZZ_SEED, FUZZ_CASES, TOKEN)
    kinds = {case.kind.split(":")[0] for case in cases}
    assert kinds == {"body", "framing", "guard"}, kinds
    tally = run_http("127.0.0.1", shipped.server.port, cases, ANSWER_S)
    assert tally.sent == FUZZ_CASES and tally.answered == FUZZ_CASES, tally.as_dict()
    assert not tally.server_errors and not tally.hangs and not tally.not_json, tally.as_dict()
    assert not tally.failures, tally.as_dict()
    assert tally.statuses[400] > FUZZ_CASES // 2 and tally.statuses[200] > 0, tally.as_dict()  # it did both
    models = httpx2.get(shipped.url + "/v1/models", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=ANSWER_S)
    assert models.status_code == 200
