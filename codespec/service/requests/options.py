"""Typed server options: command-line defaults, overridden by the client's initializationOptions.

A bad value never stops the server: it falls back to the default and produces one message for the
user (shown with window/showMessage), as jedi-language-server does. Client keys are camelCase and
may be nested (``{"limits": {"maxTokens": 64}}``); each maps to one field here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from codespec.core.config import SERVE_MAX_DRAFT
from codespec.core.prompts import FORMAT_NAMES
from codespec.index.discovery import DEFAULT_EXCLUDE

DEFAULT_MAX_BATCH = 8  # requests decoding at once; more wait for a place, in order (service.engine)
DEFAULT_MAX_CACHED_TOKENS = 65_536  # KV positions the requests in the batch may hold together


@dataclass(frozen=True)
class EngineOptions:
    """Which model is loaded and how it decodes: one engine service per process serves them all."""

    model: str | None = None  # None: the shipped default model
    draft: str | None = None  # a draft model sharing the target's tokenizer (proposer "draft")
    device: str = "auto"
    dtype: str = "auto"
    prompt_format: str = "auto"  # auto (from the tokenizer's special tokens) or a codespec.prompts.FORMATS name
    threads: int | None = None  # CPU threads for torch; None: half the cores (at most 8), see start_service
    proposer: str = "auto"  # falls back to "context" when not installed
    max_draft: int = SERVE_MAX_DRAFT  # K
    cached_documents: int = 8  # KV caches kept for prompt caching (one per document)
    max_batch: int = DEFAULT_MAX_BATCH  # requests decoding at once, one forward for all each cycle
    max_cached_tokens: int = DEFAULT_MAX_CACHED_TOKENS  # KV positions the batch's requests hold together
    # a served engine generates instead (its OpenAI-compatible URL; service.engine.served); ``model`` then
    # names only the tokenizer, which must be the engine's
    engine_url: str | None = None
    engine_model: str | None = None  # the engine's model name (None: the first it serves)


@dataclass(frozen=True)
class CompletionOptions:
    """How an editor's completion or edit becomes a request."""

    line_tokens: int = 48  # single-line completion budget
    block_tokens: int = 160  # multi-line completion budget
    edit_tokens: int = 1024  # rewrite budget (on top of the original's length)
    deadline_ms: int = 4000  # a completion nobody waits for any more is not worth finishing
    prefix_chars: int | None = None  # prompt window before the cursor (None: by device, see inline.default_windows)
    suffix_chars: int | None = None  # after the cursor (FIM puts it after the prefix: every keystroke re-prefills it)
    mode: str = "auto"  # "auto" (by the cursor's line), "line" (single-line only), "block"
    completion_fallback: bool = True  # answer textDocument/completion with the same completion
    next_edit_format: str = "auto"  # next-edit prompts: "zeta", "rewrite", or "auto" (zeta for a Zeta model)
    next_edit_tokens: int = 64  # next-edit budget on top of the editable window's length (a small change)
    next_edit_speculate: bool = True  # after answering, ask what accepting the answer will ask next


@dataclass(frozen=True)
class IndexOptions:
    """The workspace index: where it lives, what it reads, how much it keeps."""

    enabled: bool = True
    path: str | None = None  # None: <first workspace folder>/.codespec/index.db
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    max_file_bytes: int = 1_000_000
    # Resident tokens the index keeps before evicting the least recently used documents (about 26
    # bytes each, docs/index.md: 32 M tokens is ~0.8 GB, roughly 100 MB of source).
    max_tokens: int = 32_000_000
    # Open documents over this many bytes are served without the index (tokenizing one whole holds
    # the engine ~1 s per MB and the tokenizer's buffers ~250 MB per MB); as index.maxFileBytes.
    max_document_bytes: int = 1_000_000
    debounce_ms: int = 150  # per-document delay before an edit reaches the index


@dataclass(frozen=True)
class TransportOptions:
    """The LSP transport's own limit (the websocket and HTTP doors' are ``WsLimits`` and ``HttpLimits``)."""

    max_message_bytes: int = 64 << 20  # a larger LSP message is refused and skipped (lsp.framing)


@dataclass(frozen=True)
class ServerOptions:
    """Everything `codespec serve` and an editor's initializationOptions configure, by concern."""

    engine: EngineOptions = field(default_factory=EngineOptions)
    completion: CompletionOptions = field(default_factory=CompletionOptions)
    index: IndexOptions = field(default_factory=IndexOptions)
    transport: TransportOptions = field(default_factory=TransportOptions)

    def replace(self, **changes: Any) -> ServerOptions:
        """A copy with ``group_field=value`` changes (``engine_model="/m"``, ``index_max_tokens=...``)."""
        groups: dict[str, dict[str, Any]] = {}
        for name, value in changes.items():
            group, _, attribute = name.partition("_")
            if group not in GROUPS or not hasattr(getattr(self, group), attribute):
                raise TypeError(f"unknown option {name!r}")
            groups.setdefault(group, {})[attribute] = value
        return dataclasses.replace(
            self, **{group: dataclasses.replace(getattr(self, group), **values) for group, values in groups.items()}
        )


GROUPS = ("engine", "completion", "index", "transport")


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError("expected a positive integer")
    return value


