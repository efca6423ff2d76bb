"""The OpenAI-compatible HTTP API's request bodies and response shapes, as plain functions.

Every way a body can be wrong maps to an ``ApiError`` with the HTTP status, OpenAI's error
``type`` and ``code`` and the offending ``param``; ``http_api.server`` turns it into
``{"error": {"message", "type", "param", "code"}}``. Fields the API does not know are ignored
(clients send ``user``, ``metadata`` and the like); fields whose meaning codespec cannot honour
(``n`` > 1, ``echo``, ``logprobs``, penalties, tools, images) are refused with a 400 that says so,
never silently dropped. Documented in docs/http.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from codespec.service.requests import jsondecode, schema

T = TypeVar("T")
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.kind, self.param, self.code)


def error_body(
    message: str, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def invalid(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param, code)


def unsupported(param: str, message: str) -> ApiError:
    return ApiError(400, message, param, "unsupported_parameter")


# ---- parsing --------------------------------------------------------------------------------
@dataclass(frozen=True)
class CallOptions:
    """A call's fields: the ones every door shares (``service.schema.Sampling``) and HTTP's own."""

    sampling: schema.Sampling
    stream: bool
    include_usage: bool
    path: str | None
    model: str | None  # the name the client asked for (the door checks it is served)
    edits: tuple[tuple[str, str], ...] = ()  # extension: the user's recent edits (next-edit drafting)


@dataclass(frozen=True)
class CompletionBody:
    prompt: str
    suffix: str | None  # None: a plain continuation of ``prompt``; a string: fill-in-the-middle
    prediction: str | None
    call: CallOptions


@dataclass(frozen=True)
class ChatBody:
    messages: tuple[dict, ...]  # {"role": str, "content": str} (text parts joined)
    prediction: str | None
    call: CallOptions


def parse_json(raw: bytes) -> dict:
    """The body as a JSON object, decoded by the decoder every door shares (strict UTF-8, finite
    numbers of bounded size); a lone surrogate in any string is a 400 naming where it is."""
    try:
        data = jsondecode.loads(raw)
    except jsondecode.JsonInputError as error:
        raise ApiError(400, f"the request body is {error}", None, "invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", None, "invalid_json")
    _checked(schema.refuse_lone_surrogates, data, raw)
    return data


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _checked(check: Callable[..., T], *args: Any) -> T:
    """A shared field check (``service.schema``), its error in OpenAI's shape."""
    try:
        return check(*args)
    except schema.FieldError as error:
        raise invalid(error.field, error.message, error.code) from None


def _integer(data: dict, key: str) -> int | None:
    return _checked(schema.integer, data.get(key), key)


