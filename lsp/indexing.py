"""The workspace index as the servers use it: created, filled and updated on the engine thread.

The index is optional at run time (``index.enabled: false``, or an install without it): every
call here degrades to "no index" with one log line instead of failing a request. All index calls
run on the engine thread through ``EngineService.call``, because SQLite connections belong to
the thread that made them and lookups happen inside decode cycles on that thread.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable
from urllib.parse import unquote, urlparse

log = logging.getLogger(__name__)


def uri_to_path(uri: str) -> Path | None:
    parsed = urlparse(uri)
    if parsed.scheme not in ("file", ""):
        return None
    return Path(unquote(parsed.path))


def default_index_path(roots: list[Path]) -> Path:
    """<first root>/.codespec/index.db, or the user cache when there is no workspace."""
    if roots:
        return roots[0] / ".codespec" / "index.db"
    return Path.home() / ".cache" / "codespec" / "index.db"


def open_index(service, db_path: Path):
    """A WorkspaceIndex on the engine thread (and attached to ``service``), or None if unavailable."""
    try:
        from index import WorkspaceIndex
    except ImportError as error:
        log.warning("workspace index unavailable (%s); completions draft from their own context only", error)
        return None

    def create():
        db_path.parent.mkdir(parents=True, exist_ok=True)
        index = WorkspaceIndex(service.target.tokenizer, str(db_path))
        service.index = index
        return index

    try:
        return service.call(create).result()
    except Exception as error:  # a broken database must not stop the editor from completing
        log.warning("could not open the index at %s: %s", db_path, error)
        return None


def index_workspace(service, roots: list[Path], exclude: tuple[str, ...], max_file_bytes: int,
                    progress: Callable[[int, int], None]):
    """Index the roots on the engine thread; ``progress(done, total)`` is called from that thread.

    Returns a concurrent Future (its result is whatever the index reports, e.g. a summary).
    """
    index = service.index
    return service.call(lambda: index.index_workspace([str(root) for root in roots], exclude=list(exclude),
                                                      max_file_bytes=max_file_bytes, progress=progress))