def _bounded_int(low: int, high: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"expected an integer in [{low}, {high}]")
        return value

    return check


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("expected a non-empty string")
    return value


def _optional_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("expected true or false")
    return value


def _choice(*allowed: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return value

    return check


def _text_list(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError("expected a list of strings")
    return tuple(value)


# client key path -> (group_field as ServerOptions.replace takes it, validator)
_FIELDS: dict[tuple[str, ...], tuple[str, Callable[[Any], Any]]] = {
    ("model",): ("engine_model", _optional_text),
    ("draft",): ("engine_draft", _optional_text),
    ("device",): ("engine_device", _text),
    ("dtype",): ("engine_dtype", _text),
    ("promptFormat",): ("engine_prompt_format", _choice("auto", *FORMAT_NAMES)),
    ("threads",): ("engine_threads", _bounded_int(1, 256)),
    ("proposer",): ("engine_proposer", _text),
    ("limits", "lineTokens"): ("completion_line_tokens", _bounded_int(1, 4096)),
    ("limits", "blockTokens"): ("completion_block_tokens", _bounded_int(1, 4096)),
    ("limits", "editTokens"): ("completion_edit_tokens", _bounded_int(1, 65536)),
    ("limits", "maxDraft"): ("engine_max_draft", _bounded_int(0, 256)),
    ("limits", "deadlineMs"): ("completion_deadline_ms", _positive_int),
    ("limits", "prefixChars"): ("completion_prefix_chars", _bounded_int(1, 1_000_000)),
    ("limits", "suffixChars"): ("completion_suffix_chars", _bounded_int(0, 1_000_000)),
    ("debounceMs",): ("index_debounce_ms", _bounded_int(0, 60_000)),
    ("cachedDocuments",): ("engine_cached_documents", _bounded_int(1, 256)),
    ("maxBatch",): ("engine_max_batch", _bounded_int(1, 256)),
    ("maxCachedTokens",): ("engine_max_cached_tokens", _bounded_int(1, 1 << 24)),
    ("completionFallback",): ("completion_completion_fallback", _bool),
    ("nextEditFormat",): ("completion_next_edit_format", _choice("auto", "zeta", "rewrite")),
    ("limits", "nextEditTokens"): ("completion_next_edit_tokens", _bounded_int(1, 65536)),
    ("nextEditSpeculate",): ("completion_next_edit_speculate", _bool),
    ("mode",): ("completion_mode", _choice("auto", "line", "block")),
    ("index", "enabled"): ("index_enabled", _bool),
    ("index", "path"): ("index_path", _optional_text),
    ("index", "exclude"): ("index_exclude", _text_list),
    ("index", "maxFileBytes"): ("index_max_file_bytes", _positive_int),
    ("index", "maxTokens"): ("index_max_tokens", _positive_int),
    ("maxDocumentBytes",): ("index_max_document_bytes", _positive_int),
    ("maxMessageBytes",): ("transport_max_message_bytes", _bounded_int(1024, 1 << 31)),
}


def parse_options(raw: Any, base: ServerOptions = ServerOptions()) -> tuple[ServerOptions, list[str]]:
    """Apply client options over ``base``; return the result and one message per rejected value."""
    messages: list[str] = []
    if raw is None:
        return base, messages
    if not isinstance(raw, dict):
        return base, [f"initializationOptions must be an object, got {type(raw).__name__}; using defaults"]
    changes: dict[str, Any] = {}
    known_paths = set(_FIELDS)
    for path, (name, validate) in _FIELDS.items():
        found, value = _lookup(raw, path)
        if not found:
            continue
        try:
            changes[name] = validate(value)
        except ValueError as error:
            group, _, attribute = name.partition("_")
            default = getattr(getattr(base, group), attribute)
            messages.append(f"codespec: option {'.'.join(path)} = {value!r} ignored ({error}); using {default!r}")
    for path in _leaf_paths(raw):
        if path not in known_paths:
            messages.append(f"codespec: unknown option {'.'.join(path)} ignored")
    return base.replace(**changes), messages


def _lookup(raw: dict, path: tuple[str, ...]) -> tuple[bool, Any]:
    node: Any = raw
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return False, None
        node = node[key]
    return True, node


def _leaf_paths(raw: dict, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    groups = {path[0] for path in _FIELDS if len(path) > 1}
    paths = []
    for key, value in raw.items():
        path = (*prefix, key)
        if not prefix and key in groups and isinstance(value, dict):
            paths.extend(_leaf_paths(value, path))
        else:
            paths.append(path)
    return paths


@dataclass(frozen=True)
class WsLimits:
    """Per-connection limits of the websocket endpoint."""

    max_message_bytes: int = 1 << 20  # larger messages get an `error`, the connection stays open
    max_frame_bytes: int = 16 << 20  # beyond this websockets closes the connection (1009)
    max_in_flight: int = 4  # concurrent requests per connection
    allowed_origins: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class HttpLimits:
    """Limits of the HTTP endpoint."""

    max_body_bytes: int = 4 << 20  # a larger body is refused with 413
    # generations in flight over HTTP (decoding, or waiting for a place in the batch); one more: 429
    max_requests: int = 64
    allowed_origins: tuple[str, ...] = ()  # browser origins allowed to call (none by default)
    any_model: bool = False  # serve every ``model`` name with the loaded target (clients that hard-code one)
