"""llama.cpp, through llama-cpp-python's low-level (ctypes) API: imported once, its backend
initialised once, its log kept quiet and remembered.

llama.cpp writes every load step to stderr. A user asked for one clear error line (docs/gguf.md,
"Errors"), so the log goes to Python's ``logging`` at debug level, and the last error-level lines
are kept so a failed load can say *why* in its one line.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import threading
from typing import Any

from codespec.core.errors import CodespecError

log = logging.getLogger("codespec.llama_cpp")

INSTALL_HINT = "pip install 'codespec[gguf]' (llama-cpp-python; README, 'GGUF models')"

_lock = threading.Lock()
_library: Any = None
_log_callback: Any = None  # kept referenced: llama.cpp calls it for the life of the process
_recent_errors: collections.deque[str] = collections.deque(maxlen=8)
_partial: list[str] = []  # llama.cpp logs a line in pieces; a piece ending in "\n" ends it

GGML_LOG_LEVEL_ERROR = 4
GGML_LOG_LEVEL_CONT = 5


class BackendUnavailableError(CodespecError):
    """llama-cpp-python is not installed (GGUF models need it)."""


def load_library() -> Any:
    """The ``llama_cpp`` module, initialised: backend up, log routed to ``logging``."""
    global _library, _log_callback
    with _lock:
        if _library is not None:
            return _library
        try:
            import llama_cpp
        except ImportError as error:
            raise BackendUnavailableError(f"GGUF models need llama-cpp-python: {INSTALL_HINT} ({error})") from None
        _log_callback = llama_cpp.llama_log_callback(_on_log)
        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _library = llama_cpp
        return _library


def _on_log(level: int, text: bytes | None, _user_data: Any) -> None:
    piece = (text or b"").decode("utf-8", "replace")
    _partial.append(piece)
    if not piece.endswith("\n"):
        return
    line = "".join(_partial).strip()
    _partial.clear()
    if not line:
        return
    if level == GGML_LOG_LEVEL_ERROR:
        _recent_errors.append(line)
    log.debug("%s", line)


def take_errors() -> list[str]:
    """The error lines llama.cpp logged since the last call (oldest first), then forgets them."""
    lines = list(_recent_errors)
    _recent_errors.clear()
    return lines