def _text(data: dict, key: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid(key, f"{key} must be a string, got {type(value).__name__}", "invalid_type")
    return value


def _bool(data: dict, key: str, default: bool = False) -> bool:
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(key, f"{key} must be true or false, got {type(value).__name__}", "invalid_type")
    return value


def _refuse_unsupported(data: dict, chat: bool) -> None:
    n = _integer(data, "n")
    if n is not None and n != 1:
        raise unsupported("n", f"n = {n}: codespec returns one choice per request (n must be 1)")
    if not chat:
        if _bool(data, "echo"):
            raise unsupported("echo", "echo is not supported (it must be false)")
        best_of = _integer(data, "best_of")
        if best_of is not None and best_of != 1:
            raise unsupported("best_of", "best_of is not supported (it must be 1)")
        logprobs = data.get("logprobs")
        if logprobs not in (None, 0, False):
            raise unsupported("logprobs", "logprobs are not supported")
    else:
        if data.get("logprobs") not in (None, False):
            raise unsupported("logprobs", "logprobs are not supported")
        if data.get("top_logprobs") not in (None, 0):
            raise unsupported("top_logprobs", "top_logprobs are not supported")
        for key in ("tools", "functions"):
            if data.get(key):
                raise unsupported(key, f"{key} (tool calling) is not supported")
        response_format = data.get("response_format")
        if response_format is not None and not (
            isinstance(response_format, dict) and response_format.get("type") == "text"
        ):
            raise unsupported("response_format", 'only response_format {"type": "text"} is supported')
        modalities = data.get("modalities")
        if modalities not in (None, ["text"]):
            raise unsupported("modalities", "only text output is supported")
    for key in ("presence_penalty", "frequency_penalty"):
        value = data.get(key)
        if value is not None and (not _is_number(value) or value != 0):
            raise unsupported(key, f"{key} is not supported (it must be 0 or absent)")
    if data.get("logit_bias"):
        raise unsupported("logit_bias", "logit_bias is not supported")


def _call(data: dict, *max_tokens_keys: str) -> CallOptions:
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid("model", "model must be a string", "invalid_type")
    stream = _bool(data, "stream")
    options = data.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise invalid("stream_options", "stream_options must be an object", "invalid_type")
    include_usage = _bool(options, "include_usage") if options else False
    sampling = _checked(schema.sampling, data, *max_tokens_keys)
    # OpenAI's stop: absent means none (no cursor stop rule at this door)
    sampling = dataclasses.replace(sampling, stop=sampling.stop or ())
    edits = _checked(schema.edits, data.get("edits"))
    return CallOptions(sampling, stream, stream and include_usage, _text(data, "path"), model, edits)


def _content_text(value: Any, param: str) -> str:
    """A message content or a prediction's content: a string, or a list of text parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise invalid(param, f"{param} parts must be objects with a type", "invalid_type")
            if part["type"] != "text":
                raise unsupported(param, f"{param}: only text parts are supported, got {part['type']!r}")
            if not isinstance(part.get("text"), str):
                raise invalid(param, f"{param}: a text part needs a string text", "invalid_type")
            texts.append(part["text"])
        return "".join(texts)
    raise invalid(param, f"{param} must be a string or a list of text parts", "invalid_type")


def _prediction(data: dict, allow_string: bool) -> str | None:
    value = data.get("prediction")
    if value is None:
        return None
    if allow_string and isinstance(value, str):
        return value
    if not isinstance(value, dict) or value.get("type") != "content" or "content" not in value:
        raise invalid(
            "prediction", 'prediction must be {"type": "content", "content": string or text parts}', "invalid_type"
        )
    return _content_text(value["content"], "prediction.content")


def parse_completion(data: dict) -> CompletionBody:
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if prompt is None:
        raise invalid("prompt", "prompt is required", "missing_required_parameter")
    if isinstance(prompt, list):
        raise unsupported("prompt", "prompt must be one string (lists of prompts and token arrays are not supported)")
    if not isinstance(prompt, str):
        raise invalid("prompt", "prompt must be a string", "invalid_type")
    _refuse_unsupported(data, chat=False)
    suffix = _text(data, "suffix")
    call = _call(data, "max_tokens")
    if call.sampling.max_tokens is None:
        sampling = dataclasses.replace(call.sampling, max_tokens=COMPLETION_DEFAULT_MAX_TOKENS)
        call = dataclasses.replace(call, sampling=sampling)
    if not prompt and not suffix:
        raise invalid("prompt", "the prompt is empty: give at least one token of context")
    return CompletionBody(prompt, suffix, _prediction(data, allow_string=True), call)


ROLES = ("system", "developer", "user", "assistant", "tool")


def parse_chat(data: dict) -> ChatBody:
    raw = data.get("messages")
    if raw is None:
        raise invalid("messages", "messages is required", "missing_required_parameter")
    if not isinstance(raw, list) or not raw:
        raise invalid("messages", "messages must be a non-empty list", "invalid_type")
    messages = []
    for number, message in enumerate(raw):
        param = f"messages[{number}]"
        if not isinstance(message, dict):
            raise invalid(param, f"{param} must be an object", "invalid_type")
        role = message.get("role")
        if role not in ROLES:
            raise invalid(f"{param}.role", f"{param}.role must be one of {', '.join(ROLES)}")
        content = message.get("content")
        text = "" if content is None and role == "assistant" else _content_text(content, f"{param}.content")
        messages.append({"role": role, "content": text})
    _refuse_unsupported(data, chat=True)
    call = _call(data, "max_completion_tokens", "max_tokens")
    return ChatBody(tuple(messages), _prediction(data, allow_string=False), call)


# ---- rewrite format (a model without a chat template) ---------------------------------------
_FENCE = re.compile(r"^[ \t]*```[^\n`]*\n(.*?)^[ \t]*```[ \t]*$", re.DOTALL | re.MULTILINE)


def rewrite_parts(messages: tuple[dict, ...], prediction: str | None) -> tuple[str, str | None]:
    """(region, instruction) for codespec's rewrite format: the last fenced code block of the last
    user message is the region, the rest of that message the instruction. Without a block, the
    prediction is the region and the whole message the instruction."""
    user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), None)
    if user is None:
        raise invalid("messages", "messages need a user message")
    blocks = list(_FENCE.finditer(user))
    if blocks:
        block = blocks[-1]
        region = block.group(1)
        rest = (user[: block.start()] + user[block.end() :]).strip()
        return region, rest or None
    if prediction is not None:
        return prediction, user.strip() or None
    raise invalid(
        "messages",
        "this model has no chat template: put the code to rewrite in a fenced block "
        "(```) of the last user message, or send it as the prediction",
    )


# ---- responses ------------------------------------------------------------------------------
FINISH_REASONS = {
    "eos": "stop",
    "stop": "stop",
    "repetition": "stop",
    "length": "length",
    "context": "length",
    "deadline": "length",
    "cancelled": "stop",
}


def finish_reason(reason: str) -> str:
    return FINISH_REASONS.get(reason, "stop")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage_body(usage, accepted: int | None = None, rejected: int | None = None) -> dict:
    """OpenAI's usage object from an ``service.jobs.Usage``; ``accepted`` / ``rejected``: the prediction
    tokens as OpenAI counts them (None: no prediction was sent)."""
    body = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_prompt_tokens},
        "completion_tokens_details": {
            "accepted_prediction_tokens": accepted or 0,
            "rejected_prediction_tokens": rejected or 0,
            "reasoning_tokens": 0,
        },
    }
    return body


@dataclass
class Envelope:
    """What every response and chunk of one request shares."""

    id: str
    model: str
    object: str  # "text_completion" | "chat.completion"
    created: int = field(default_factory=lambda: int(time.time()))

    def chunk_object(self) -> str:
        return "text_completion" if self.object == "text_completion" else "chat.completion.chunk"

    def head(self, chunk: bool = False) -> dict:
        return {
            "id": self.id,
            "object": self.chunk_object() if chunk else self.object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "codespec",
        }


def completion_response(envelope: Envelope, text: str, reason: str, usage: dict, extra: dict) -> dict:
    return {
        **envelope.head(),
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason(reason)}],
        "usage": usage,
        "codespec": extra,
    }


def chat_response(envelope: Envelope, text: str, reason: str, usage: dict, extra: dict) -> dict:
    return {
        **envelope.head(),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": finish_reason(reason),
            }
        ],
        "usage": usage,
        "codespec": extra,
    }


def text_chunk(envelope: Envelope, text: str, reason: str | None = None, first: bool = False) -> dict:
    """One streamed chunk with ``text`` (and the finish reason on the last one)."""
    finish = finish_reason(reason) if reason is not None else None
    if envelope.object == "text_completion":
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}
    else:
        delta: dict = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {**envelope.head(chunk=True), "choices": [choice], "usage": None}


def usage_chunk(envelope: Envelope, usage: dict, extra: dict) -> dict:
    return {**envelope.head(chunk=True), "choices": [], "usage": usage, "codespec": extra}


def sse(data: dict | str) -> bytes:
    payload = data if isinstance(data, str) else json_text(data)
    return f"data: {payload}\n\n".encode()


def json_text(body: Any) -> str:
    """The one JSON spelling of every body and event this door sends (Starlette's: compact)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


ALIAS = "codespec"  # a name every server answers to, whatever model it loaded


def models_response(target: str, draft: str | None, created: int) -> dict:
    """The target, the draft model if there is one (it only drafts), and the ``codespec`` alias."""
    roles = [
        (target, "target"),
        *([(draft, "draft")] if draft else []),
        *([(ALIAS, "alias")] if target != ALIAS else []),
    ]
    models = [
        {"id": name, "object": "model", "created": created, "owned_by": "codespec", "codespec": {"role": role}}
        for name, role in roles
    ]
    return {"object": "list", "data": models}
