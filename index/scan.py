"""The lock-free steps of a workspace scan: find files, decide what each needs, tokenize.

:meth:`index.store.WorkspaceIndex.index_workspace` runs these without holding the index's lock
(they read files, hash and tokenize: the slow part) and takes the lock only to snapshot the
resident documents and to install the result.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from index.discovery import Found, Skipped, discover
from index.levels import Doc
from index.persist import StoredDocument, content_hash
from index.tokens import TokenizerAdapter

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


def reuse(rows: Sequence[StoredDocument], to_load: Mapping[str, tuple[Found, str]], tick: int) -> list[Doc]:
    return [
        Doc(row.uri, to_load[row.uri][0].text, row.token_ids, row.version, to_load[row.uri][1], tick) for row in rows
    ]


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
