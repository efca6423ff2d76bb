"""The top-level ``"id"`` of a JSON-RPC message that could not be decoded (truncated, invalid, too
deep): every door answers a broken request with its id when the bytes hold one.

Shared by the LSP reader (``lsp.framing``) and the websocket door, so it lives with the service.
"""

from __future__ import annotations

import json
import re
from typing import Any

JSON_STRING_BYTES = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_SCALAR_B = re.compile(rb'[^\s{}\[\],:"]+')
_SPACE_B = re.compile(rb"\s*")
_STRING_S = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_SCALAR_S = re.compile(r'[^\s{}\[\],:"]+')
_SPACE_S = re.compile(r"\s*")

FOUND, ABSENT, UNKNOWN = "found", "absent", "unknown"


def peek_id(data: bytes | str, max_tokens: int = 100_000) -> tuple[str, Any]:
    """The top-level ``"id"`` of a JSON object that may be truncated, invalid or too deep to decode.

    Returns ``(FOUND, id)`` (id None when it is not an integer or a string), ``(ABSENT, None)``
    when the object ended or is not an object, ``(UNKNOWN, None)`` when the data stops first.
    Strings are skipped by one regex match each, so a megabyte of document text costs one step.
    """
    text = isinstance(data, str)
    patterns: tuple[Any, Any, Any] = (
        (_STRING_S, _SCALAR_S, _SPACE_S) if text else (JSON_STRING_BYTES, _SCALAR_B, _SPACE_B)
    )
    string, scalar, space = patterns  # str patterns for str data, bytes for bytes
    quote, open_object, open_array = ('"', "{", "[") if text else (b'"', b"{", b"[")
    closers = ("}", "]") if text else (b"}", b"]")
    pos = space.match(data, 0).end()
    if pos >= len(data):
        return UNKNOWN, None
    if data[pos : pos + 1] != open_object:
        return ABSENT, None
    pos += 1
    depth = 1
    phase = "key"  # at depth 1: key, colon, value, comma
    key = None
    for _ in range(max_tokens):
        pos = space.match(data, pos).end()
        if pos >= len(data):
            return UNKNOWN, None
        char = data[pos : pos + 1]
        if char == quote:
            match = string.match(data, pos)
            if match is None:
                return UNKNOWN, None  # a string that does not end in the data
            token = match.group()
            pos = match.end()
            if depth == 1:
                if phase == "key":
                    key, phase = token, "colon"
                elif phase == "value":
                    if key in ('"id"', b'"id"'):
                        try:
                            return FOUND, json.loads(token)
                        except ValueError:
                            return FOUND, None
                    phase = "comma"
            continue
        if char in (open_object, open_array):
            if depth == 1 and phase == "value" and key in ('"id"', b'"id"'):
                return FOUND, None  # an object or array as id
            depth += 1
            pos += 1
            continue
        if char in closers:
            depth -= 1
            pos += 1
            if depth == 0:
                return ABSENT, None
            if depth == 1:
                phase = "comma"
            continue
        pos += 1
        if char in (":", b":"):
            if depth == 1 and phase == "colon":
                phase = "value"
            continue
        if char in (",", b","):
            if depth == 1:
                phase = "key"
            continue
        match = scalar.match(data, pos - 1)
        if match is None:
            return ABSENT, None
        pos = match.end()
        if depth == 1 and phase == "value":
            if key in ('"id"', b'"id"'):
                if pos >= len(data):
                    return UNKNOWN, None  # the number may go on
                token = match.group()
                try:
                    value = json.loads(token)
                except ValueError:
                    return FOUND, None
                valid = isinstance(value, int) and not isinstance(value, bool)
                return FOUND, value if valid else None
            phase = "comma"
    return UNKNOWN, None


def id_of(value: Any) -> tuple[bool, Any]:
    """(has an id, the id if JSON-RPC allows it: an integer or a string, else None)."""
    if not isinstance(value, dict) or "id" not in value:
        return False, None
    raw = value["id"]
    valid = isinstance(raw, str) or (isinstance(raw, int) and not isinstance(raw, bool))
    return True, raw if valid else None
