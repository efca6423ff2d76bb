"""The one JSON decoder for what clients send, at every door (HTTP bodies, websocket messages, LSP
frames): anything it cannot read is one :class:`JsonInputError` naming why, never a stray
``ValueError`` from deep inside Python.

Stricter than ``json.loads`` where Python is lenient or fails late: bytes must be UTF-8 (not
guessed UTF-16), ``NaN`` and ``Infinity`` are not JSON, an integer has at most
:data:`MAX_INT_DIGITS` digits (Python's own limit, 4,300, fails with advice meant for the
programmer), a float must fit 64 bits (``1e999`` is not infinity), nesting past the decoder's recursion limit is an error, not a crash. JSON can also
spell text no encoder accepts, a lone surrogate (``"\\ud800"``); :func:`lone_surrogate` finds one
anywhere in a decoded value, and the doors refuse it (HTTP, websocket) or replace it (the LSP,
whose clients may split a pair mid-edit).
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_INT_DIGITS = 100  # ids, counts, seeds and positions fit in 20; the fields' own checks say the range

MAX_KEY_CHARS = 80  # of a key in a path sent back to the client

_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE_B = re.compile(rb"\\u[dD][89a-fA-F]")  # the only way bytes can spell one
_SURROGATE_ESCAPE_S = re.compile(r"\\u[dD][89a-fA-F]")


class JsonInputError(ValueError):
    """Input that is not JSON this server reads; the message says why, for the client, and reads
    after "the body is" ("not valid JSON: ...", "not UTF-8: ...", "not JSON this server reads: ...")."""


class JsonTooDeep(JsonInputError):
    """Nesting past the decoder's recursion limit (an LSP door answers it with the request's id)."""


def _integer(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise JsonInputError(
            f"not JSON this server reads: a number has {len(digits.lstrip('-'))} digits; integers may have at most {MAX_INT_DIGITS}"
        )
    return int(digits)


_INF = float("inf")


def _float(spelling: str) -> float:
    value = float(spelling)
    if value in (_INF, -_INF):
        shown = spelling if len(spelling) <= 40 else spelling[:40] + "..."
        raise JsonInputError(f"not JSON this server reads: the number {shown} is too large for a 64-bit float")
    return value


def _constant(name: str) -> Any:
    raise JsonInputError(f"not valid JSON: {name} is not a JSON value (numbers must be finite)")


def loads(raw: bytes | str, utf8_errors: str = "strict") -> Any:
    """Decode one JSON text; raises :class:`JsonInputError` for anything that is not strict JSON.
    ``utf8_errors="surrogatepass"`` takes surrogates encoded in the bytes as well (as ``json.loads``
    does), for a door that replaces them after decoding."""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        try:
            text = bytes(raw).decode("utf-8", utf8_errors)
        except UnicodeDecodeError as error:
            raise JsonInputError(f"not UTF-8: byte 0x{error.object[error.start]:02x} at offset {error.start}") from None
    else:
        text = raw
    try:
        return json.loads(text, parse_int=_integer, parse_float=_float, parse_constant=_constant)
    except JsonInputError:
        raise
    except json.JSONDecodeError as error:
        raise JsonInputError(f"not valid JSON: {error}") from None
    except RecursionError:
        raise JsonTooDeep("nested too deeply to decode") from None
    except ValueError as error:  # a number the float parser refuses; nothing else is known to get here
        raise JsonInputError(f"not valid JSON: {str(error)[:200]}") from None


def may_hold_surrogates(raw: bytes | str) -> bool:
    """Whether decoding ``raw`` can give a lone surrogate: only a ``\\uD800``-``\\uDFFF`` escape
    spells one in bytes, so most inputs skip :func:`lone_surrogate`'s walk."""
    if isinstance(raw, str):
        if _SURROGATE_ESCAPE_S.search(raw) is not None:
            return True
        return not raw.isascii() and _SURROGATE.search(raw) is not None
    return _SURROGATE_ESCAPE_B.search(bytes(raw)) is not None


def lone_surrogate(value: Any) -> tuple[str, str, int] | None:
    """The first string in ``value`` holding a lone surrogate (a pair decodes to one character):
    ``(path, the surrogate, its index)`` with the path as a client writes it
    (``messages[0].content``; a key's own path ends in ``(key)``), or None. Iterative: any nesting
    the decoder produced is walked without recursion."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, str):
            if not node.isascii():
                match = _SURROGATE.search(node)
                if match is not None:
                    return path or "the value", match.group(), match.start()
        elif isinstance(node, dict):
            for key, item in reversed(node.items()):
                name = key if _SURROGATE.search(key) is None else key.encode("utf-8", "backslashreplace").decode()
                name = name if len(name) <= MAX_KEY_CHARS else name[:MAX_KEY_CHARS] + "..."  # the path is sent back
                inner = f"{path}.{name}" if path else name
                stack.append((inner, item))
                stack.append((f"{inner} (key)", key))
        elif isinstance(node, list):
            stack.extend((f"{path}[{index}]", item) for index, item in reversed(list(enumerate(node))))
    return None
