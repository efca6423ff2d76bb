"""The index's database behind a writer thread: edits never wait for SQLite.

Reads run on the caller's thread and first wait for queued writes; writes go, in submission
order, to one thread with its own connection (:class:`index.persist.IndexDB` does the SQL).
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from numpy.typing import DTypeLike

from codespec.index.persist import IndexDB, StoredDocument, StoredHistory, is_corrupt, set_aside

log = logging.getLogger("codespec.index")


class WriteBehindDB:
    """The database as the index uses it: reads on the caller's thread, writes queued to one
    writer thread (its own connection), applied in submission order, each in its transaction.

    Why: a WAL checkpoint or a large row can take tens of milliseconds; an edit must not wait
    for it. Reads first wait for queued writes, so they always see everything submitted. A write
    error is logged and raised by the next read, ``wait`` or ``close``: it is never silent.
    Arguments must not be mutated after submission (token arrays here never are: edits build new
    ones and level arrays are immutable).

    A file found corrupt after it opened (a damaged page met by a read or a write) is moved
    aside and replaced by a new one, like a file found corrupt at open: the read is answered
    from the new (empty) file, so the index re-tokenizes what it needs, and writes not yet
    applied when the damage was met are applied to the new file.
    """

    def __init__(self, path: str | Path, tokenizer_fingerprint: str, dtype: DTypeLike) -> None:
        self._args = (Path(path), tokenizer_fingerprint, np.dtype(dtype))
        self.reader = IndexDB(*self._args)
        self.moved_aside: list[Path] = [self.reader.moved_aside] if self.reader.moved_aside else []
        self._jobs: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._corrupt: BaseException | None = None  # set by the writer: it holds jobs from then on
        self._held: list[tuple[str, tuple]] = []
        self._start_writer()

    def _start_writer(self) -> None:
        self._thread = threading.Thread(target=self._run, name="codespec-index-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            writer = IndexDB(*self._args)
        except BaseException as error:
            log.error("index: the database writer could not open %s: %s", self._args[0], error)
            self._error = error
            return
        try:
            while True:
                job = self._jobs.get()
                try:
                    if job is None:
                        return
                    if self._corrupt is not None:
                        self._held.append(job)
                        continue
                    method, args = job
                    getattr(writer, method)(*args)
                except BaseException as error:  # reported to the caller at its next call
                    if isinstance(error, sqlite3.DatabaseError) and is_corrupt(error):
                        self._held.append(job)  # applied to the replacement file
                        self._corrupt = error
                    else:
                        log.error("index: database write %s failed: %s", job[0] if job else "?", error)
                        self._error = error
                finally:
                    self._jobs.task_done()
        finally:
            writer.close()

    def _submit(self, method: str, *args) -> None:
        self._raise()
        if not self._thread.is_alive():
            raise RuntimeError("index database writer is closed")
        self._jobs.put((method, args))

    def _raise(self) -> None:
        if self._corrupt is not None:
            self._replace_file(self._corrupt)
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"index: a database write failed: {error}") from error

    def _replace_file(self, error: BaseException) -> None:
        """Stop the writer, move the damaged file aside, reopen both connections on a new
        file, and hand the new writer the jobs the old one held back."""
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()
        self.reader.close()
        self.moved_aside.append(set_aside(self._args[0], error))
        held, self._held, self._corrupt = self._held, [], None
        self.reader = IndexDB(*self._args)
        self._start_writer()
        for job in held:
            self._jobs.put(job)

    def _read(self, method: str, *args, wait: bool = True):
        if wait:
            self.wait()
        try:
            return getattr(self.reader, method)(*args)
        except sqlite3.DatabaseError as error:
            if not is_corrupt(error):
                raise
            self.wait()  # nothing in flight on the old file
            self._replace_file(error)
            self.wait()
            return getattr(self.reader, method)(*args)

    def wait(self) -> None:
        """Block until every submitted write is committed (to a new file, if the old one was
        found damaged meanwhile)."""
        for _ in range(3):
            self._jobs.join()
            if self._corrupt is None:
                break
            self._replace_file(self._corrupt)
        self._raise()

    # writes (queued)
    def save_documents(self, documents: Iterable[tuple[str, str | None, int, str, np.ndarray]]) -> None:
        self._submit("save_documents", list(documents))

    def set_version(self, uri: str, version: int) -> None:
        self._submit("set_version", uri, version)

    def delete_document(self, uri: str) -> None:
        self._submit("delete_document", uri)

    def add_history(self, kind: str, text: str, uri: str | None, when: float, tokens: np.ndarray) -> None:
        self._submit("add_history", kind, text, uri, when, tokens)

    def clear_history(self) -> None:
        self._submit("clear_history")

    def add_stats(self, deltas: dict[str, tuple[int, int]]) -> None:
        self._submit("add_stats", dict(deltas))

    def save_table(self, fingerprint: str, positions: np.ndarray, groups: np.ndarray, keep: Iterable[str]) -> None:
        """Queued without raising an earlier write's error (that stays for the next read or
        ``wait``): a level is installed whatever happens here, and a table that is not saved is
        only re-sorted at the next start."""
        if self._thread.is_alive():
            self._jobs.put(("save_table", (fingerprint, positions, groups, list(keep))))

    # reads (after the queue drains)
    def load_documents(self, uris: Iterable[str]) -> list[StoredDocument]:
        uris = list(uris)
        return self._read("documents_list", uris)

    def document(self, uri: str) -> StoredDocument | None:
        return self._read("document", uri)

    def document_hashes(self) -> dict[str, str]:
        return self._read("document_hashes")

    def load_history(self, limit_per_kind: int) -> list[StoredHistory]:
        return self._read("load_history", limit_per_kind)

    def load_stats(self) -> dict[str, tuple[int, int]]:
        return self._read("load_stats")

    def load_table(self, fingerprint: str, dtype: DTypeLike):
        # no wait: a table not yet written is simply rebuilt
        return self._read("load_table", fingerprint, dtype, wait=False)

    def check(self) -> None:
        self.wait()
        self.reader.check()

    def close(self) -> None:
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()
        if self._corrupt is not None:  # writes held back: apply them to a new file first
            self._replace_file(self._corrupt)
            self._jobs.put(None)
            self._thread.join()
        self.reader.close()
        self._raise()
