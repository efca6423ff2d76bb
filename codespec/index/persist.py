"""SQLite persistence (sqlite-utils, WAL): documents, history, acceptance stats, sorted tables.

Every write happens inside one ``with conn:`` transaction, so a writer killed at any instant leaves
either the old or the new state of each group of rows, never a mix: the database opens and agrees
with itself. Tokens are stored as raw little-endian arrays next to the text and its content hash;
rows are valid only for the tokenizer fingerprint recorded with them.

Several processes may open one file (two editor windows on one workspace): the schema is made
in one ``BEGIN IMMEDIATE`` transaction and every connection waits out another's write (busy
timeout). The file is a cache of the workspace plus session history, so a damaged one (not a
database, malformed pages, found at open or later) is moved aside, kept for inspection, with
one log line, and a new one is started; rows that cannot be what this code wrote are ignored
and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import sqlite_utils
from numpy.typing import DTypeLike

SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 30.0  # how long a connection waits for another process's write before failing
log = logging.getLogger("codespec.index")


class SchemaError(RuntimeError):
    """The file is a readable index of another schema version (not corruption: left in place)."""


def _is_busy(error: BaseException) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    return (
        (code is not None and (code & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED))
        or "locked" in str(error)
        or "busy" in str(error)
    )


def is_corrupt(error: BaseException) -> bool:
    """Errors that mean the file is not a usable database (as opposed to locked or unopenable)."""
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)
    return "malformed" in str(error) or "not a database" in str(error)


def set_aside(path: Path, error: BaseException) -> Path:
    """Move an unreadable database (and its WAL) out of the way, keeping it for inspection; the
    caller starts a new one, which the index fills again from the workspace."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = path.with_name(f"{path.name}.corrupt-{stamp}-{os.getpid()}")
    for suffix in ("", "-wal", "-shm"):
        part = Path(str(path) + suffix)
        if part.exists():
            os.replace(part, Path(str(aside) + suffix))
    log.error("index: database %s is unreadable (%s); moved it to %s and starting a new one", path, error, aside)
    return aside


