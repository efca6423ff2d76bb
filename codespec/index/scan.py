"""A workspace scan: find files, decide what each needs, tokenize, sort, install.

:func:`run` (behind :meth:`index.store.WorkspaceIndex.index_workspace`) does the slow part
(reading files, hashing, tokenizing, sorting) without the index's lock; the index's own
:class:`ScanSite` steps take the lock only to snapshot the resident documents, to read stored
tokens a batch at a time and to install the result.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from codespec.index.discovery import Found, Skipped, discover
from codespec.index.ingest import ScanCancelled
from codespec.index.levels import Doc
from codespec.index.persist import StoredDocument, content_hash
from codespec.index.tokens import TokenizerAdapter

BATCH_FILES = 128  # files per tokenizer call (the Rust backend parallelises inside a batch)


@dataclass
class IndexReport:
    """What one ``index_workspace`` call did (counts of files, sizes in characters and tokens)."""

    files: int = 0
    unchanged: int = 0  # already in memory with the same content, or open in the editor (the buffer wins)
    reused: int = 0  # tokens read back from the database (same content hash)
    tokenized: int = 0
    removed: int = 0  # previously indexed files no longer found under the roots
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    bytes: int = 0
    tokens: int = 0
    seconds: float = 0.0  # wall time of the whole call
    tokenize_seconds: float = 0.0  # of which: the tokenizer
    table_seconds: float = 0.0  # of which: sorting positions and building the trie


def find_files(roots: Sequence[Path], exclude: Sequence[str], max_file_bytes: int, report: IndexReport) -> list[Found]:
    found = []
    for item in discover([Path(r) for r in roots], exclude, max_file_bytes):
        if isinstance(item, Skipped):
            report.skipped.append((str(item.path), item.reason))
        else:
            found.append(item)
    report.files = len(found)
    report.bytes = sum(len(item.text) for item in found)
    return found


def classify(
    found: Sequence[Found], resident: Mapping[str, Doc], stored: Mapping[str, str], report: IndexReport
) -> tuple[dict[str, tuple[Found, str]], list[tuple[Found, str]]]:
    """Split files into (reusable from the database by uri, to tokenize); count the unchanged."""
    to_load, to_tokenize = {}, []
    for item in found:
        digest = content_hash(item.text)
        current = resident.get(item.uri)
        if current is not None and (current.from_editor or (current.hash or content_hash(current.text)) == digest):
            report.unchanged += 1
        elif stored.get(item.uri) == digest:
            to_load[item.uri] = (item, digest)
        else:
            to_tokenize.append((item, digest))
    return to_load, to_tokenize


def documents(
    found: Sequence[Found],
    to_load: Mapping[str, tuple[Found, str]],
    to_tokenize: list[tuple[Found, str]],
    load: Callable[[list[str]], list[StoredDocument]],
    adapter: TokenizerAdapter,
    tick: int,
    report: IndexReport,
    progress: Callable[[int], None],
) -> list[Doc]:
    """The scanned files as documents, in discovery order (the same workspace gives the same table):
    tokens read back through ``load`` (one batch of uris per call) where the database has this
    content, the rest tokenized."""
    docs: list[Doc] = []
    if to_load:
        rows: list[StoredDocument] = []
        wanted = list(to_load)
        for batch_start in range(0, len(wanted), BATCH_FILES):
            batch = load(wanted[batch_start : batch_start + BATCH_FILES])
            rows += batch
            progress(len(batch))
        docs = [Doc(r.uri, to_load[r.uri][0].text, r.token_ids, r.version, to_load[r.uri][1], tick) for r in rows]
        report.reused = len(rows)
        to_tokenize = to_tokenize + [to_load[u] for u in set(to_load) - {r.uri for r in rows}]  # rows gone meanwhile
    docs += tokenize(adapter, to_tokenize, tick, report, progress)
    rank = {item.uri: n for n, item in enumerate(found)}
    docs.sort(key=lambda d: rank[d.uri])
    return docs


def tokenize(
    adapter: TokenizerAdapter,
    items: Sequence[tuple[Found, str]],
    tick: int,
    report: IndexReport,
    progress: Callable[[int], None] | None = None,
) -> list[Doc]:
    docs = []
    started = time.perf_counter()
    for batch_start in range(0, len(items), BATCH_FILES):
        batch = items[batch_start : batch_start + BATCH_FILES]
        arrays = adapter.encode_batch([item.text for item, _ in batch])
        for (item, digest), tokens in zip(batch, arrays):
            doc = Doc(item.uri, item.text, tokens, 0, digest, tick)
            doc.unsaved = True
            docs.append(doc)
        report.tokenized += len(batch)
        if progress:
            progress(len(batch))
    report.tokenize_seconds += time.perf_counter() - started
    return docs


class ScanSite(Protocol):
    """What a scan needs of the index it fills (each step takes the index's lock itself)."""

    def scan_snapshot(self) -> tuple[dict[str, Doc], dict[str, str], int]: ...
    def load_stored(self, uris: list[str]) -> list[StoredDocument]: ...
    def scan_table(self, fresh: list[Doc], report: IndexReport) -> tuple[str, Any]: ...
    def install_scan(
        self,
        roots: Sequence[Path],
        seen: set[str],
        resident: Mapping[str, Doc],
        fresh: list[Doc],
        table: Any,
        report: IndexReport,
    ) -> None: ...


def run(
    site: ScanSite,
    roots: Sequence[Path],
    exclude: Sequence[str],
    max_file_bytes: int,
    adapter: TokenizerAdapter,
    progress: Callable[[int, int], None] | None = None,
    cancel: Callable[[], bool] | None = None,
) -> IndexReport:
    """One scan of ``roots`` into ``site`` (see :meth:`index.store.WorkspaceIndex.index_workspace`)."""

    def check_cancel() -> None:
        if cancel is not None and cancel():
            raise ScanCancelled("workspace scan cancelled")

    started = time.perf_counter()
    report = IndexReport()
    found = find_files(roots, exclude, max_file_bytes, report)
    check_cancel()
    resident, stored, tick = site.scan_snapshot()
    to_load, to_tokenize = classify(found, resident, stored, report)
    done = [report.unchanged]

    def advance(count: int) -> None:
        done[0] += count
        if progress:
            progress(done[0], report.files)
        check_cancel()

    fresh = documents(found, to_load, to_tokenize, site.load_stored, adapter, tick, report, advance)
    table = None
    if fresh:
        table = site.scan_table(fresh, report)  # the sort: no lock held (table_seconds)
    check_cancel()
    site.install_scan(roots, {item.uri for item in found}, resident, fresh, table, report)  # removed, tokens
    report.seconds = time.perf_counter() - started
    return report


def stale(roots: Sequence[Path], seen: set[str], uris: Iterable[str]) -> set[str]:
    """The ``uris`` under ``roots`` not ``seen`` by a scan."""
    prefixes = [Path(r).absolute().as_uri().rstrip("/") + "/" for r in roots]
    return {u for u in uris if u not in seen and any(u.startswith(p) for p in prefixes)}
