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

from codespec.prompts import FORMAT_NAMES
from index.discovery import DEFAULT_EXCLUDE


@dataclass(frozen=True)
class ServerOptions:
    model: str | None = None  # None: the shipped default model
    draft: str | None = None  # a draft model sharing the target's tokenizer (proposer "draft")
    device: str = "auto"
    dtype: str = "auto"
    prompt_format: str = "auto"  # auto (from the tokenizer's special tokens) or a codespec.prompts.FORMATS name
    threads: int | None = None  # CPU threads for torch; None: half the cores (at most 8), see start_service
    proposer: str = "auto"  # falls back to "context" when not installed
    line_tokens: int = 48  # single-line completion budget
    block_tokens: int = 160  # multi-line completion budget
    edit_tokens: int = 1024  # rewrite budget (on top of the original's length)
    max_draft: int = 32  # K
    deadline_ms: int = 4000  # a completion nobody waits for any more is not worth finishing
    prefix_chars: int | None = None  # prompt window before the cursor (None: by device, see inline.default_windows)
    suffix_chars: int | None = None  # after the cursor (FIM puts it after the prefix: every keystroke re-prefills it)
    debounce_ms: int = 150  # per-document delay before an edit reaches the index
    cached_documents: int = 8  # KV caches kept for prompt caching (one per document)
    mode: str = "auto"  # "auto" (by the cursor's line), "line" (single-line only), "block"
    completion_fallback: bool = True  # answer textDocument/completion with the same completion
    index: bool = True
    index_path: str | None = None  # None: <first workspace folder>/.codespec/index.db
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    max_file_bytes: int = 1_000_000
    # Resident tokens the index keeps before evicting the least recently used documents (about 26
    # bytes each, docs/index.md: 32 M tokens is ~0.8 GB, roughly 100 MB of source).
    index_max_tokens: int = 32_000_000
    # Open documents over this many bytes are served without the index (tokenizing one whole holds
    # the engine ~1 s per MB and the tokenizer's buffers ~250 MB per MB); as index.maxFileBytes.
    max_document_bytes: int = 1_000_000
    max_message_bytes: int = 64 << 20  # a larger LSP message is refused and skipped (lsp.framing)


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


# client key path -> (field, validator)
_FIELDS: dict[tuple[str, ...], tuple[str, Callable[[Any], Any]]] = {
    ("model",): ("model", _optional_text),
    ("draft",): ("draft", _optional_text),
    ("device",): ("device", _text),
    ("dtype",): ("dtype", _text),
    ("promptFormat",): ("prompt_format", _choice("auto", *FORMAT_NAMES)),
    ("threads",): ("threads", _bounded_int(1, 256)),
    ("proposer",): ("proposer", _text),
    ("limits", "lineTokens"): ("line_tokens", _bounded_int(1, 4096)),
    ("limits", "blockTokens"): ("block_tokens", _bounded_int(1, 4096)),
    ("limits", "editTokens"): ("edit_tokens", _bounded_int(1, 65536)),
    ("limits", "maxDraft"): ("max_draft", _bounded_int(0, 256)),
    ("limits", "deadlineMs"): ("deadline_ms", _positive_int),
    ("limits", "prefixChars"): ("prefix_chars", _bounded_int(1, 1_000_000)),
    ("limits", "suffixChars"): ("suffix_chars", _bounded_int(0, 1_000_000)),
    ("debounceMs",): ("debounce_ms", _bounded_int(0, 60_000)),
    ("cachedDocuments",): ("cached_documents", _bounded_int(1, 256)),
    ("completionFallback",): ("completion_fallback", _bool),
    ("mode",): ("mode", _choice("auto", "line", "block")),
    ("index", "enabled"): ("index", _bool),
    ("index", "path"): ("index_path", _optional_text),
    ("index", "exclude"): ("exclude", _text_list),
    ("index", "maxFileBytes"): ("max_file_bytes", _positive_int),
    ("index", "maxTokens"): ("index_max_tokens", _positive_int),
    ("maxDocumentBytes",): ("max_document_bytes", _positive_int),
    ("maxMessageBytes",): ("max_message_bytes", _bounded_int(1024, 1 << 31)),
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
            default = getattr(base, name)
            messages.append(f"codespec: option {'.'.join(path)} = {value!r} ignored ({error}); using {default!r}")
    for path in _leaf_paths(raw):
        if path not in known_paths:
            messages.append(f"codespec: unknown option {'.'.join(path)} ignored")
    return dataclasses.replace(base, **changes), messages


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
