"""The workspace index as the servers use it: opened, filled by a background scan, updated.

Threading model (why a workspace scan never holds up a completion):

- **engine thread** (``codespec-engine``): owns the target and its tokenizer. Every index call
  the editor drives (open, add and update documents, history, the lookups inside decode cycles,
  stats, close) goes through ``EngineService.call``, so it runs between two decode cycles, and
  the index's own tokenizer adapter (the target's tokenizer) is used on this thread only.
- **indexing thread** (``codespec-indexer``, one per index): runs workspace scans, one at a
  time. Discovery, reading, hashing, tokenizing and the table sort (the seconds-to-minutes part)
  hold no lock; the scan tokenizes with its **own copy** of the tokenizer, made on the engine
  thread when the index opens (:func:`index.ingest.thread_adapter`; a fast tokenizer used by two
  threads at once can fail with "Already borrowed"). It takes the index's lock only for short
  steps: a snapshot, one batch of stored rows per hold, and the final install. So a decode cycle
  waits for at most one of those steps, and never for the scan. (Measured, 480 files, 1.6M
  tokens, 2 loaded cores: longest hold 1.5 ms on a first scan, ~5 ms on a restart that reads
  stored tokens back.)
- the index's own threads: ``codespec-index-writer`` commits SQLite writes behind (the scan lets
  queued writes commit before it takes the lock to install), ``codespec-index-merge`` sorts level
  rebuilds and merges above :data:`BACKGROUND_TOKENS` and installs them under the lock.
- ``progress(done, total)`` is called on the indexing thread (the servers hop to their loop).
- **cancellation and shutdown**: a scan checks its cancel flag between batches and stops before
  installing anything (:class:`index.ingest.ScanCancelled`), so the index and its database stay
  as they were. :func:`stop_indexing` cancels and joins the indexing thread; ``close_service``
  calls it before closing the index on the engine thread.

The index is optional at run time (``index.enabled: false``, or a database that cannot be opened): every
call here degrades to "no index" with one log line instead of failing a request.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlparse

from codespec.index.discovery import read_text
from codespec.index.persist import default_index_path

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]

# Level rebuilds and merges above this many live tokens run on the index's merge thread; smaller
# ones run under the index's lock on whichever thread triggered them (often the engine thread,
# after an edit). Sorting 64k tokens takes ~10 ms (1.6M: 0.24 s on a loaded 2-core machine);
# the index's default (1M tokens, ~150 ms) would hold a decode cycle that long.
BACKGROUND_TOKENS = 1 << 16


def uri_to_path(uri: str) -> Path | None:
    parsed = urlparse(uri)
    if parsed.scheme not in ("file", ""):
        return None
    return Path(unquote(parsed.path))


def read_file(uri: str, max_bytes: int) -> str | None:
    """A workspace file's text as the scan reads it (line ends kept), or None (not a file,
    oversize, binary): for a next edit in a file the editor has not opened."""
    path = uri_to_path(uri)
    return None if path is None else read_text(path, max_bytes)[0]


class Scan(concurrent.futures.Future):
    """One workspace scan: a Future of its :class:`~index.scan.IndexReport`.

    ``cancel()`` asks the scan to stop (queued: before it starts; running: at its next check)
    and returns False: a scan is never cancelled as a Future, it always ends with its report or
    an exception (:class:`~index.ingest.ScanCancelled` when stopped), so every waiter sees a
    normal outcome rather than a CancelledError. ``asyncio.wrap_future`` calls it when the
    awaiting task is cancelled, so that stops the scan too."""

    def __init__(
        self, roots: list[Path], exclude: tuple[str, ...], max_file_bytes: int, progress: Progress | None
    ) -> None:
        super().__init__()
        self.roots, self.exclude, self.max_file_bytes, self.progress = roots, exclude, max_file_bytes, progress
        self.stopped = threading.Event()

    def cancel(self) -> bool:
        self.stopped.set()
        return False


class WorkspaceIndexer:
    """The indexing thread of one index: scans run there in submission order."""

    def __init__(self, index, adapter) -> None:
        """``adapter``: the indexing thread's own tokenizer (``index.ingest.thread_adapter``),
        copied on the engine thread, the only user of the original; used on this thread only."""
        self.index = index
        self.adapter = adapter
        self.closing = threading.Event()  # cancels the running scan and every queued one
        self._queue: queue.Queue[Scan | None] = queue.Queue()
        self._submit_lock = threading.Lock()  # a scan is either queued before close, or refused
        self._thread = threading.Thread(target=self._run, name="codespec-indexer", daemon=True)
        self._thread.start()

    def submit(
        self, roots: list[Path], exclude: tuple[str, ...], max_file_bytes: int, progress: Progress | None = None
    ) -> Scan:
        from codespec.index.ingest import ScanCancelled

        scan = Scan(list(roots), tuple(exclude), max_file_bytes, progress)
        with self._submit_lock:
            if self.closing.is_set():
                scan.set_exception(ScanCancelled("the index is closing"))
            else:
                self._queue.put(scan)
        return scan

    def stop(self, timeout: float | None = None) -> bool:
        """Cancel the running and queued scans and wait for the thread; False if it is still
        running after ``timeout`` (a scan notices cancellation between batches, not inside
        discovery or the table sort)."""
        with self._submit_lock:
            self.closing.set()
            self._queue.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        from codespec.index.ingest import ScanCancelled

        while (scan := self._queue.get()) is not None:
            scan.set_running_or_notify_cancel()  # True: a Scan is never cancelled as a Future
            try:
                if self.closing.is_set() or scan.stopped.is_set():
                    raise ScanCancelled("workspace scan cancelled before it started")
                report = self.index.index_workspace(
                    [str(root) for root in scan.roots],
                    exclude=list(scan.exclude),
                    max_file_bytes=scan.max_file_bytes,
                    progress=scan.progress,
                    adapter=self.adapter,
                    cancel=lambda: self.closing.is_set() or scan.stopped.is_set(),
                )
            except BaseException as error:  # handed to whoever awaits the scan
                scan.set_exception(error)
            else:
                scan.set_result(report)
        while not self._queue.empty():  # submitted just before close: refused, not left pending
            scan = self._queue.get_nowait()
            if scan is not None:
                scan.set_running_or_notify_cancel()
                scan.set_exception(ScanCancelled("the index is closing"))


def indexed_text(index, uri: str) -> str | None:
    """The index's copy of ``uri``, None when it holds none (other errors are real: raised)."""
    try:
        return index.document_text(uri)
    except KeyError:  # not in the index
        return None


