"""Ollama's API (``/api/generate``, ``/api/chat``, ...) as codespec reads it: request bodies checked
into typed values, the served model's Ollama names, and the response objects (docs/http.md, "Ollama's
API").

Every way a body can be wrong is an :class:`OllamaError` (a status and a message), which
``http_api.ollama`` sends as Ollama's ``{"error": "..."}``. Fields Ollama's clients send that do not
change what a model writes (``keep_alive``, ``num_ctx``, ``num_thread``, ...) are accepted; fields
whose meaning codespec cannot honour (``format``, ``images``, ``template``, tools, thinking,
logprobs, repeat penalties, top-k sampling) are refused with a 400 that names them, never dropped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from codespec.service.requests import schema
from codespec.service.requests.schema import Sampling

OLLAMA_API_VERSION = "0.33.0"  # the Ollama release whose docs/api.md this door follows
CODESPEC_TAG = "codespec"  # the tag of the names a family-named client maps to the right FIM format
ROLES = ("system", "user", "assistant", "tool")
# Sampling options codespec does not implement, each with the value that leaves the output as it is.
NEUTRAL_OPTIONS: dict[str, float] = {
    "repeat_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "mirostat": 0.0,
    "tfs_z": 1.0,
    "typical_p": 1.0,
    "min_p": 0.0,
}
_DURATION = re.compile(r"-?(?:\d+(?:\.\d*)?(?:ns|us|µs|ms|s|m|h))+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?)(ns|us|µs|ms|s|m|h)")


class OllamaError(Exception):
    """A request Ollama's API refuses: ``status`` and the message of ``{"error": message}``."""

    def __init__(self, status: int, message: str, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def bad(message: str) -> OllamaError:
    return OllamaError(400, message)


# ---- fields ------------------------------------------------------------------------------------
def _text(data: Mapping, key: str, required: bool = False) -> str:
    value = data.get(key)
    if value is None:
        if required:
            raise bad(f"{key} is required")
        return ""
    if not isinstance(value, str):
        raise bad(f"{key} must be a string, got {type(value).__name__}")
    try:
        return schema.check_unicode(key, value)
    except schema.FieldError as error:
        raise bad(error.message) from None


def _bool(data: Mapping, key: str, default: bool) -> bool:
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(f"{key} must be true or false, got {type(value).__name__}")
    return value


def _refuse_set(data: Mapping, *keys: str) -> None:
    """Fields codespec cannot honour: refused when set to anything but an empty or off value."""
    reasons = {
        "format": "structured output (format) is not supported; leave it out or send an empty string",
        "images": "images are not supported: codespec serves text models",
        "template": "a custom template is not supported; send raw: true with the prompt already rendered",
        "context": "context (deprecated in Ollama) is not supported; send the earlier text in prompt, or use /api/chat",
        "think": "thinking is not supported; leave think out or send false",
        "logprobs": "logprobs are not supported",
        "top_logprobs": "top_logprobs are not supported",
        "tools": "tools (tool calling) are not supported",
        "width": "image generation (width) is not supported",
        "height": "image generation (height) is not supported",
        "steps": "image generation (steps) is not supported",
    }
    for key in keys:
        if data.get(key) not in (None, False, "", [], {}, 0):
            raise bad(f"{key}: {reasons[key]}")


_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_is_zero(value: Any) -> bool:
    """Whether ``keep_alive`` (seconds, or a Go duration such as ``"5m"``) asks to unload now;
    anything else is a 400."""
    if value is None:
        return False
    wrong = bad(f'keep_alive must be a duration ("5m", "1h") or a number of seconds, got {value!r}')
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise wrong
    if isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            if not _DURATION.fullmatch(text):
                raise wrong from None
            seconds = sum(float(number) * _UNIT_S[unit] for number, unit in _DURATION_PART.findall(text))
    else:
        seconds = float(value)
    if not math.isfinite(seconds):
        raise wrong
    return seconds == 0


@dataclass(frozen=True)
class Options:
    """A request's ``options``, checked: what codespec decodes with, and ``num_ctx`` (validated only)."""

    sampling: Sampling = Sampling(stop=())
    num_ctx: int | None = None


def _option_error(error: schema.FieldError) -> OllamaError:
    return bad(f"options.{error.field}: {error.message}")


def parse_options(value: Any) -> Options:
    """Ollama's ``options`` object. ``num_predict`` -1 (no limit) and -2 (fill the context) mean the
    request's own budget; unset ``temperature`` is 0 (greedy), codespec's default, not Ollama's 0.8.
    Unknown keys are ignored, as Ollama ignores them."""
    if value is None:
        return Options()
    if not isinstance(value, dict):
        raise bad(f"options must be an object, got {type(value).__name__}")
    try:
        budget = schema.integer(value.get("num_predict"), "num_predict")
        if budget is not None and budget in (-1, -2):
            budget = None
        elif budget is not None and budget < 1:
            raise schema.FieldError(
                "num_predict", f"num_predict must be at least 1, or -1 (no limit), -2 (fill the context); got {budget}"
            )
        budget = schema.max_tokens(budget, "num_predict")
        temperature = schema.temperature(value.get("temperature"))
        top_k = schema.top_k(value.get("top_k"))
        num_ctx = schema.integer(value.get("num_ctx"), "num_ctx")
        if num_ctx is not None and num_ctx < 1:
            raise schema.FieldError("num_ctx", f"num_ctx must be at least 1, got {num_ctx}")
        sampling = Sampling(
            max_tokens=budget,
            temperature=temperature,
            top_p=schema.top_p(value.get("top_p")),
            seed=schema.seed(value.get("seed")),
            stop=schema.stop(value.get("stop")),  # absent: none (the format's end markers and EOS aside)
            top_k=top_k,
        )
    except schema.FieldError as error:
        raise _option_error(error) from None
    for key, neutral in NEUTRAL_OPTIONS.items():
        given = value.get(key)
        if given is None:
            continue
        if isinstance(given, bool) or not isinstance(given, (int, float)) or not math.isfinite(given):
            raise bad(f"options.{key} must be a number, got {type(given).__name__}")
        if given != neutral:
            raise bad(
                f"options.{key} = {given!r} is not supported (codespec samples with temperature, top_p and seed): "
                f"send {neutral:g} or leave it out"
            )
    return Options(sampling, num_ctx)


def _proposer(data: Mapping) -> str | None:
    """codespec's extension: which proposer drafts (``service.schema.proposer``)."""
    try:
        return schema.proposer(data.get("proposer"))
    except schema.FieldError as error:
        raise bad(error.message) from None


# ---- bodies ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GenerateBody:
    model: str
    prompt: str  # "" with no suffix: a load request (nothing is generated)
    suffix: str  # "": none; otherwise fill-in-the-middle between prompt and suffix
    system: str
    raw: bool  # the prompt is sent as it is (no chat template)
    stream: bool
    options: Options
    unload: bool  # keep_alive 0


@dataclass(frozen=True)
class ChatBody:
    model: str
    messages: tuple[dict, ...]  # {"role", "content"}; empty: a load request
    stream: bool
    options: Options
    unload: bool


def _sampling_with_proposer(options: Options, data: Mapping) -> Options:
    proposer = _proposer(data)
    if proposer is None:
        return options
    return dataclasses.replace(options, sampling=dataclasses.replace(options.sampling, proposer=proposer))


def parse_generate(data: dict) -> GenerateBody:
    model = _text(data, "model", required=True)
    _refuse_set(data, "format", "images", "template", "context", "think", "logprobs", "top_logprobs")
    _refuse_set(data, "width", "height", "steps")
    prompt, suffix, system = _text(data, "prompt"), _text(data, "suffix"), _text(data, "system")
    raw = _bool(data, "raw", False)
    if raw and system:
        raise bad("raw mode does not support system: put it in the prompt, which is sent as it is")
    if raw and suffix:
        raise bad("raw mode sends the prompt as it is, so suffix cannot be placed: send raw false with a suffix")
    if suffix and system:
        raise bad("system is not used with suffix (fill-in-the-middle has no system message)")
    options = _sampling_with_proposer(parse_options(data.get("options")), data)
    return GenerateBody(
        model,
        prompt,
        suffix,
        system,
        raw,
        _bool(data, "stream", True),
        options,
        keep_alive_is_zero(data.get("keep_alive")),
    )


def parse_chat(data: dict) -> ChatBody:
    model = _text(data, "model", required=True)
    _refuse_set(data, "format", "tools", "think", "logprobs", "top_logprobs")
    raw = data.get("messages")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise bad(f"messages must be a list, got {type(raw).__name__}")
    messages = []
    for number, message in enumerate(raw):
        where = f"messages[{number}]"
        if not isinstance(message, dict):
            raise bad(f"{where} must be an object")
        role = message.get("role")
        if role not in ROLES:
            raise bad(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}")
        if message.get("images"):
            raise bad(f"{where}.images: images are not supported: codespec serves text models")
        if message.get("tool_calls"):
            raise bad(f"{where}.tool_calls: tool calling is not supported")
        messages.append({"role": role, "content": _text(message, "content") if "content" in message else ""})
    options = _sampling_with_proposer(parse_options(data.get("options")), data)
    return ChatBody(
        model, tuple(messages), _bool(data, "stream", True), options, keep_alive_is_zero(data.get("keep_alive"))
    )


def show_name(data: dict) -> str:
    """``/api/show``'s model: ``model``, or ``name`` as older clients (Continue) send it."""
    if data.get("model") is None and data.get("name") is None:
        raise bad("model is required")
    return _text(data, "model" if data.get("model") is not None else "name", required=True)


# ---- names -------------------------------------------------------------------------------------
def tagged(name: str) -> str:
    """Ollama's full spelling of a name: ``:latest`` when it has no tag."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


@dataclass(frozen=True)
class OllamaNames:
    """The names the served model answers to: ``listed`` (what ``/api/tags`` shows, first the one
    ``--model ollama:NAME`` gave) and the other spellings a request may use (the target's own name,
    ``codespec``, each with or without ``:latest``)."""

    listed: tuple[str, ...]
    accepted: frozenset[str]
    any_model: bool = False
    draft: str | None = None

    @classmethod
    def of(
        cls, model_id: str, served: tuple[str, ...], fim_family: str | None, any_model: bool, draft: str | None
    ) -> OllamaNames:
        listed = []
        if model_id.startswith("ollama:") and len(model_id) > len("ollama:"):
            listed.append(tagged(model_id[len("ollama:") :]))
        listed.append(tagged(CODESPEC_TAG))
        if fim_family is not None:
            # Clients that pick a FIM spelling from the name (Zed's Ollama provider) find the family here
            listed.append(f"{fim_family}:{CODESPEC_TAG}")
        spellings = {*listed, *served}
        accepted = {*spellings, *(tagged(name) for name in spellings)}
        accepted |= {name.removesuffix(":latest") for name in accepted}
        return cls(tuple(dict.fromkeys(listed)), frozenset(accepted), any_model, draft)

    def check(self, name: str) -> str:
        """``name`` if it is served here; otherwise Ollama's 404 ``model 'NAME' not found``."""
        if self.any_model or name in self.accepted:
            return name
        why = "; that is the draft model, which only drafts" if name == self.draft else ""
        raise OllamaError(
            404,
            f"model '{name}' not found (served here: {', '.join(self.listed)}{why}; "
            "start the server with --http-any-model to serve every name with the loaded model)",
        )


# ---- responses ---------------------------------------------------------------------------------
def timestamp(at: datetime | None = None) -> str:
    """RFC 3339 in UTC with microseconds, as Ollama writes ``created_at``."""
    return (at or datetime.now(UTC)).isoformat(timespec="microseconds").replace("+00:00", "Z")


FAR_FUTURE = "2318-01-01T00:00:00Z"  # expires_at of a model kept while the server runs (Ollama's keep_alive -1)


@dataclass(frozen=True)
class ModelFacts:
    """What ``/api/tags``, ``/api/show`` and ``/api/ps`` say about the loaded target."""

    name: str
    family: str
    parameter_count: int
    size_bytes: int
    quantization: str
    file_format: str  # "gguf" or "safetensors"
    context_length: int
    template: str  # Go-template spelling of the prompt layout (``.Suffix``: FIM is supported)
    end_markers: tuple[str, ...]
    fim: bool
    modified_at: str
    on_gpu: bool

    @classmethod
    def of(cls, target: Any, modified: datetime) -> ModelFacts:
        config = getattr(getattr(target, "model", None), "config", None)
        prompt_format = target.prompt_format
        family = str(getattr(config, "model_type", "") or prompt_format.name)
        count = int(getattr(target, "parameter_count", 0) or 0)
        path = getattr(target, "path", None)
        dtype = getattr(target, "dtype", None)
        if path is not None and Path(path).is_file():
            file_format, size, quantization = "gguf", Path(path).stat().st_size, "GGUF"
        else:
            itemsize = getattr(dtype, "itemsize", 4)
            file_format, size = "safetensors", count * itemsize
            quantization = str(dtype).removeprefix("torch.").replace("bfloat", "BF").replace("float", "F").upper()
        fim = prompt_format.fim_tokens is not None
        if fim:
            hole = prompt_format.fim("{{ .Prompt }}", "{{ .Suffix }}")
            template = f"{{{{- if .Suffix }}}}{hole}{{{{- else }}}}{{{{ .Prompt }}}}{{{{- end }}}}"
        else:
            template = "{{ .Prompt }}"
        device = getattr(target, "device", None)
        return cls(
            name=str(target.name),
            family=family,
            parameter_count=count,
            size_bytes=int(size),
            quantization=quantization or "unknown",
            file_format=file_format,
            context_length=int(target.max_context),
            template=template,
            end_markers=tuple(prompt_format.end_markers),
            fim=fim,
            modified_at=timestamp(modified),
            on_gpu=getattr(device, "type", "cpu") != "cpu",
        )

    @property
    def digest(self) -> str:
        """A stable identifier of the loaded model (not Ollama's manifest digest)."""
        return hashlib.sha256(f"{self.name}\0{self.size_bytes}\0{self.parameter_count}".encode()).hexdigest()

    def details(self) -> dict:
        return {
            "parent_model": "",
            "format": self.file_format,
            "family": self.family,
            "families": [self.family],
            "parameter_size": parameter_size(self.parameter_count),
            "quantization_level": self.quantization,
        }

    def parameters(self) -> str:
        """Modelfile ``PARAMETER`` lines as Ollama prints them (Continue reads ``num_ctx`` and ``stop``)."""
        lines = [f"{'num_ctx':<30} {self.context_length}"]
        lines += [f'{"stop":<30} "{marker}"' for marker in self.end_markers]
        return "\n".join(lines)

    def capabilities(self) -> list[str]:
        return ["completion", *(["insert"] if self.fim else [])]


def parameter_size(count: int) -> str:
    """Ollama's spelling of a parameter count: ``7.6B``, ``494.0M``."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f}{unit}"
    return str(count)


def tags_response(names: OllamaNames, facts: ModelFacts) -> dict:
    entry = {"modified_at": facts.modified_at, "size": facts.size_bytes, "digest": facts.digest}
    return {"models": [{"name": name, "model": name, **entry, "details": facts.details()} for name in names.listed]}


def show_response(facts: ModelFacts) -> dict:
    modelfile = "\n".join(
        [
            "# Modelfile generated by codespec (the model it serves)",
            f"FROM {facts.name}",
            f'TEMPLATE """{facts.template}"""',
            *(f"PARAMETER {line}" for line in facts.parameters().splitlines()),
        ]
    )
    return {
        "license": "",
        "modelfile": modelfile,
        "parameters": facts.parameters(),
        "template": facts.template,
        "details": facts.details(),
        "model_info": {
            "general.architecture": facts.family,
            "general.parameter_count": facts.parameter_count,
            f"{facts.family}.context_length": facts.context_length,
        },
        "capabilities": facts.capabilities(),
        "modified_at": facts.modified_at,
    }


def ps_response(names: OllamaNames, facts: ModelFacts) -> dict:
    name = names.listed[0]
    return {
        "models": [
            {
                "name": name,
                "model": name,
                "size": facts.size_bytes,
                "digest": facts.digest,
                "details": facts.details(),
                "expires_at": FAR_FUTURE,
                "size_vram": facts.size_bytes if facts.on_gpu else 0,
                "context_length": facts.context_length,
            }
        ]
    }
