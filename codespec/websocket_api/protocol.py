"""The websocket protocol's messages: parsing and validation as plain functions (docs/protocol.md).

Every way a message can be wrong maps to a ``ProtocolError`` with a stable ``code``; the server
turns it into an ``error`` message and keeps the connection open. An error carries the request's
``id`` whenever it can be read, an oversized message included (its id is looked up without
decoding it). Messages are decoded by the decoder every door shares (``service.jsondecode``):
what it cannot read is ``invalid_json``; a lone surrogate (``"\ud800"`` in JSON) in any string,
which no tokenizer can encode, is an ``invalid_request`` naming where it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

from codespec.service.doors.jsonpeek import FOUND, peek_id
from codespec.service.doors.logsafe import clip
from codespec.service.requests import jsondecode, schema
from codespec.service.requests.positions import LineIndex, PositionError

T = TypeVar("T")


class ProtocolError(Exception):
    def __init__(self, code: str, message: str, request_id: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


@dataclass(frozen=True)
class CompleteMessage:
    id: str | int
    prefix: str
    suffix: str
    path: str | None
    sampling: schema.Sampling  # max_tokens, temperature, top_p, seed, stop, proposer: checked by the service
    prediction: str | None


@dataclass(frozen=True)
class EditMessage:
    id: str | int
    text: str
    instruction: str | None
    prediction: str | None
    sampling: schema.Sampling
    path: str | None
    edits: tuple[tuple[str, str], ...] = ()  # the user's recent edits (next-edit drafting)


@dataclass(frozen=True)
class CancelMessage:
    id: str | int


@dataclass(frozen=True)
class StatsMessage:
    id: str | int | None


Message = CompleteMessage | EditMessage | CancelMessage | StatsMessage


def parse_message(raw: str | bytes, max_bytes: int) -> Message:
    size = len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        state, request_id = peek_id(raw)  # the client learns which request it was
        raise ProtocolError(
            "message_too_large",
            f"message is {size} bytes; the limit is {max_bytes}",
            request_id if state == FOUND else None,
        )
    try:
        data = jsondecode.loads(raw)  # the decoder every door shares: strict UTF-8, bounded numbers
    except jsondecode.JsonInputError as error:
        state, request_id = peek_id(raw)
        raise ProtocolError(
            "invalid_json", f"message is {clip(str(error))}", request_id if state == FOUND else None
        ) from None
    if not isinstance(data, dict):
        raise ProtocolError("invalid_request", 'a message is a JSON object with a "type"')
    request_id = data.get("id")
    kind = data.get("type")
    if request_id is not None and (isinstance(request_id, bool) or not isinstance(request_id, (str, int))):
        raise ProtocolError("invalid_request", "id must be a string or an integer")
    try:
        schema.refuse_lone_surrogates(data, raw)  # in any string: no tokenizer or encoder takes one
    except schema.FieldError as error:
        raise ProtocolError("invalid_request", error.message, request_id) from None
    parsers: dict[str, Callable[[dict], Message]] = {
        "complete": _complete,
        "edit": _edit,
        "cancel": _cancel,
        "stats": _stats,
    }
    if kind not in parsers:
        raise ProtocolError(
            "unknown_type", f"unknown message type {kind!r}; expected one of {', '.join(parsers)}", request_id
        )
    if request_id is None and kind != "stats":
        raise ProtocolError("invalid_request", f"a {kind} message needs an id")
    try:
        return parsers[kind](data)
    except ProtocolError as error:
        error.request_id = request_id
        raise
    except PositionError as error:
        raise ProtocolError("invalid_position", str(error), request_id) from None


@overload
def _text(data: dict, key: str, required: Literal[True]) -> str: ...
@overload
def _text(data: dict, key: str, required: bool = False) -> str | None: ...
def _text(data: dict, key: str, required: bool = False) -> str | None:
    value = data.get(key)
    if value is None:
        if required:
            raise ProtocolError("invalid_request", f"{key} is required (a string)")
        return None
    if not isinstance(value, str):
        raise ProtocolError("invalid_request", f"{key} must be a string")
    return value


def _checked(check: Callable[..., T], *args: Any) -> T:
    """A shared field check (``service.schema``), its error as this door's ``invalid_request``."""
    try:
        return check(*args)
    except schema.FieldError as error:
        raise ProtocolError("invalid_request", error.message) from None


def _sampling(data: dict) -> schema.Sampling:
    """The fields every door shares; an absent ``stop`` leaves the completion mode's own rule."""
    return _checked(schema.sampling, data)


def _split_document(data: dict) -> tuple[str, str]:
    """``document`` + ``position`` (LSP-style, UTF-16) as an alternative to ``prefix``/``suffix``."""
    document = _text(data, "document", required=True)
    position = data.get("position")
    if not isinstance(position, dict):
        raise ProtocolError("invalid_request", "position must be an object {line, character}")
    offset = LineIndex(document).offset(position.get("line"), position.get("character"))  # type: ignore[arg-type]  # checked there
    return document[:offset], document[offset:]


def _complete(data: dict) -> CompleteMessage:
    if "document" in data:
        if "prefix" in data or "suffix" in data:
            raise ProtocolError("invalid_request", "send either prefix/suffix or document/position, not both")
        prefix, suffix = _split_document(data)
    else:
        prefix = _text(data, "prefix", required=True)
        suffix = _text(data, "suffix") or ""
    return CompleteMessage(
        data["id"],
        prefix,
        suffix,
        _text(data, "path"),
        _sampling(data),
        _text(data, "prediction"),
    )


def _edit(data: dict) -> EditMessage:
    if "document" in data:
        document = _text(data, "document", required=True)
        rng = data.get("range")
        if not isinstance(rng, dict) or not isinstance(rng.get("start"), dict) or not isinstance(rng.get("end"), dict):
            raise ProtocolError("invalid_request", "range must be {start: {line, character}, end: {...}}")
        index = LineIndex(document)
        start = index.offset(rng["start"].get("line"), rng["start"].get("character"))
        end = index.offset(rng["end"].get("line"), rng["end"].get("character"))
        if end < start:
            raise ProtocolError("invalid_position", "range end comes before its start")
        text = document[start:end]
    else:
        text = _text(data, "text", required=True)
    return EditMessage(
        data["id"],
        text,
        _text(data, "instruction"),
        _text(data, "prediction"),
        _sampling(data),
        _text(data, "path"),
        _checked(schema.edits, data.get("edits")),
    )


def _cancel(data: dict) -> CancelMessage:
    return CancelMessage(data["id"])


def _stats(data: dict) -> StatsMessage:
    return StatsMessage(data.get("id"))


def error_message(code: str, message: str, request_id: Any = None) -> dict:
    return {"type": "error", "id": request_id, "code": code, "message": message}