def open_index(service, db_path: Path, memory_budget_tokens: int | None = None):
    """A WorkspaceIndex made on the engine thread and attached to ``service`` (with its
    indexing thread), or None if unavailable. Past ``memory_budget_tokens`` resident tokens the
    index evicts least recently used documents (they stay in the database)."""
    from codespec.index import WorkspaceIndex
    from codespec.index.ingest import thread_adapter

    def create():
        db_path.parent.mkdir(parents=True, exist_ok=True)
        index = WorkspaceIndex(
            service.target.tokenizer,
            str(db_path),
            memory_budget_tokens=memory_budget_tokens,
            background_tokens=BACKGROUND_TOKENS,
        )
        return index, thread_adapter(index.adapter)

    try:
        index, scan_adapter = service.call(create).result()
    except Exception as error:  # a broken database must not stop the editor from completing
        log.warning("could not open the index at %s: %s", db_path, error)
        return None
    indexer = WorkspaceIndexer(index, scan_adapter)
    service.call(lambda: service.attach_index(index, indexer)).result()
    return index


def index_workspace(
    service, roots: list[Path], exclude: tuple[str, ...], max_file_bytes: int, progress: Progress | None = None
) -> Scan:
    """Scan the roots on the indexing thread (engine requests keep running meanwhile);
    ``progress(done, total)`` is called from that thread. Returns the scan (a Future of the
    index's report); ``scan.cancel()`` stops it."""
    return service.indexer.submit(roots, exclude, max_file_bytes, progress)


def stop_indexing(service, timeout: float | None = 60.0) -> None:
    """Cancel scans and join the indexing thread (before the index is closed)."""
    indexer = getattr(service, "indexer", None)
    if indexer is not None and not indexer.stop(timeout):
        log.warning("the workspace scan did not stop within %.0f s; closing the index anyway", timeout)


def index_folders(service, folders: list[Path], options, quiet: bool = False):
    """Open the index for ``folders`` and fill it (blocking); returns the index or None."""
    roots = [folder.resolve() for folder in folders]
    db_path = Path(options.index.path) if options.index.path else default_index_path(roots)
    index = open_index(service, db_path, options.index.max_tokens)
    if index is None:
        return None

    def progress(done: int, total: int) -> None:
        if not quiet and (done == total or done % 50 == 0):
            print(
                f"\rcodespec: indexed {done}/{total} files",
                end="" if done < total else "\n",
                file=sys.stderr,
                flush=True,
            )

    index_workspace(service, roots, options.index.exclude, options.index.max_file_bytes, progress).result()
    return index
