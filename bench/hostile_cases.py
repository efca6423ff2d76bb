"""Malformed input for every door, made from valid requests by seeded mutation (``bench.hostile_input``
and the doors' hostile-input tests use it): invalid Unicode (lone surrogates spelled in JSON, bytes
that are not UTF-8), absurd numbers (5,000 digits, 1e999, NaN, -0, past 64 bits), wrong types,
deep nesting, truncations, and for HTTP broken framing (request lines, headers, Content-Length,
chunked encoding). Every case is bytes as they go on the wire, so nothing a client library would
refuse to write is out of reach.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SURROGATES = ['"\\ud800"', '"x = \\udfff\\n"', '"\\udc00\\ud800"', '"ok \\ud83d"', '"\\uDBFF"']
NUMBERS = [
    "1" + "0" * 5000,
    "-" + "9" * 101,
    "1" + "0" * 99,
    "18446744073709551616",
    "-9223372036854775809",
    "4294967297",
    "1e999",
    "-1e999",
    "NaN",
    "Infinity",
    "-Infinity",
    "-0",
    "-0.0",
    "1e-400",
    "0.5",
    "-1",
    "0",
    "1" + "0" * 30 + ".5",
]
WRONG_TYPES = ["null", "true", "false", "[]", "{}", '""', '"x"', '[1, "a", null]', '{"a": {"b": []}}', '"1"']
INVALID_UTF8 = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\xe2\x82"]
NOT_OBJECTS = [b"[]", b"1", b'"x"', b"null", b"", b"   ", b"[{}]"]


def deep(rng: random.Random) -> str:
    depth = rng.choice([64, 500, 999, 5000, 20_000])
    return "[" * depth + "]" * depth if rng.random() < 0.5 else '{"a":' * depth + "1" + "}" * depth


def hostile_token(rng: random.Random) -> str:
    """One JSON value as raw text (some of them not JSON at all: NaN, a 5,000-digit number)."""
    roll = rng.random()
    if roll < 0.25:
        return rng.choice(SURROGATES)
    if roll < 0.55:
        return rng.choice(NUMBERS)
    if roll < 0.85:
        return rng.choice(WRONG_TYPES)
    if roll < 0.95:
        return deep(rng)
    return json.dumps("é" * rng.choice([1000, 5000]))


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += _paths(item, (*prefix, index))
    return out


def _replaced(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    copy: Any = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _replaced(value[path[0]], path[1:], new)
    return copy


PLACEHOLDER = "@@hostile@@"


def with_raw(base: dict, path: tuple, raw: str) -> bytes:
    """``base`` as JSON with the value at ``path`` spelled as ``raw`` (any text)."""
    text = json.dumps(_replaced(base, path, PLACEHOLDER), ensure_ascii=False)
    return text.replace(json.dumps(PLACEHOLDER), raw, 1).encode("utf-8", "surrogatepass")


def mutate(rng: random.Random, base: dict, keep: tuple[str, ...] = ()) -> tuple[str, bytes]:
    """(what was done, the mutated JSON text) for one valid message ``base``; keys in ``keep``
    (an id) are left alone by the value mutations, so the answer can be matched."""
    kind = rng.choice(["value", "value", "value", "new_key", "surrogate_in_text", "bytes", "truncate", "top"])
    paths = [path for path in _paths(base) if path and path[0] not in keep]
    if kind == "value" and paths:
        path = rng.choice(paths)
        return f"value:{'.'.join(map(str, path))}", with_raw(base, path, hostile_token(rng))
    if kind == "new_key":
        objects = [path for path in _paths(base) if isinstance(_get(base, path), dict)]
        path = rng.choice(objects)
        key = rng.choice(["x", "max_tokens", "seed", "id", "\ud800k", "n", "stream_options", "prediction"])
        if key in keep:
            key = "extra"
        inner = dict(_get(base, path))
        inner[key] = PLACEHOLDER
        return f"new_key:{key}", with_raw(_replaced(base, path, inner), (*path, key), hostile_token(rng))
    if kind == "surrogate_in_text":
        texts = [path for path in paths if isinstance(_get(base, path), str)]
        if texts:
            path = rng.choice(texts)
            text = json.dumps(_get(base, path))[1:-1]
            cut = rng.randrange(len(text) + 1)
            while cut and text[cut - 1] == "\\":  # not inside an escape
                cut -= 1
            spelled = '"' + text[:cut] + rng.choice(["\\ud800", "\\udfff", "\\ud83d"]) + text[cut:] + '"'
            return f"surrogate:{'.'.join(map(str, path))}", with_raw(base, path, spelled)
    data = json.dumps(base, ensure_ascii=False).encode()
    if kind == "truncate":
        return "truncate", data[: rng.randrange(len(data))]
    if kind == "top":
        return "not_an_object", rng.choice(NOT_OBJECTS)
    at = rng.randrange(len(data) + 1)
    bad = rng.choice(INVALID_UTF8)
    if rng.random() < 0.5:
        return "invalid_utf8", data[:at] + bad + data[at:]
    flipped = bytearray(data)
    flipped[min(at, len(data) - 1)] ^= 1 << rng.randrange(8)
    return "bit_flip", bytes(flipped)


def _get(value: Any, path: tuple) -> Any:
    for step in path:
        value = value[step]
    return value


# ---- HTTP ---------------------------------------------------------------------------------------
CODE = "def scale(values, factor):\n    return [value * factor for value in values]\n"
HTTP_BASES: list[tuple[str, dict]] = [
    ("/v1/completions", {"prompt": "def add(a, b):\n    return ", "max_tokens": 4}),
    ("/v1/completions", {"prompt": "def add(a, b):\n    ", "suffix": "\n\nprint(add(1, 2))\n", "max_tokens": 4}),
    ("/v1/completions", {"prompt": CODE, "prediction": "    return a + b\n", "max_tokens": 4, "stop": ["\n\n"]}),
    ("/v1/completions", {"prompt": "x = ", "max_tokens": 3, "temperature": 0.7, "seed": 7, "stream": True}),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": f"Rename factor to k.\n```python\n{CODE}```"}], "max_tokens": 4},
    ),
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "system", "content": "Edit code."}, {"role": "user", "content": "add a docstring"}],
            "prediction": {"type": "content", "content": CODE},
            "max_completion_tokens": 4,
        },
    ),
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": [{"type": "text", "text": f"```\n{CODE}```"}]}],
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
    # llama.cpp server's API (llama.vim, llama.vscode)
    (
        "/infill",
        {
            "input_prefix": "def add(a, b):\n    ",
            "input_suffix": "\n",
            "input_extra": [{"filename": "util.py", "text": CODE}],
            "prompt": "return",
            "n_predict": 4,
            "n_indent": 4,
            "t_max_predict_ms": 500,
            "samplers": ["top_k", "top_p", "infill"],
            "top_k": 40,
            "top_p": 0.99,
            "cache_prompt": True,
            "stream": False,
            "response_fields": ["content", "timings/prompt_n", "tokens_cached", "truncated"],
        },
    ),
    ("/completion", {"prompt": "def add(a, b):\n    return ", "n_predict": 4, "stream": True}),
    ("/tokenize", {"content": CODE, "add_special": False}),
    # Ollama's API (the ollama clients, Continue, Open WebUI)
    (
        "/api/generate",
        {
            "model": "codespec",
            "prompt": "def add(a, b):\n    ",
            "suffix": "\n",
            "stream": False,
            "options": {"num_predict": 4, "temperature": 0, "stop": ["\n\n"]},
        },
    ),
    (
        "/api/chat",
        {
            "model": "codespec",
            "messages": [{"role": "user", "content": "add a docstring"}],
            "options": {"num_predict": 4, "seed": 3},
        },
    ),
    ("/api/show", {"model": "codespec"}),
]


@dataclass(frozen=True)
class HttpCase:
    kind: str
    data: bytes  # the whole request as it goes on the wire
    half_close: bool = False  # unanswered after a moment, the client ends its side (a truncated request)
    cut_short: bool = False  # the request is surely incomplete: the client ends its side at once


def _head(method: str, path: str, token: str, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {token}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def http_request(path: str, body: bytes, token: str, extra: Sequence[tuple[str, str]] = ()) -> bytes:
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body))), *extra]
    return _head("POST", path, token, headers) + body


def _chunked(body: bytes, rng: random.Random) -> bytes:
    out, at = b"", 0
    while at < len(body):
        size = rng.randint(1, max(1, len(body) // 3))
        out += b"%x\r\n" % size + body[at : at + size] + b"\r\n"
        at += size
    return out + b"0\r\n\r\n"


def framing_case(rng: random.Random, token: str) -> HttpCase:
    """A request whose HTTP itself is broken (h11 refuses it before any route runs)."""
    path, base = rng.choice(HTTP_BASES)
    body = json.dumps(base).encode()
    auth = f"Authorization: Bearer {token}\r\n".encode()
    choices = {
        "bad_content_length": lambda: (
            _head("POST", path, token, [("Content-Length", rng.choice(["abc", "-1", "1e3", "0x10", " "]))]) + body
        ),
        "two_content_lengths": lambda: (
            _head("POST", path, token, [("Content-Length", str(len(body))), ("Content-Length", str(len(body) + 1))])
            + body
        ),
        "short_body": lambda: (
            _head("POST", path, token, [("Content-Length", str(len(body) + rng.randint(1, 500)))]) + body
        ),
        "bad_chunk_size": lambda: (
            _head("POST", path, token, [("Transfer-Encoding", "chunked")])
            + rng.choice([b"zz", b"-5", b"ffffffffffffffffffff", b"1;\x00"])
            + b"\r\n"
            + body
            + b"\r\n0\r\n\r\n"
        ),
        "chunk_without_crlf": lambda: (
            _head("POST", path, token, [("Transfer-Encoding", "chunked")])
            + b"%x\r\n" % len(body)
            + body
            + b"XX0\r\n\r\n"
        ),
        "truncated_chunks": lambda: (
            _head("POST", path, token, [("Transfer-Encoding", "chunked")])
            + _chunked(body, rng)[: rng.randrange(1, len(body))]
        ),
        "unknown_transfer_encoding": lambda: (
            _head("POST", path, token, [("Transfer-Encoding", rng.choice(["gzip", "chunked, chunked", "identity"]))])
            + body
        ),
        "request_line": lambda: (
            rng.choice(
                [
                    b"GARBAGE",
                    b"POST",
                    b"POST /v1/completions",
                    b"POST /v1/completions HTTP/1.1 extra",
                    b"\x00\xff\xfe",
                    b"POST /v1/\xffx HTTP/1.1",
                    b"POST http://[::1 HTTP/1.1",
                    b"P\x00ST / HTTP/1.1",
                ]
            )
            + b"\r\nHost: x\r\n"
            + auth
            + b"\r\n"
        ),
        "bad_header": lambda: (
            b"POST "
            + path.encode()
            + b" HTTP/1.1\r\nHost: x\r\n"
            + auth
            + rng.choice(
                [b"No Colon Here", b"X-A : b", b"X-A: \x00", b": empty-name", b"X\xffA: b", b" folded: x", b"X-A: b\rc"]
            )
            + b"\r\nContent-Length: %d\r\n\r\n" % len(body)
            + body
        ),
        "no_host": lambda: (
            b"POST " + path.encode() + b" HTTP/1.1\r\n" + auth + b"Content-Length: %d\r\n\r\n" % len(body) + body
        ),
        "bare_lf_and_garbage": lambda: rng.choice(
            [b"\r\n\r\n", b"\n\n", b"HTTP/1.1 200 OK\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"]
        ),
        "head_cut": lambda: _head("POST", path, token, [("Content-Length", str(len(body)))])[: rng.randrange(5, 60)],
        "huge_header": lambda: (
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + auth + b"X-Big: " + b"a" * rng.choice([20_000, 70_000])
        ),
    }
    kind = rng.choice(sorted(choices))
    # Unanswered after a moment, the client ends its side (a half-close): a request cut short is
    # then complete as far as it will ever be, and the server must say what is wrong with it
    # rather than wait for the rest. (Right away would be a client gone: after a whole request
    # the server cancels its job and answers nothing.)
    cut_short = kind in ("short_body", "truncated_chunks", "head_cut", "huge_header")
    return HttpCase(f"framing:{kind}", choices[kind](), half_close=True, cut_short=cut_short)


def http_case(rng: random.Random, token: str) -> HttpCase:
    roll = rng.random()
    if roll < 0.3:
        return framing_case(rng, token)
    path, base = rng.choice(HTTP_BASES)
    if roll < 0.34:  # the guard still answers first: no token, a wrong one, a foreign origin
        what = rng.choice(["no_token", "wrong_token", "origin"])
        body = json.dumps(base).encode()
        if what == "origin":
            return HttpCase("guard:origin", http_request(path, body, token, [("Origin", "https://evil.example")]))
        data = http_request(path, body, "wrong" if what == "wrong_token" else token)
        if what == "no_token":
            data = data.replace(f"Authorization: Bearer {token}\r\n".encode(), b"")
        return HttpCase(f"guard:{what}", data)
    kind, body = mutate(rng, base)
    return HttpCase(f"body:{kind}", http_request(path, body, token))


def http_cases(seed: int, count: int, token: str) -> list[HttpCase]:
    rng = random.Random(seed)
    return [http_case(rng, token) for _ in range(count)]


# ---- websocket and LSP --------------------------------------------------------------------------
WS_BASES: list[dict] = [
    {"type": "complete", "id": 0, "prefix": "def add(a, b):\n    return ", "suffix": "\n", "max_tokens": 4},
    {"type": "complete", "id": 0, "document": CODE, "position": {"line": 1, "character": 4}, "max_tokens": 4},
    {"type": "edit", "id": 0, "text": CODE, "instruction": "rename factor to k", "max_tokens": 4},
    {"type": "complete", "id": 0, "prefix": "x = ", "max_tokens": 3, "stop": ["\n"], "temperature": 0.5, "seed": 3},
    {"type": "stats", "id": 0},
    {"type": "cancel", "id": 0},
]

LSP_URI = "file:///hostile/doc.py"
LSP_BASES: list[dict] = [
    {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "textDocument/inlineCompletion",
        "params": {
            "textDocument": {"uri": LSP_URI},
            "position": {"line": 1, "character": 4},
            "context": {"triggerKind": 1},
        },
    },
    {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "textDocument/completion",
        "params": {"textDocument": {"uri": LSP_URI}, "position": {"line": 0, "character": 3}},
    },
    {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "codespec/edit",
        "params": {
            "textDocument": {"uri": LSP_URI},
            "range": {"start": {"line": 0, "character": 0}, "end": {"line": 1, "character": 0}},
        },
    },
    {"jsonrpc": "2.0", "id": 0, "method": "codespec/stats", "params": {}},
    {
        "jsonrpc": "2.0",
        "method": "textDocument/didChange",
        "params": {
            "textDocument": {"uri": LSP_URI, "version": 2},
            "contentChanges": [
                {"range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 3}}, "text": "def"}
            ],
        },
    },
    {
        "jsonrpc": "2.0",
        "method": "textDocument/didOpen",
        "params": {
            "textDocument": {"uri": "file:///hostile/other.py", "languageId": "python", "version": 1, "text": CODE}
        },
    },
]


@dataclass(frozen=True)
class MessageCase:
    kind: str
    data: bytes  # one websocket message (text when it is UTF-8) or one LSP frame's body
    sent_id: Any  # the id the unmutated message carried (None for a notification)


WS_KEEP = ("id", "type")  # what value mutations leave alone most of the time
LSP_KEEP = ("id", "jsonrpc", "method")


def message_cases(seed: int, count: int, bases: list[dict], id_prefix: str, keep: tuple[str, ...]) -> list[MessageCase]:
    """``count`` mutated messages; each base's id is made unique (and kept by value mutations
    most of the time, so the answer can be matched; some mutations hit the id too)."""
    rng = random.Random(seed)
    out = []
    for number in range(count):
        base = dict(rng.choice(bases))
        sent_id = None
        if "id" in base:
            sent_id = f"{id_prefix}-{number}" if rng.random() < 0.7 else number + 1_000_000
            base["id"] = sent_id
        kind, data = mutate(rng, base, keep if rng.random() < 0.9 else ())
        out.append(MessageCase(kind, data, sent_id))
    return out
