"""WorkspaceIndex: documents and session history in the target's tokens, with suffix lookup.

Layout (an LSM tree in miniature, so edits show up in the very next lookup without re-sorting
the workspace):

- **levels**: immutable :class:`~index.ngram.NgramTable` s, each over a set of documents; the
  workspace build makes one, later ones hold documents added or edited since. A document that is
  edited, removed or evicted is marked dead in its level (a bit), and lives on in the overlay.
  Sizes stay geometric (a level is merged into the one before it once it reaches a quarter of its
  size), and a level less than half alive is rebuilt, so a lookup touches O(log n) levels.
- **overlay**: documents changed since they were last put in a level; matched by a vectorised
  scan (:func:`~index.ngram.scan_longest`), cheap because the overlay stays small. When it grows
  past ``overlay_tokens``, all but the few most recently edited documents become a new level.
- **history**: one append-only buffer per kind (accepted completions, generated outputs, replaced
  text), scanned like the overlay.

A document's tokens are a view into its level's concatenated array (no second copy). Edits
re-encode a small window (:mod:`index.retokenize`). Persistence (:mod:`index.persist`) keeps
documents, history, stats and each level's sorted table, so a restart on an unchanged workspace
re-reads tokens and tables instead of tokenizing and sorting.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import EllipsisType
from typing import Any

import numpy as np

from codespec.index import scan
from codespec.index.history import HistoryEntry, HistoryRecord, SessionHistory
from codespec.index.levels import Doc, LevelSet, check_document
from codespec.index.persist import StoredDocument, content_hash
from codespec.index.ranking import Continuation, continuations
from codespec.index.retokenize import splice
from codespec.index.scan import IndexReport
from codespec.index.tokens import TokenizerAdapter
from codespec.index.writebehind import WriteBehindDB

log = logging.getLogger("codespec.index")

PER_SOURCE_CAP = 32  # occurrences per source considered for ranking (nearest / newest first)


class WorkspaceIndex:
    def __init__(
        self,
        tokenizer,
        db_path: str | Path | None = None,
        max_ngram: int = 8,
        min_ngram: int = 2,
        memory_budget_tokens: int | None = None,
        *,
        trie_depth: int = 2,
        overlay_tokens: int = 131_072,
        hot_documents: int = 4,
        history_tokens: int = 131_072,
        flush_seconds: float = 1.0,
        background_tokens: int = 1 << 20,
    ) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.adapter = TokenizerAdapter(tokenizer)
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.memory_budget_tokens = memory_budget_tokens
        self.flush_seconds = flush_seconds
        self.db = WriteBehindDB(db_path, self.adapter.fingerprint, self.adapter.dtype) if db_path is not None else None
        self._lock = threading.RLock()  # guards all state; held only briefly by index_workspace
        self._scan_lock = threading.Lock()  # one workspace scan at a time
        self._clock = 0
        self._docs: OrderedDict[str, Doc] = OrderedDict()  # resident documents, least recently used first
        self._evicted: dict[str, tuple[str, int]] = {}  # uri -> (text, version) when evicted without a database
        levels = (max_ngram, min_ngram, trie_depth, overlay_tokens)
        self._levels = LevelSet(self.adapter, *levels, self.db, hot_documents, self._lock, background_tokens)
        self._history = SessionHistory(self.adapter.dtype, self.adapter.sep, history_tokens)
        self._stats: dict[str, list[int]] = {}
        self._pending_stats: dict[str, list[int]] = {}
        self._last_flush = time.monotonic()
        if self.db is not None:
            self._stats = {s: [d, a] for s, (d, a) in self.db.load_stats().items()}
            for row in self.db.load_history(history_tokens):
                tokens = row.token_ids if row.token_ids is not None else self.adapter.encode_array(row.text)
                self._history.append(row.kind, tokens, HistoryEntry(row.uri, row.time, self._tick()))

    # -- documents ------------------------------------------------------------------------------
    def add_document(self, uri: str, text: str, version: int = 0, tokens: np.ndarray | None = None) -> None:
        """Index (or re-index) an open buffer. ``tokens``: ``text`` already tokenized, by another
        thread with its own copy of the tokenizer (``ingest.thread_adapter``), so that a large
        document's second of tokenizing holds neither this index's lock nor the engine."""
        with self._lock:
            current = self._docs.get(uri)
            if current is not None and current.text == text:
                if version != current.version and self.db is not None and not current.unsaved:
                    self.db.set_version(uri, version)  # an unsaved document takes it with its next save
                current.version, current.from_editor = version, True
                self._touch(current)
                return
            ids = tokens if tokens is not None else self.adapter.encode_array(text)
            doc = Doc(uri, text, ids, version, content_hash(text), self._tick())
            doc.from_editor = True
            self._install(doc)
            if self.db is not None:
                self.db.save_documents([(uri, doc.hash, version, text, doc.tokens)])
            self._maintain(keep=doc)

    def add_documents(self, documents: Mapping[str, str] | Iterable[tuple[str, str]], version: int = 0) -> None:
        """Many documents at once (a workspace given as data, files opened together): one batch
        encode, one level, one transaction. Same semantics as :meth:`add_document` for each."""
        items = dict(documents.items() if isinstance(documents, Mapping) else documents)
        arrays = self.adapter.encode_batch(list(items.values()))
        with self._lock:
            tick = self._tick()
            docs = []
            for (uri, text), tokens in zip(items.items(), arrays):
                doc = Doc(uri, text, tokens, version, content_hash(text), tick)
                doc.from_editor = True
                self._install(doc, overlay=False)
                docs.append(doc)
            self._levels.add_level(docs)
            if self.db is not None:
                self.db.save_documents([(d.uri, d.hash, version, d.text, d.tokens) for d in docs])
            self._maintain()

    def update_document(self, uri: str, start: int, end: int, new_text: str, version: int) -> None:
        """Replace characters [start, end) by ``new_text``; what was replaced goes to history."""
        with self._lock:
            doc = self._resident(uri)
            if doc.starts is None:
                doc.starts = self.adapter.char_starts(doc.text, doc.tokens)
            replaced = doc.text[start:end] if 0 <= start <= end <= len(doc.text) else ""
            result = splice(self.adapter, doc.text, doc.tokens, doc.starts, start, end, new_text)
            self._levels.detach(doc)
            doc.text, doc.tokens, doc.starts = result.text, result.token_ids, result.starts
            doc.version, doc.hash, doc.changed, doc.unsaved = version, None, self._tick(), True
            doc.from_editor = True
            self._levels.overlay_add(doc)
            self._touch(doc)
            if replaced.strip():
                self.add_history("replaced", replaced, uri)
            self._maintain(keep=doc)
            self._flush_if_due()

    def close_document(self, uri: str) -> None:
        """The editor closed its buffer: the document stays indexed, but is no longer an open
        buffer, so a workspace scan may replace it with the file on disk and the memory budget
        may evict it (open buffers are never evicted: a reload would not know they are buffers)."""
        with self._lock:
            doc = self._docs.get(uri)
            if doc is not None:
                doc.from_editor = False
                self._maintain()

    def remove_document(self, uri: str) -> None:
        with self._lock:
            doc = self._docs.pop(uri, None)
            if doc is not None:
                self._levels.detach(doc)
            self._evicted.pop(uri, None)
            if self.db is not None:
                self.db.delete_document(uri)

    def document_text(self, uri: str) -> str:
        with self._lock:
            return self._resident(uri).text

    def document_version(self, uri: str) -> int:
        """The version given with the document's latest add or update (a scanned file keeps the
        version stored with it; 0 for one first seen by a scan)."""
        with self._lock:
            return self._resident(uri).version

    def document_tokens(self, uri: str) -> list[int]:
        with self._lock:
            return self._resident(uri).tokens.tolist()

    def token_offset(self, uri: str, char_offset: int) -> int:
        """Index of the first token starting at or after ``char_offset`` (a cursor in characters
        -> the ``cursor`` argument of :meth:`lookup`)."""
        with self._lock:
            doc = self._resident(uri)
            if doc.starts is None:
                doc.starts = self.adapter.char_starts(doc.text, doc.tokens)
            return int(np.searchsorted(doc.starts, char_offset, side="left"))

    def documents(self) -> list[str]:
        """URIs of resident documents."""
        with self._lock:
            return list(self._docs)

    def texts(self) -> list[tuple[str, str]]:
        """(uri, text) of resident documents, most recently used first, without using them (a
        search over the workspace must not reorder what is evicted next)."""
        with self._lock:
            return [(doc.uri, doc.text) for doc in reversed(self._docs.values())]

    def has_document(self, uri: str) -> bool:
        """Whether ``uri`` is resident (without listing every document, as ``documents`` does)."""
        with self._lock:
            return uri in self._docs

    # -- history and stats ----------------------------------------------------------------------
    def add_history(self, kind: str, text: str, uri: str | None = None, *, tokens: Sequence[int] | None = None) -> None:
        """Keep ``text`` in the session history. ``tokens``: its ids where the caller has them (a
        model's output: the ids it generated, which its later outputs repeat), not the text encoded
        again, unless one has no token in this vocabulary (a model's padded rows)."""
        with self._lock:
            given = None if tokens is None else np.asarray(tokens, dtype=np.int64)
            if given is not None and ((given >= 0) & (given < self.adapter.vocab_size)).all():
                ids = given.astype(self.adapter.dtype)
            else:
                ids = self.adapter.encode_array(text)
            when = time.time()
            self._history.append(kind, ids, HistoryEntry(uri, when, self._tick()))
            if self.db is not None and len(ids):
                self.db.add_history(kind, text, uri, when, ids)

    def history_entries(self, kind: str | None = None) -> list[HistoryRecord]:
        """The session history kept for lookups (of one ``kind``, or all), oldest first, each
        with its document and time; after a restart, as reloaded from the database."""
        with self._lock:
            return self._history.records(kind)

    def clear_history(self) -> None:
        """Forget all session history (memory and database); documents stay."""
        with self._lock:
            self._history.clear()
            if self.db is not None:
                self.db.clear_history()

    def record_outcome(self, source: str, drafted: int, accepted: int) -> None:
        """Per-source acceptance counts (persisted in batches; flushed on close)."""
        with self._lock:
            for table in (self._stats, self._pending_stats):
                totals = table.setdefault(source, [0, 0])
                totals[0] += drafted
                totals[1] += accepted
            self._flush_if_due()

    def source_stats(self, source: str) -> tuple[int, int]:
        """(drafted, accepted) tokens recorded for a source over all sessions."""
        with self._lock:
            drafted, accepted = self._stats.get(source, (0, 0))
            return drafted, accepted

    # -- lookup ---------------------------------------------------------------------------------
    def lookup(
        self,
        context: Sequence[int],
        max_len: int,
        uri: str | None = None,
        cursor: int | None = None,
        max_candidates: int = 4,
        *,
        skip: int | None | EllipsisType = ...,
    ) -> list[Continuation]:
        """Continuations after the longest suffix match of ``context`` (at most ``max_ngram``
        tokens, at least ``min_ngram``), best first. ``cursor`` is a token offset in ``uri`` that
        locality ranks around. The occurrence whose continuation starts at ``skip`` (default: the
        cursor) is left out: at a completion's cursor the context matches itself, and what follows
        there is the text after the cursor. A caller whose cursor follows the place it copies from
        passes the completion's own position as ``skip``."""
        with self._lock:
            vocab = self.adapter.vocab_size
            reversed_context = [t if 0 <= t < vocab else -1 for t in map(int, context[-self.max_ngram :])][::-1]
            if len(reversed_context) < self.min_ngram or max_len <= 0 or max_candidates <= 0:
                return []
            same = self._docs.get(uri) if uri is not None else None
            if same is not None:
                self._touch(same)
            found: list[tuple[int, Any, np.ndarray]] = self._levels.match(
                reversed_context, same, cursor, PER_SOURCE_CAP, cursor if skip is ... else skip
            )
            found += self._history.matches(reversed_context, self.max_ngram, self.min_ngram, PER_SOURCE_CAP)
            return continuations(found, max_len, same, cursor, max_candidates, self._clock)

    # -- workspace ------------------------------------------------------------------------------
    def index_workspace(
        self,
        roots: list[Path],
        exclude: Sequence[str] = (),
        max_file_bytes: int = 1_000_000,
        progress: Callable[[int, int], None] | None = None,
        *,
        adapter: TokenizerAdapter | None = None,
        cancel: Callable[[], bool] | None = None,
    ) -> IndexReport:
        """Index every source file under ``roots`` (see :mod:`index.discovery`). Files whose
        content hash matches the database reuse its tokens; nothing unchanged is re-tokenized.

        Reading, hashing, tokenizing and sorting run without the index's lock, so lookups and
        edits from other threads proceed meanwhile; a document opened or edited through the API
        in the meantime keeps its buffer (the scanned copy is discarded). Stored tokens are read
        back one batch of files per lock hold.

        A scan on its own thread passes ``adapter``, its own copy of the tokenizer
        (:func:`index.ingest.thread_adapter`): a tokenizer must not be used by two threads at
        once. ``cancel`` is checked after discovery, between batches and before installing; when
        it returns True the scan raises :class:`index.ingest.ScanCancelled`, having changed nothing."""
        tokenizer = self.adapter if adapter is None else adapter
        if tokenizer.fingerprint != self.adapter.fingerprint:
            raise ValueError("index_workspace: the adapter does not tokenize like the index's")
        with self._scan_lock:
            return scan.run(self, roots, exclude, max_file_bytes, tokenizer, progress, cancel)

    # the scan's steps under the lock (index.scan.ScanSite); everything between them runs without it
    def scan_snapshot(self) -> tuple[dict[str, Doc], dict[str, str], int]:
        """The resident documents, the stored content hashes and one recency for the whole scan
        (the same recency, so frequency decides)."""
        with self._lock:
            stored = self.db.document_hashes() if self.db is not None else {}
            return dict(self._docs), stored, self._tick()

    def load_stored(self, uris: list[str]) -> list[StoredDocument]:
        assert self.db is not None  # documents to load come from the database
        with self._lock:  # the reader connection is used under the lock: one batch per hold
            return list(self.db.load_documents(uris))

    def scan_table(self, fresh: list[Doc], report: IndexReport) -> tuple[str, Any]:
        """The level for ``fresh``: read back when stored (under the lock), else sorted (without it)."""
        fingerprint = self._levels.fingerprint(fresh)
        with self._lock:
            stored_table = self._levels.stored_table(fingerprint, fresh)
        started = time.perf_counter()
        built = self._levels.build(fresh, stored_table)
        report.table_seconds = time.perf_counter() - started
        return fingerprint, built

    def install_scan(
        self,
        roots: Sequence[Path],
        seen: set[str],
        resident: Mapping[str, Doc],
        fresh: list[Doc],
        table: Any,
        report: IndexReport,
    ) -> None:
        """Install the scanned documents (a document changed through the API while the scan ran
        keeps its buffer) and remove those under ``roots`` it did not see."""
        if self.db is not None:
            self.db.wait()  # earlier writes commit before the lock is taken, not while it is held
        with self._lock:
            # read before this scan's own writes are queued, so no read below waits for them
            stored_now = self.db.document_hashes() if self.db is not None else {}
            dead = set()
            for slot, doc in enumerate(fresh):
                current = self._docs.get(doc.uri)
                if current is not None and (current is not resident.get(doc.uri) or current.from_editor):
                    dead.add(slot)  # changed through the API while we scanned: the buffer wins
                else:
                    self._install(doc, overlay=False)
            if fresh:
                fingerprint, built = table
                self._levels.install(fresh, built, fingerprint, dead)
            editor = {u for u, d in self._docs.items() if d.from_editor}  # e.g. a new file not saved yet
            stale = scan.stale(roots, seen | editor, list(self._docs) + list(stored_now))
            for uri in stale:
                self.remove_document(uri)
            if self.db is not None:
                self.db.save_documents(
                    [
                        (d.uri, d.hash, d.version, d.text, d.tokens)
                        for n, d in enumerate(fresh)
                        if d.unsaved and n not in dead
                    ]
                )
            for doc in fresh:
                doc.unsaved = False
            report.removed = len(stale)
            report.tokens = sum(len(d.tokens) for d in self._docs.values())  # before the memory budget evicts
            self._maintain()

    # -- upkeep ---------------------------------------------------------------------------------
    def health(self) -> dict:
        """For status reports: levels and the latest failed build (``levels.health``), and where
        damaged database files were moved aside (empty when none was)."""
        with self._lock:
            report = self._levels.health()
        report["database_moved_aside"] = [str(p) for p in self.db.moved_aside] if self.db is not None else []
        return report

    def check_integrity(self, deep: bool = True) -> None:
        """Raise AssertionError if any two internal structures disagree. ``deep`` also re-encodes
        every resident document and compares with its stored tokens (slow on big workspaces)."""
        with self._lock:
            self._levels.check(self._docs)
            for uri, doc in self._docs.items():
                check_document(uri, doc, self.adapter if deep else None)
            self._history.check()
            evictable = sum(1 for d in self._docs.values() if not d.from_editor)  # the last one used may stay
            if (
                self.memory_budget_tokens is not None
                and self._levels.live_tokens() > self.memory_budget_tokens
                and evictable > 1
            ):
                raise AssertionError("resident tokens exceed the memory budget")
            if self.db is not None:
                self.db.check()

    def flush(self, wait: bool = False) -> None:
        """Queue unsaved documents and pending stats for writing, each group in one transaction;
        ``wait`` blocks until they are committed."""
        with self._lock:
            if self.db is None:
                return
            unsaved = [d for d in self._docs.values() if d.unsaved]
            if unsaved:  # hashes of edited documents are computed by the writer thread
                self.db.save_documents((d.uri, d.hash, d.version, d.text, d.tokens) for d in unsaved)
                for doc in unsaved:
                    doc.unsaved = False
            if self._pending_stats:
                self.db.add_stats({s: (d, a) for s, (d, a) in self._pending_stats.items()})
                self._pending_stats = {}
            self._last_flush = time.monotonic()
            if wait:
                self.db.wait()

    def close(self) -> None:
        self._levels.wait_idle()
        with self._lock:
            if self.db is not None:
                self.flush()
                self.db.close()
                self.db = None
                self._levels.db = None

    def memory_bytes(self) -> int:
        """Bytes held by token arrays, sorted tables, tries and texts (an estimate for reports)."""
        with self._lock:
            texts = sum(len(d.text) for d in self._docs.values() if d.text is not None)
            return self._levels.nbytes() + texts + self._history.nbytes()

    def __enter__(self) -> WorkspaceIndex:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------------
    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _touch(self, doc: Doc) -> None:
        doc.tick = self._tick()
        self._docs.move_to_end(doc.uri)

    def _install(self, doc: Doc, overlay: bool = True) -> None:
        old = self._docs.pop(doc.uri, None)
        if old is not None:
            self._levels.detach(old)
        self._evicted.pop(doc.uri, None)
        self._docs[doc.uri] = doc
        if overlay:
            self._levels.overlay_add(doc)

    def _resident(self, uri: str) -> Doc:
        doc = self._docs.get(uri)
        if doc is not None:
            self._touch(doc)
            return doc
        stored = self.db.document(uri) if self.db is not None else None
        if stored is not None:
            doc = Doc(uri, stored.text, stored.token_ids.copy(), stored.version, stored.hash, self._tick())
        elif uri in self._evicted:
            text, version = self._evicted.pop(uri)
            doc = Doc(uri, text, self.adapter.encode_array(text), version, content_hash(text), self._tick())
        else:
            raise KeyError(f"no document {uri!r} in the index")
        self._install(doc)
        self._maintain(keep=doc)
        return doc

    def _maintain(self, keep: Doc | None = None) -> None:
        budget = self.memory_budget_tokens
        if budget is not None and self._levels.live_tokens() > budget:
            # Least recently used first; never ``keep`` (being used now) or an open editor buffer.
            for victim in [d for d in self._docs.values() if d is not keep and not d.from_editor]:
                self._evict(victim)
                if self._levels.live_tokens() <= budget:
                    break
        self._levels.maintain()

    def _evict(self, doc: Doc) -> None:
        if doc.unsaved and self.db is not None:
            self.db.save_documents([(doc.uri, doc.hash, doc.version, doc.text, doc.tokens)])
        if self.db is None:
            self._evicted[doc.uri] = (doc.text, doc.version)
        self._levels.detach(doc)
        del self._docs[doc.uri]
        log.debug("index: evicted %s (%d tokens)", doc.uri, len(doc.tokens))

    def _flush_if_due(self) -> None:
        if self.db is not None and time.monotonic() - self._last_flush >= self.flush_seconds:
            self.flush()
