"""Params as a client sent them, made safe to structure and described when they do not fit:
lone surrogates replaced (each by U+FFFD, which keeps every position), nesting bounded, and
cattrs's errors turned into one line naming the field (``lsp.rpc`` answers -32602 with it)."""

from __future__ import annotations

import re
from typing import Any

import cattrs

from codespec.service.doors.logsafe import clip

MAX_DEPTH = 64  # params nested deeper than this are refused (LSP's own types nest about 10 levels)
_SURROGATE = re.compile("[\ud800-\udfff]")


class ParamsTooDeep(ValueError):
    pass


def sanitize(value: Any, max_depth: int = MAX_DEPTH) -> tuple[Any, int]:
    """``value`` with lone surrogates in its strings replaced by U+FFFD, and how many strings had
    them; raises ParamsTooDeep past ``max_depth`` levels. Iterative: any nesting the JSON decoder
    produced is walked without recursion."""
    replaced = 0

    def clean(text: str) -> str:
        nonlocal replaced
        if text.isascii() or _SURROGATE.search(text) is None:
            return text
        replaced += 1
        return _SURROGATE.sub("\ufffd", text)

    if isinstance(value, str):
        return clean(value), replaced
    if not isinstance(value, (dict, list)):
        return value, 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise ParamsTooDeep(f"params are nested more than {max_depth} levels deep")
        if isinstance(node, dict):
            if any(isinstance(key, str) and not key.isascii() and _SURROGATE.search(key) for key in node):
                items = [(clean(key), item) for key, item in node.items()]
                node.clear()
                node.update(items)
            for key, item in node.items():
                if isinstance(item, str):
                    node[key] = clean(item)
                elif isinstance(item, (dict, list)):
                    stack.append((item, depth + 1))
        else:
            for index, item in enumerate(node):
                if isinstance(item, str):
                    node[index] = clean(item)
                elif isinstance(item, (dict, list)):
                    stack.append((item, depth + 1))
    return value, replaced


def _camel(path: str) -> str:
    return re.sub(r"_([a-z])", lambda match: match.group(1).upper(), path)


def _leaf(error: BaseException, type_: Any) -> str:
    if isinstance(error, KeyError):
        return "required field missing"
    if isinstance(error, ValueError) and "should be in range" in str(error):
        return clip(str(error), 120)  # attrs validators of lsprotocol: "Position.line should be in range ..."
    if isinstance(error, TypeError) and str(error).startswith("expected "):
        return str(error)  # strict_scalars
    return cattrs.v.format_exception(error, type_)


def describe_structure_error(error: BaseException) -> str:
    """What a cattrs structuring failure says, with LSP's field names: ``required field missing @
    params.context``; at most three problems."""
    try:
        lines = cattrs.transform_error(error, path="$", format_exception=_leaf)
    except Exception:  # not a cattrs validation error: a hook raised something plain
        lines = [f"{type(error).__name__}: {error}"]
    out = []
    for line in lines:
        message, at, path = line.rpartition(" @ ")
        out.append(f"{clip(message, 160)} @ {_camel(path).replace('$.', '', 1)}" if at else clip(line, 200))
    text = "; ".join(out[:3])
    if len(out) > 3:
        text += f" (and {len(out) - 3} more)"
    return text


def strict_scalars(converter) -> None:
    """cattrs turns ``5`` into ``"5"`` for a str field, ``"7"`` or ``7.9`` into ``7`` for an int and
    ``"false"`` into True: a wrong type must be an error naming the field instead."""

    def check(kind: type | tuple[type, ...], name: str):
        def hook(value: Any, _type):
            if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
                raise TypeError(f"expected {name}, got {type(value).__name__}")
            checked: Any = value  # an int or a float when it is "a number"
            return float(checked) if kind is not bool and name == "a number" else checked

        return hook

    converter.register_structure_hook(str, check(str, "a string"))
    converter.register_structure_hook(int, check(int, "an integer"))
    converter.register_structure_hook(bool, check(bool, "true or false"))
    converter.register_structure_hook(float, check((int, float), "a number"))