def _retry_busy(step, timeout: float):
    """Run ``step`` again while SQLite reports the database busy. The busy handler covers most
    waits; a few cases (switching to WAL, a read lock upgraded while another connection
    recovers the WAL) return SQLITE_BUSY at once, so retry them here until ``timeout``."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            return step()
        except sqlite3.OperationalError as error:
            if not _is_busy(error) or time.monotonic() >= deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def default_index_path(roots: list[Path]) -> Path:
    """<first root>/.codespec/index.db, or the user cache when there is no workspace."""
    if roots:
        return roots[0] / ".codespec" / "index.db"
    return Path.home() / ".cache" / "codespec" / "index.db"


def content_hash(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


@dataclass(frozen=True)
class StoredDocument:
    uri: str
    hash: str
    version: int
    text: str
    token_ids: np.ndarray


@dataclass(frozen=True)
class StoredHistory:
    id: int
    kind: str
    uri: str | None
    text: str
    time: float
    token_ids: np.ndarray | None


class IndexDB:
    """The on-disk half of the index: one SQLite connection. Callers serialise its use (the
    index's lock, or the one writer thread of ``WriteBehindDB``), possibly from different threads."""

    def __init__(
        self, path: str | Path, tokenizer_fingerprint: str, dtype: np.dtype, busy_timeout: float = BUSY_TIMEOUT_S
    ) -> None:
        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        self.fingerprint = tokenizer_fingerprint
        self.busy_timeout = busy_timeout
        self.moved_aside: Path | None = None  # where an unreadable file went, if it did
        try:
            self._open()
        except sqlite3.DatabaseError as error:
            if _is_busy(error) or not is_corrupt(error) or not self.path.exists():
                if str(self.path) in str(error):
                    raise
                raise type(error)(f"index database {self.path}: {error}") from error  # e.g. read-only
            self.moved_aside = set_aside(self.path, error)
            self._open()

    def _open(self) -> None:
        # Used only under the index's lock, possibly from several threads (an LSP worker). The
        # timeout is SQLite's busy handler: another process writing waits us, it does not fail us.
        try:
            conn = sqlite3.connect(str(self.path), timeout=self.busy_timeout, check_same_thread=False)
        except sqlite3.OperationalError as error:  # "unable to open database file": say which
            raise sqlite3.OperationalError(f"index database {self.path}: {error}") from None
        try:
            self.db = sqlite_utils.Database(conn)
            self.conn: sqlite3.Connection = conn
            _retry_busy(self._setup, self.busy_timeout)
        except BaseException:
            conn.close()
            raise

    def _setup(self) -> None:
        """WAL mode, then create-if-missing and the version check in one ``BEGIN IMMEDIATE``
        transaction: two processes opening the same new file at once (two editor windows on one
        workspace) see either no tables or all of them, never half a schema or two versions."""
        if self.db.journal_mode != "wal":
            self.db.enable_wal()
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            self._create()
        except BaseException:
            self.conn.rollback()
            raise
        self.conn.commit()

    def _create(self) -> None:
        db = self.db
        if "schema_version" not in db.table_names():
            db.table("schema_version").create({"version": int}, pk="version")
            self.conn.execute("INSERT INTO schema_version (version) VALUES (?)", [SCHEMA_VERSION])
        found = [r[0] for r in self.conn.execute("SELECT version FROM schema_version")]
        if found != [SCHEMA_VERSION]:
            raise SchemaError(
                f"{self.path}: index schema {found}, this codespec reads {SCHEMA_VERSION}; "
                "delete the file to rebuild it"
            )
        db.table("documents").create(
            {"uri": str, "hash": str, "version": int, "text": str, "tokens": bytes, "tokenizer": str, "updated": float},
            pk="uri",
            if_not_exists=True,
        )
        db.table("history").create(
            {"id": int, "kind": str, "uri": str, "text": str, "time": float, "tokens": bytes, "tokenizer": str},
            pk="id",
            if_not_exists=True,
        )
        db.table("stats").create(
            {"source": str, "drafted": int, "accepted": int, "updated": float}, pk="source", if_not_exists=True
        )
        db.table("tables").create(
            {"fingerprint": str, "positions": bytes, "groups": bytes, "created": float},
            pk="fingerprint",
            if_not_exists=True,
        )

    # -- documents ------------------------------------------------------------------------------
    def load_documents(self, uris: Iterable[str]) -> Iterator[StoredDocument]:
        """These documents, where their tokens were made by this tokenizer (others: re-tokenize)."""
        uris = list(uris)
        for chunk in range(0, len(uris), 500):
            part = uris[chunk : chunk + 500]
            rows = self.conn.execute(
                f"SELECT uri, hash, version, text, tokens FROM documents WHERE tokenizer = ? "
                f"AND uri IN ({', '.join('?' * len(part))})",
                [self.fingerprint, *part],
            )
            for row in rows:
                stored = self._stored(row)
                if stored is not None:
                    yield stored

    def _stored(self, row: tuple, verify_hash: bool = False) -> StoredDocument | None:
        """A row as a document, or None (with a log line: the caller re-tokenizes) if its
        values cannot be what this code wrote: damage SQLite's checks did not catch, or a
        file edited by another tool."""
        uri, digest, version, text, blob = row
        problem = None
        if not isinstance(text, str) or not isinstance(blob, bytes) or not isinstance(digest, str):
            problem = "a value of the wrong type"
        elif len(blob) % self.dtype.itemsize:
            problem = f"a token blob of {len(blob)} bytes, not whole tokens"
        elif verify_hash and content_hash(text) != digest:
            problem = "a text that does not match its hash"
        if problem is not None:
            log.warning("index: ignoring the stored copy of %s: %s", uri, problem)
            return None
        return StoredDocument(
            uri, digest, version if isinstance(version, int) else 0, text, np.frombuffer(blob, dtype=self.dtype)
        )

    def documents_list(self, uris: Iterable[str]) -> list[StoredDocument]:
        return list(self.load_documents(uris))

    def document(self, uri: str) -> StoredDocument | None:
        row = self.conn.execute(
            "SELECT uri, hash, version, text, tokens FROM documents WHERE uri = ? AND tokenizer = ?",
            [uri, self.fingerprint],
        ).fetchone()
        return None if row is None else self._stored(row, verify_hash=True)

    def document_hashes(self) -> dict[str, str]:
        rows = self.conn.execute("SELECT uri, hash FROM documents WHERE tokenizer = ?", [self.fingerprint])
        return dict(rows)

    def save_documents(self, documents: Iterable[tuple[str, str | None, int, str, np.ndarray]]) -> None:
        """(uri, hash or None, version, text, tokens) rows, all in one transaction."""
        now = time.time()
        rows = [
            (
                uri,
                digest or content_hash(text),
                version,
                text,
                np.ascontiguousarray(tokens, dtype=self.dtype).tobytes(),
                self.fingerprint,
                now,
            )
            for uri, digest, version, text, tokens in documents
        ]
        with self.conn:
            self.conn.executemany(
                "INSERT OR REPLACE INTO documents (uri, hash, version, text, tokens, tokenizer, updated) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                rows,
            )

    def set_version(self, uri: str, version: int) -> None:
        """A new version of a stored document whose text did not change (no row rewrite)."""
        with self.conn:
            self.conn.execute("UPDATE documents SET version = ? WHERE uri = ?", [version, uri])

    def delete_document(self, uri: str) -> None:
        with self.conn:
            self.conn.execute("DELETE FROM documents WHERE uri = ?", [uri])

    # -- history --------------------------------------------------------------------------------
    def add_history(self, kind: str, text: str, uri: str | None, when: float, tokens: np.ndarray) -> None:
        with self.conn:
            self.conn.execute(
                "INSERT INTO history (kind, uri, text, time, tokens, tokenizer) VALUES (?, ?, ?, ?, ?, ?)",
                [kind, uri, text, when, np.ascontiguousarray(tokens, dtype=self.dtype).tobytes(), self.fingerprint],
            )

    def clear_history(self) -> None:
        with self.conn:
            self.conn.execute("DELETE FROM history")

    def load_history(self, limit_per_kind: int) -> list[StoredHistory]:
        """The newest entries of each kind, oldest first; tokens None where another tokenizer made them."""
        rows = self.conn.execute(
            "SELECT id, kind, uri, text, time, tokens, tokenizer FROM (SELECT *, ROW_NUMBER() OVER "
            "(PARTITION BY kind ORDER BY id DESC) AS n FROM history) WHERE n <= ? ORDER BY id",
            [limit_per_kind],
        )
        out = []
        for i, kind, uri, text, when, blob, fp in rows:
            if not isinstance(text, str) or not isinstance(kind, str):
                log.warning("index: ignoring damaged history entry %s", i)
                continue
            whole = isinstance(blob, bytes) and blob and len(blob) % self.dtype.itemsize == 0
            tokens = np.frombuffer(blob, dtype=self.dtype) if fp == self.fingerprint and whole else None
            out.append(
                StoredHistory(
                    i,
                    kind,
                    uri if isinstance(uri, str) else None,
                    text,
                    when if isinstance(when, (int, float)) else 0.0,
                    tokens,
                )
            )
        return out

    # -- acceptance stats -----------------------------------------------------------------------
    def add_stats(self, deltas: dict[str, tuple[int, int]]) -> None:
        now = time.time()
        with self.conn:
            for source, (drafted, accepted) in deltas.items():
                self.conn.execute(
                    "INSERT INTO stats (source, drafted, accepted, updated) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT(source) DO UPDATE SET drafted = drafted + excluded.drafted, "
                    "accepted = accepted + excluded.accepted, updated = excluded.updated",
                    [source, drafted, accepted, now],
                )

    def load_stats(self) -> dict[str, tuple[int, int]]:
        return {s: (d, a) for s, d, a in self.conn.execute("SELECT source, drafted, accepted FROM stats")}

    # -- sorted n-gram tables (so a restart skips the sort) --------------------------------------
    def save_table(self, fingerprint: str, positions: np.ndarray, groups: np.ndarray, keep: Iterable[str]) -> None:
        """A table's sorted positions and trie groups, so a restart neither sorts nor searches."""
        keep = set(keep) | {fingerprint}
        with self.conn:
            self.conn.execute(
                "INSERT OR REPLACE INTO tables (fingerprint, positions, groups, created) VALUES (?, ?, ?, ?)",
                [fingerprint, positions.tobytes(), np.ascontiguousarray(groups, dtype=np.int64).tobytes(), time.time()],
            )
            for (old,) in self.conn.execute("SELECT fingerprint FROM tables").fetchall():
                if old not in keep:
                    self.conn.execute("DELETE FROM tables WHERE fingerprint = ?", [old])

    def load_table(self, fingerprint: str, dtype: DTypeLike) -> tuple[np.ndarray, np.ndarray] | None:
        row = self.conn.execute("SELECT positions, groups FROM tables WHERE fingerprint = ?", [fingerprint]).fetchone()
        if row is None:
            return None
        positions, groups = row
        if (
            not isinstance(positions, bytes)
            or not isinstance(groups, bytes)
            or len(positions) % np.dtype(dtype).itemsize
            or len(groups) % 32
        ):
            log.warning("index: ignoring a damaged stored table %s (it is sorted again)", fingerprint)
            return None
        return np.frombuffer(positions, dtype=dtype), np.frombuffer(groups, dtype=np.int64).reshape(-1, 4)

    # -- checks ---------------------------------------------------------------------------------
    def check(self) -> None:
        """SQLite's own check plus: every stored hash matches its text, every token blob is whole."""
        result = self.conn.execute("PRAGMA integrity_check").fetchone()[0]
        if result != "ok":
            raise AssertionError(f"sqlite integrity_check: {result}")
        for uri, digest, text, blob in self.conn.execute("SELECT uri, hash, text, tokens FROM documents"):
            if content_hash(text) != digest:
                raise AssertionError(f"{uri}: stored hash does not match stored text")
            if len(blob) % self.dtype.itemsize:
                raise AssertionError(f"{uri}: token blob of {len(blob)} bytes is not whole tokens")

    def close(self) -> None:
        self.conn.close()


def table_fingerprint(tokenizer: str, params: tuple, entries: Iterable[tuple[str, str]]) -> str:
    """Names a sorted table by what it was built from: tokenizer, parameters, (uri, hash) in order."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(json.dumps([tokenizer, list(params)]).encode())
    for uri, content in entries:
        digest.update(uri.encode("utf-8", "surrogatepass") + b"\0" + content.encode() + b"\0")
    return digest.hexdigest()
