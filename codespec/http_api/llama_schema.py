"""llama.cpp server's completion API (``/infill``, ``/completion``, ``/tokenize``): request bodies
and response shapes, as plain functions (``http_api.llama_server`` routes to them).

The fields are llama-server's (tools/server/README.md), as llama.vim and llama.vscode send them.
Every way a body can be wrong is an ``ApiError`` naming the field (400). Fields llama-server ignores
or that cannot change a greedy completion are accepted; a field whose meaning codespec cannot honour
(penalties, grammars, other samplers, LoRA, several completions under sampling) is refused with a
400 naming it, never silently dropped. docs/http.md "llama.cpp server API" says which is which.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from codespec.http_api.schema import invalid, unsupported
from codespec.service.requests import schema

T = TypeVar("T")

# Samplers that cannot move a greedy argmax (top_k, top_p, min_p keep the likeliest token; temperature
# applies only when asked for); ``infill`` is accepted as a no-op (see docs/http.md).
KNOWN_SAMPLERS = ("top_k", "top_p", "min_p", "temperature", "infill")
MAX_EXTRA_CHUNKS = 64  # llama.vim keeps 16 (ring_n_chunks); the body limit bounds their size
MAX_COMPLETIONS = 8  # n_cmpl: identical copies under greedy decoding


@dataclass(frozen=True)
class ExtraChunk:
    """One ``input_extra`` item: a piece of a file the user worked in."""

    filename: str
    text: str


@dataclass(frozen=True)
class LlamaCall:
    """What /infill and /completion share: the budget, the sampling, the stop rules, the shape."""

    sampling: schema.Sampling
    n_predict: int  # -1: until the end of the completion (codespec's cursor rule or the context); 0: no generation
    n_indent: int  # 0: off; else a line indented less ends the completion
    t_max_predict_ms: float  # 0: off; else the completion ends at the first newline after this long
    stream: bool
    cache_prompt: bool
    completions: int  # n_cmpl
    response_fields: tuple[str, ...]
    settings: dict  # generation_settings as the response reports them


@dataclass(frozen=True)
class InfillBody:
    prefix: str  # input_prefix
    suffix: str  # input_suffix
    middle: str  # prompt: the text already typed after input_prefix (after FIM_MID in llama-server)
    extra: tuple[ExtraChunk, ...]
    call: LlamaCall


@dataclass(frozen=True)
class CompletionBody:
    prompt: str
    call: LlamaCall


@dataclass(frozen=True)
class TokenizeBody:
    content: str
    add_special: bool
    parse_special: bool
    with_pieces: bool


def _checked(check: Callable[..., T], *args: Any) -> T:
    try:
        return check(*args)
    except schema.FieldError as error:
        raise invalid(error.field, error.message, error.code) from None


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _number(data: dict, key: str, default: float, low: float = 0.0) -> float:
    value = data.get(key)
    if value is None:
        return default
    if not _is_number(value):
        raise invalid(key, f"{key} must be a number, got {type(value).__name__}", "invalid_type")
    if value < low:
        raise invalid(key, f"{key} must be >= {low:g}, got {value}")
    return float(value)


def _integer(data: dict, key: str, default: int, low: int) -> int:
    value = _checked(schema.integer, data.get(key), key)
    if value is None:
        return default
    if value < low:
        raise invalid(key, f"{key} must be >= {low}, got {value}")
    return value


def _text(data: dict, key: str, default: str = "") -> str:
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise invalid(key, f"{key} must be a string, got {type(value).__name__}", "invalid_type")
    return _checked(schema.check_unicode, key, value)


def _bool(data: dict, key: str, default: bool) -> bool:
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(key, f"{key} must be true or false, got {type(value).__name__}", "invalid_type")
    return value


def _strings(data: dict, key: str) -> tuple[str, ...] | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise invalid(key, f"{key} must be a list of strings", "invalid_type")
    return tuple(value)


# field -> the value that leaves it off (anything else is refused: codespec does not implement it)
_OFF_VALUES: dict[str, tuple[Any, ...]] = {
    "typical_p": (1, 1.0),
    "repeat_penalty": (1, 1.0),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "dry_multiplier": (0, 0.0),
    "xtc_probability": (0, 0.0),
    "dynatemp_range": (0, 0.0),
    "mirostat": (0,),
    "n_probs": (0,),
    "grammar": ("",),
    "json_schema": ({},),
    "ignore_eos": (False,),
    "logit_bias": ([], {}),
    "lora": ([],),
    "return_tokens": (False,),
    "post_sampling_probs": (False,),
    "return_progress": (False,),
    "image_data": ([],),
    "multimodal_data": ([],),
}


def _refuse_unsupported(data: dict) -> None:
    for key, off in _OFF_VALUES.items():
        value = data.get(key)
        if value is not None and value not in off:
            raise unsupported(key, f"{key} is not supported by codespec (leave it out or send {off[0]!r})")


def parse_call(data: dict, default_stream: bool = False) -> LlamaCall:
    """The fields /infill and /completion share."""
    _refuse_unsupported(data)
    samplers = _strings(data, "samplers")
    if samplers is not None:
        for name in samplers:
            if name not in KNOWN_SAMPLERS:
                raise unsupported(
                    "samplers",
                    f"sampler {name!r} is not supported by codespec (supported: {', '.join(KNOWN_SAMPLERS)})",
                )
    temperature = _checked(schema.temperature, data.get("temperature"))
    # llama-server applies only the samplers listed: without "temperature" in the list there is no
    # temperature sampler; codespec then decodes greedily (docs/http.md says why).
    if samplers is not None and "temperature" not in samplers:
        temperature = 0.0
    top_p = _checked(schema.top_p, data.get("top_p"))
    top_k = _integer(data, "top_k", 0, 0)
    min_p = _number(data, "min_p", 0.0)
    sampled = temperature > 0
    if samplers is not None and "top_k" not in samplers:
        top_k = 0
    if sampled and min_p > 0 and (samplers is None or "min_p" in samplers):
        raise unsupported("min_p", "min_p sampling is not supported: send min_p 0, or decode greedily (temperature 0)")
    if samplers is not None and "top_p" not in samplers:
        top_p = 1.0
    seed = _checked(schema.integer, data.get("seed"), "seed")
    n_predict = _integer(data, "n_predict", -1, -1)
    if n_predict > schema.LIMITS.max_tokens:
        raise invalid("n_predict", f"n_predict must be at most {schema.LIMITS.max_tokens}, got {n_predict}")
    stop = _checked(schema.stop, data.get("stop")) if data.get("stop") not in (None, []) else None
    completions = _integer(data, "n_cmpl", 1, 1)
    if completions > 1 and sampled:
        raise unsupported("n_cmpl", "n_cmpl > 1 needs sampling, which codespec does one completion at a time: send 1")
    if completions > MAX_COMPLETIONS:
        raise invalid("n_cmpl", f"n_cmpl must be at most {MAX_COMPLETIONS}, got {completions}")
    _number(data, "t_max_prompt_ms", 0.0)  # checked, not applied (llama-server does not apply it either)
    _integer(data, "id_slot", -1, -1)  # one engine, no slots: accepted
    _bool(data, "timings_per_token", False)
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid("model", "model must be a string", "invalid_type")
    response_fields = _strings(data, "response_fields") or ()
    sampling = schema.Sampling(
        max_tokens=n_predict if n_predict > 0 else None,
        temperature=temperature,
        top_p=top_p,
        seed=None if seed is None or seed < 0 else seed,
        stop=stop,
        top_k=top_k,
    )
    call = LlamaCall(
        sampling=sampling,
        n_predict=n_predict,
        n_indent=_integer(data, "n_indent", 0, 0),
        t_max_predict_ms=_number(data, "t_max_predict_ms", 0.0),
        stream=_bool(data, "stream", default_stream),
        cache_prompt=_bool(data, "cache_prompt", True),
        completions=completions,
        response_fields=response_fields,
        settings={},
    )
    settings = {
        "n_predict": n_predict,
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "min_p": min_p,
        "seed": sampling.seed if sampling.seed is not None else -1,
        "stop": list(stop or ()),
        "n_indent": call.n_indent,
        "t_max_predict_ms": call.t_max_predict_ms,
        "samplers": list(samplers) if samplers is not None else list(KNOWN_SAMPLERS),
        "stream": call.stream,
        "cache_prompt": call.cache_prompt,
        "n_cmpl": completions,
    }
    return dataclasses.replace(call, settings=settings)


def parse_extra(value: Any) -> tuple[ExtraChunk, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise invalid("input_extra", "input_extra must be a list of {filename, text} objects", "invalid_type")
    if len(value) > MAX_EXTRA_CHUNKS:
        raise invalid("input_extra", f"input_extra may hold at most {MAX_EXTRA_CHUNKS} chunks, got {len(value)}")
    chunks = []
    for number, item in enumerate(value):
        param = f"input_extra[{number}]"
        if not isinstance(item, dict):
            raise invalid(param, f"{param} must be an object with filename and text", "invalid_type")
        text, filename = item.get("text"), item.get("filename", "")
        if not isinstance(text, str) or not isinstance(filename, str):
            raise invalid(param, f"{param} needs a string text (and a string filename)", "invalid_type")
        chunks.append(
            ExtraChunk(_checked(schema.check_unicode, param, filename), _checked(schema.check_unicode, param, text))
        )
    return tuple(chunks)


def parse_infill(data: dict) -> InfillBody:
    prompt = data.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise unsupported("prompt", "prompt must be a string here (token arrays are not supported)")
    return InfillBody(
        _text(data, "input_prefix"),
        _text(data, "input_suffix"),
        _text(data, "prompt"),
        parse_extra(data.get("input_extra")),
        parse_call(data),
    )


def parse_completion(data: dict) -> CompletionBody:
    prompt = data.get("prompt")
    if prompt is None:
        raise invalid("prompt", "prompt is required", "missing_required_parameter")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise unsupported(
            "prompt", "prompt must be one string (token arrays, several prompts and media are not supported)"
        )
    call = parse_call(data)
    if not prompt and call.n_predict != 0:
        raise invalid("prompt", "the prompt is empty: give at least one token of context")
    return CompletionBody(_checked(schema.check_unicode, "prompt", prompt), call)


def parse_tokenize(data: dict) -> TokenizeBody:
    content = data.get("content")
    if content is None:
        raise invalid("content", "content is required", "missing_required_parameter")
    if not isinstance(content, str):
        raise invalid("content", "content must be a string", "invalid_type")
    return TokenizeBody(
        _checked(schema.check_unicode, "content", content),
        _bool(data, "add_special", False),
        _bool(data, "parse_special", True),
        _bool(data, "with_pieces", False),
    )


def parse_detokenize(data: dict) -> list[int]:
    tokens = data.get("tokens")
    if tokens is None:
        raise invalid("tokens", "tokens is required", "missing_required_parameter")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise invalid("tokens", "tokens must be a list of token ids", "invalid_type")
    return tokens


# ---- responses ------------------------------------------------------------------------------
STOP_TYPES = {"eos": "eos", "stop": "word", "repetition": "limit", "length": "limit", "context": "limit"}


def stop_type(reason: str) -> str:
    """llama-server's ``stop_type`` for codespec's finish reason (a cut by n_indent or the time
    limit is ``limit``, as there)."""
    return STOP_TYPES.get(reason, "limit")


@dataclass(frozen=True)
class Timings:
    """A completion's counts and times, as llama-server's ``timings`` reports them."""

    prompt_n: int  # prompt tokens computed (the cached ones are not)
    prompt_ms: float  # until the first token
    predicted_n: int
    predicted_ms: float  # from the first token to the end

    def body(self) -> dict:
        return {
            "prompt_n": self.prompt_n,
            "prompt_ms": round(self.prompt_ms, 3),
            "prompt_per_token_ms": round(self.prompt_ms / self.prompt_n, 3) if self.prompt_n else 0.0,
            "prompt_per_second": round(1e3 * self.prompt_n / self.prompt_ms, 3) if self.prompt_ms > 0 else 0.0,
            "predicted_n": self.predicted_n,
            "predicted_ms": round(self.predicted_ms, 3),
            "predicted_per_token_ms": round(self.predicted_ms / self.predicted_n, 3) if self.predicted_n else 0.0,
            "predicted_per_second": (
                round(1e3 * self.predicted_n / self.predicted_ms, 3) if self.predicted_ms > 0 else 0.0
            ),
        }


def select_fields(body: dict, paths: tuple[str, ...]) -> dict:
    """llama-server's ``response_fields``: only these, each under its own path as the key
    (``timings/prompt_n`` moves ``timings.prompt_n`` to the top); a path that is not there is left
    out. No paths: the whole body."""
    if not paths:
        return body
    picked = {}
    for path in paths:
        value: Any = body
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            picked[path] = value
    return picked


def props_body(model: str, n_ctx: int, slots: int, busy: bool, version: str) -> dict:
    return {
        "default_generation_settings": {
            "id": 0,
            "id_task": -1,
            "n_ctx": n_ctx,
            "speculative": True,
            "is_processing": busy,
            "params": {
                "n_predict": -1,
                "temperature": 0.0,
                "top_k": 0,
                "top_p": 1.0,
                "min_p": 0.0,
                "stop": [],
                "n_indent": 0,
                "samplers": list(KNOWN_SAMPLERS),
                "stream": False,
            },
        },
        "total_slots": slots,
        "model_path": model,
        "model_alias": model,
        "chat_template": "",
        "modalities": {"vision": False, "audio": False},
        "build_info": f"codespec {version}",
        "is_sleeping": False,
    }
