"""The one JSON decoder every door uses: what Python's ``json`` lets through or fails on late
(NaN, 1e999, a 5,000-digit integer, bytes that are not UTF-8, deep nesting) is one
``JsonInputError``; a lone surrogate is found anywhere, with the path a client writes; the HTTP
and websocket doors give the same verdict on the same bytes."""

from __future__ import annotations

import json

import pytest

from codespec.http_api.schema import ApiError, parse_json
from codespec.service.requests import jsondecode
from codespec.service.requests.jsondecode import JsonInputError, JsonTooDeep, lone_surrogate, may_hold_surrogates
from codespec.websocket_api.protocol import ProtocolError, parse_message

REFUSED = [  # raw, what the message says
    (b'{"a": NaN}', "NaN"),
    (b'{"a": -Infinity}', "Infinity"),
    (b'{"a": 1e999}', "too large for a 64-bit float"),
    (b'{"a": -1' + b"0" * 5000 + b"}", "5001 digits"),
    (b'{"a": 1' + b"0" * jsondecode.MAX_INT_DIGITS + b"}", f"at most {jsondecode.MAX_INT_DIGITS}"),
    (b'{"a": "\xff"}', "not UTF-8: byte 0xff at offset 7"),
    (b'{"a": "\xed\xa0\x80"}', "not UTF-8"),  # a surrogate encoded in the bytes (CESU-8)
    (b'\xff\xfe{\x00"\x00', "not UTF-8"),  # UTF-16 is not guessed
    (b'{"a": 1', "not valid JSON"),
    (b"\xef\xbb\xbf{}", "not valid JSON"),  # a byte order mark
    (b"", "not valid JSON"),
]


@pytest.mark.parametrize(("raw", "says"), REFUSED, ids=[says for _, says in REFUSED])
def test_what_is_not_strict_json_is_one_error(raw, says):
    with pytest.raises(JsonInputError, match=says):
        jsondecode.loads(raw)


def test_nesting_past_the_decoder_is_its_own_error():
    with pytest.raises(JsonTooDeep):
        jsondecode.loads(b"[" * 100_000 + b"]" * 100_000)


def test_what_is_json_decodes_as_json_does():
    raw = '{"a": [1, -0, 2.5e3, 1e308, true, null, "é😀", "\\ud83d\\ude00"], "b": {"c": "' + "9" * 100 + '"}}'
    assert jsondecode.loads(raw.encode()) == json.loads(raw) == jsondecode.loads(raw)
    assert jsondecode.loads(b"1" + b"0" * (jsondecode.MAX_INT_DIGITS - 1)) == 10 ** (jsondecode.MAX_INT_DIGITS - 1)


def test_the_lsp_door_may_take_encoded_surrogates_to_replace_them():
    assert jsondecode.loads(b'"\xed\xa0\x80"', utf8_errors="surrogatepass") == "\ud800"


@pytest.mark.parametrize(
    ("raw", "path", "index"),
    [
        ('{"prompt": "ab\\ud800"}', "prompt", 2),
        ('{"messages": [{"role": "user", "content": "x"}, {"content": "\\udfff"}]}', "messages[1].content", 0),
        ('{"prediction": {"content": ["ok", "\\udc00"]}}', "prediction.content[1]", 0),
        ('{"\\ud800k": 1}', "\\ud800k (key)", 0),
        ('"\\udbff"', "the value", 0),
        ('{"a": "\\ud83d\\ude00", "b": "\\ud83d"}', "b", 0),  # a pair is one character; the lone half is not
    ],
)
def test_a_lone_surrogate_is_found_anywhere_with_its_path(raw, path, index):
    assert may_hold_surrogates(raw) and may_hold_surrogates(raw.encode())
    found = lone_surrogate(jsondecode.loads(raw))
    assert found is not None and found[0] == path and found[2] == index
    path.encode("utf-8")  # the path itself can be sent back to the client


def test_text_without_surrogate_escapes_skips_the_walk():
    assert not may_hold_surrogates(b'{"prompt": "\\u00e9 \\uD7FF \\uE000 \xc3\xa9"}')
    assert lone_surrogate(jsondecode.loads(b'{"prompt": "\\uD7FF\\uE000"}')) is None
    deep = {"a": [[[[["\ud800"]]]]]}
    assert lone_surrogate(deep) == ("a[0][0][0][0][0]", "\ud800", 0)


DOORS = [  # raw body, the HTTP code, the websocket code
    (b'{"type": "complete", "id": 1, "prefix": "x", "max_tokens": NaN}', "invalid_json", "invalid_json"),
    (b'{"type": "complete", "id": 1, "prefix": "x", "seed": 1' + b"0" * 4999 + b"}", "invalid_json", "invalid_json"),
    (b'{"type": "complete", "id": 1, "prefix": "x", "top_p": 1e400}', "invalid_json", "invalid_json"),
    (b'{"type": "complete", "id": 1, "prefix": "x\xc3"}', "invalid_json", "invalid_json"),
    (b'{"type": "complete", "id": 1, "prefix": "x", "user": "\\ud800"}', "invalid_value", "invalid_request"),
]


@pytest.mark.parametrize(("raw", "http_code", "ws_code"), DOORS)
def test_the_http_and_websocket_doors_decode_alike(raw, http_code, ws_code):
    with pytest.raises(ApiError) as http:
        parse_json(raw)
    assert http.value.status == 400 and http.value.code == http_code
    with pytest.raises(ProtocolError) as ws:
        parse_message(raw, 1 << 20)
    assert ws.value.code == ws_code and ws.value.request_id == 1


def test_a_path_names_long_keys_in_short():
    path, _, _ = lone_surrogate(jsondecode.loads('{"' + "k" * 5000 + '": {"a": "\\ud800"}}'))
    assert path == "k" * jsondecode.MAX_KEY_CHARS + "....a"
