"""Documents, the immutable levels that index them, and the overlay of recently changed ones.

See :mod:`index.store` for why the index is layered. This module owns the bookkeeping: which
document lives where, which level entries are dead, when to build, merge or rebuild a level.

A build that fails (here or on the merge worker) changes nothing: every level is built before
anything is swapped, so the old levels keep answering. The failure is logged with its
traceback, kept in ``last_error`` / :meth:`LevelSet.health` until a build succeeds, and the
next change retries (backing off after repeated failures).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import numpy as np

from codespec.index.ngram import NgramTable, scan_longest
from codespec.index.persist import content_hash, table_fingerprint
from codespec.index.tokens import TokenizerAdapter
from codespec.index.writebehind import WriteBehindDB

HOT_DOCUMENTS = 4  # most recently changed overlay documents stay scanned (they are being edited)
OVERLAY_DOCUMENTS = 64  # more overlay documents than this also triggers a new level
RANGE_SAMPLE = 4096  # most level entries examined per lookup
RETRY_MAX_S = 60.0  # longest wait before retrying a failed level build after repeated failures

log = logging.getLogger("codespec.index")


@dataclass(frozen=True)
class MaintenanceError:
    """A level build, rebuild or merge that failed. The levels it would have replaced stay in
    place (they are still valid), and the next maintenance retries it."""

    what: str  # "merge of 2 levels (12,345 live tokens) on the worker thread", ...
    error: str  # "ValueError: ..."
    time: float  # time.time() of the failure
    failures: int  # consecutive failures so far


@dataclass(eq=False)
class Doc:
    uri: str
    text: str
    tokens: np.ndarray  # [T] token ids; a view into its level's array while it lives in one
    version: int
    hash: str | None  # content hash; None while edits are unsaved and it was not needed yet
    changed: int  # clock tick of the last content change (recency)
    tick: int = 0  # clock tick of the last use (LRU)
    starts: np.ndarray | None = None  # [T] character start of each token, computed on first edit
    level: Level | None = None
    slot: int = -1
    unsaved: bool = False
    from_editor: bool = False  # set by add/update_document: an open buffer, which disk scans must not clobber

    def __post_init__(self) -> None:
        self.tick = self.tick or self.changed


class Level:
    def __init__(self, docs: Sequence[Doc], table: NgramTable, fingerprint: str) -> None:
        self.docs = list(docs)
        self.table = table
        self.fingerprint = fingerprint
        self.alive = np.ones(len(self.docs), dtype=bool)
        self.changed = np.array([d.changed for d in self.docs], dtype=np.int64)
        self.total = int(table.doc_lengths.sum())
        self.live = self.total  # tokens of live entries


class LevelSet:
    def __init__(
        self,
        adapter: TokenizerAdapter,
        max_ngram: int,
        min_ngram: int,
        trie_depth: int,
        overlay_tokens: int,
        db: WriteBehindDB | None,
        hot_documents: int = HOT_DOCUMENTS,
        lock: threading.RLock | None = None,
        background_tokens: int = 1 << 20,
    ) -> None:
        self.adapter, self.max_ngram, self.min_ngram = adapter, max_ngram, min_ngram
        self.hot_documents = hot_documents
        self.lock = lock if lock is not None else threading.RLock()  # the index's lock
        self.background_tokens = background_tokens
        self._worker: threading.Thread | None = None
        self.deferred: list | None = None  # tests: collect background jobs instead of starting them
        self.trie_depth, self.overlay_tokens, self.db = trie_depth, overlay_tokens, db
        self.levels: list[Level] = []
        self.overlay: dict[str, Doc] = {}  # in order of last change
        self.last_error: MaintenanceError | None = None  # the latest failed build, until one succeeds
        self._failures = 0  # consecutive failed builds
        self._retry_at = 0.0  # time.monotonic() before which maintain() does not build again

    # -- membership -----------------------------------------------------------------------------
    def overlay_add(self, doc: Doc) -> None:
        if doc.tokens.base is not None:
            doc.tokens = doc.tokens.copy()  # do not pin a level's array
        self.overlay.pop(doc.uri, None)
        self.overlay[doc.uri] = doc

    def detach(self, doc: Doc) -> None:
        """Take a document out of matching (before an edit, eviction or removal)."""
        if doc.level is not None:
            doc.level.alive[doc.slot] = False
            doc.level.live -= len(doc.tokens)
            doc.level, doc.slot = None, -1
        if self.overlay.get(doc.uri) is doc:
            del self.overlay[doc.uri]

    def live_tokens(self) -> int:
        return sum(level.live for level in self.levels) + sum(len(d.tokens) for d in self.overlay.values())

    def nbytes(self) -> int:
        return sum(level.table.nbytes() for level in self.levels) + sum(d.tokens.nbytes for d in self.overlay.values())

    # -- levels ---------------------------------------------------------------------------------
    def add_level(self, docs: Sequence[Doc]) -> None:
        """A new level over ``docs``. If it cannot be built, they are matched from the overlay
        instead (nothing is lost; the failure is logged and kept in ``last_error``)."""
        if not docs:
            return
        try:
            fingerprint = self.fingerprint(docs)
            built = self.build(docs, self.stored_table(fingerprint, docs))
        except Exception as error:
            self._failed(f"new level of {len(docs)} documents", error)
            for doc in docs:
                if doc.level is None:
                    self.overlay_add(doc)
            return
        self.install(docs, built, fingerprint)
        self._succeeded()

    # A level is made in three steps so that a caller can run the slow middle one (the sort)
    # without holding the index's lock: fingerprint + stored_table (reads the database), build
    # (pure), install (binds the documents).
    def fingerprint(self, docs: Sequence[Doc]) -> str:
        entries = [(d.uri, d.hash or content_hash(d.text)) for d in docs]
        return table_fingerprint(self.adapter.fingerprint, (self.max_ngram, self.min_ngram, self.trie_depth), entries)

    def stored_table(self, fingerprint: str, docs: Sequence[Doc]):
        if self.db is None:
            return None
        index_dtype = np.int32 if sum(len(d.tokens) + 1 for d in docs) < 2**31 else np.int64
        return self.db.load_table(fingerprint, index_dtype)

    def build(self, docs: Sequence[Doc], stored, arrays: Sequence[np.ndarray] | None = None) -> tuple[NgramTable, bool]:
        arrays = [d.tokens for d in docs] if arrays is None else arrays
        if stored is not None:
            order, groups = stored
            try:
                if not _stored_table_fits(order, groups, sum(len(a) + 1 for a in arrays) + 1):
                    raise ValueError("positions or groups out of range")
                return NgramTable(
                    arrays,
                    self.adapter.dtype,
                    self.adapter.sep,
                    self.max_ngram,
                    self.min_ngram,
                    self.trie_depth,
                    order=order,
                    groups=groups,
                ), True
            except (ValueError, IndexError, OverflowError) as error:  # damaged: sort again (and save anew)
                log.warning(
                    "index: the stored table of %d documents is unusable (%s); sorting again", len(arrays), error
                )
        table = NgramTable(
            arrays, self.adapter.dtype, self.adapter.sep, self.max_ngram, self.min_ngram, self.trie_depth
        )
        return table, False

    def install(
        self,
        docs: Sequence[Doc],
        built: tuple[NgramTable, bool],
        fingerprint: str,
        dead: AbstractSet[int] = frozenset(),
        position: int | None = None,
    ) -> None:
        """Bind documents to a built table; slots in ``dead`` start dead (changed meanwhile).
        ``position`` keeps the levels ordered oldest (largest) first after a merge."""
        table, was_stored = built
        level = Level(docs, table, fingerprint)  # first: nothing changes if this fails
        for slot, doc in enumerate(docs):
            if slot in dead:
                level.alive[slot] = False
                level.live -= int(table.doc_lengths[slot])
                continue
            self.detach(doc)
            start = int(table.doc_starts[slot])
            doc.tokens = table.tokens[start : start + len(doc.tokens)]
            doc.level, doc.slot = level, slot
        self.levels.insert(len(self.levels) if position is None else position, level)
        if self.db is not None and not was_stored:
            self.db.save_table(fingerprint, table.order, table.groups(), keep=[lv.fingerprint for lv in self.levels])

    def maintain(self) -> None:
        """Move cold overlay documents into a level; drop, rebuild and merge levels. Rebuilds
        and merges of more than ``background_tokens`` live tokens run on a worker thread (the
        old levels keep answering meanwhile), smaller ones right here. After a failed build the
        next call retries; after repeated failures, retries back off (up to ``RETRY_MAX_S``)."""
        if time.monotonic() < self._retry_at:
            return
        overlay = list(self.overlay.values())
        cold = overlay[: -self.hot_documents] if len(overlay) > self.hot_documents else []
        if cold and (sum(len(d.tokens) for d in overlay) > self.overlay_tokens or len(overlay) > OVERLAY_DOCUMENTS):
            self.add_level(cold)
            if self._failures:
                return
        while True:
            plan = next(([level] for level in self.levels if level.live * 2 < level.total), None)
            if plan is None and len(self.levels) > 1 and self.levels[-1].live * 4 >= self.levels[-2].live:
                plan = self.levels[-2:]
            if plan is None:
                return
            if sum(level.live for level in plan) <= self.background_tokens:
                if not self._replace(plan):
                    return
            else:
                self._replace_in_background(plan)
                return

    def _replace(self, old: list[Level]) -> bool:
        """Rebuild or merge ``old`` into one level, here; False (old levels kept) if that fails."""
        docs = [d for level in old for d, alive in zip(level.docs, level.alive) if alive]
        built = None
        if docs:
            try:  # build before changing anything: a failure leaves the old levels answering
                fingerprint = self.fingerprint(docs)
                built = self.build(docs, self.stored_table(fingerprint, docs))
            except Exception as error:
                self._failed(_describe(old), error)
                return False
        position = self.levels.index(old[0])
        for level in old:
            self.levels.remove(level)
        for doc in docs:
            doc.level, doc.slot = None, -1
        if built is not None:
            self.install(docs, built, fingerprint, position=position)
        self._succeeded()
        return True

    def _replace_in_background(self, old: list[Level]) -> None:
        """Snapshot now (under the caller's lock); sort on a worker; install under the lock,
        marking dead whatever changed meanwhile; give up if the old levels are gone."""
        if self._worker is not None and self._worker.is_alive():
            return  # one at a time; the next maintain() call plans again
        entries = [
            (d, level, slot) for level in old for slot, (d, alive) in enumerate(zip(level.docs, level.alive)) if alive
        ]
        docs = [d for d, _, _ in entries]
        arrays = [d.tokens for d in docs]
        fingerprint = self.fingerprint(docs)
        stored = self.stored_table(fingerprint, docs)

        def job() -> None:
            try:
                built = self.build(docs, stored, arrays)
            except Exception as error:  # old levels untouched; logged, kept, retried
                with self.lock:
                    self._failed(_describe(old) + " on the worker thread", error)
                return
            with self.lock:
                if any(level not in self.levels for level in old):
                    return
                dead = {
                    n
                    for n, (d, level, slot) in enumerate(entries)
                    if d.level is not level or d.slot != slot or not level.alive[slot]
                }
                position = self.levels.index(old[0])
                for level in old:
                    self.levels.remove(level)
                for n, doc in enumerate(docs):
                    if n not in dead:
                        doc.level, doc.slot = None, -1
                self.install(docs, built, fingerprint, dead, position)
                self._succeeded()

        if self.deferred is not None:
            self.deferred.append(job)
            return
        self._worker = threading.Thread(target=job, name="codespec-index-merge", daemon=True)
        self._worker.start()

    def _failed(self, what: str, error: Exception) -> None:
        self._failures += 1
        backoff = 0.0 if self._failures == 1 else min(RETRY_MAX_S, 2.0 ** (self._failures - 2))
        self._retry_at = time.monotonic() + backoff
        self.last_error = MaintenanceError(what, f"{type(error).__name__}: {error}", time.time(), self._failures)
        log.error(
            "index: %s failed (%s); the current levels stay in use, retry %s",
            what,
            self.last_error.error,
            "at the next change" if not backoff else f"in {backoff:.0f} s",
            exc_info=error,
        )

    def _succeeded(self) -> None:
        if self._failures:
            log.info("index: level maintenance works again after %d failure(s)", self._failures)
        self._failures, self._retry_at, self.last_error = 0, 0.0, None

    def health(self) -> dict:
        """For status reports: level count and sizes, the overlay, and the latest build failure."""
        error = self.last_error
        return {
            "levels": len(self.levels),
            "level_live_tokens": [level.live for level in self.levels],
            "overlay_documents": len(self.overlay),
            "merge_running": self._worker is not None and self._worker.is_alive(),
            "last_error": None
            if error is None
            else {"what": error.what, "error": error.error, "time": error.time, "failures": error.failures},
        }

    def wait_idle(self) -> None:
        """Block until a background rebuild or merge has been installed (tests, shutdown)."""
        worker = self._worker
        if worker is not None:
            worker.join()

    # -- matching -------------------------------------------------------------------------------
    def match(
        self, reversed_context: list[int], same: Doc | None, cursor: int | None, cap: int, skip: int | None = None
    ) -> list[tuple[int, Doc, np.ndarray]]:
        """(match length, document, continuation offsets) per document with a match, each
        source's longest; at most ``cap`` offsets per source, the nearest to ``cursor`` / newest
        first; in ``same``, not the one at ``skip``."""
        found = []
        if same is not None:
            match = scan_longest(same.tokens, reversed_context, self.max_ngram, self.min_ngram)
            positions = match.positions
            if skip is not None:
                positions = positions[positions != skip]
            if cursor is not None and len(positions) > cap:
                positions = positions[np.argsort(np.abs(positions - cursor), kind="stable")[:cap]]
            if len(positions):
                found.append((match.length, same, positions[-cap:]))
        for doc in self.overlay.values():
            if doc is not same:
                match = scan_longest(doc.tokens, reversed_context, self.max_ngram, self.min_ngram)
                if match.length:
                    found.append((match.length, doc, match.positions[-cap:]))
        for level in self.levels:
            found.extend(self._match_level(level, reversed_context, same, cap))
        return found

    def _match_level(self, level: Level, reversed_context: list[int], same: Doc | None, cap: int):
        table = level.table
        for length, positions in table.matches(reversed_context):
            step = -(-len(positions) // RANGE_SAMPLE)  # a short, common match: look at an even sample
            positions = positions[::step].astype(np.int64)
            docs, offsets = table.locate(positions)
            keep = level.alive[docs]
            if same is not None and same.level is level:
                keep &= docs != same.slot
            if not keep.any():
                continue  # only dead documents match this deep: back off to a shorter match
            docs, offsets = docs[keep], offsets[keep]
            if len(docs) > cap:  # newest documents first
                chosen = np.argsort(-level.changed[docs], kind="stable")[:cap]
                docs, offsets = docs[chosen], offsets[chosen]
            # grouped by document in Python: a few dozen entries at most, where np.unique's calls
            # cost more (and its first call imports numpy.ma, some 20 ms inside a step)
            by_slot: dict[int, list[int]] = {}
            for slot, offset in zip(docs.tolist(), offsets.tolist()):
                by_slot.setdefault(slot, []).append(offset)
            return [
                (length, level.docs[slot], np.array(found, dtype=offsets.dtype))
                for slot, found in sorted(by_slot.items())
            ]
        return []

    # -- checks ---------------------------------------------------------------------------------
    def check(self, resident: dict[str, Doc]) -> None:
        placed: dict[str, str] = {}
        for number, level in enumerate(self.levels):
            table = level.table
            live = 0
            for slot, (doc, alive) in enumerate(zip(level.docs, level.alive)):
                if not alive:
                    continue
                live += int(table.doc_lengths[slot])
                if resident.get(doc.uri) is not doc or doc.level is not level or doc.slot != slot:
                    raise AssertionError(f"level {number}: live entry {doc.uri} is not that resident document")
                start = int(table.doc_starts[slot])
                if len(doc.tokens) != table.doc_lengths[slot] or not np.array_equal(
                    doc.tokens, table.tokens[start : start + len(doc.tokens)]
                ):
                    raise AssertionError(f"level {number}: tokens of {doc.uri} disagree with the level")
                if doc.uri in placed:
                    raise AssertionError(f"{doc.uri} is in two places")
                placed[doc.uri] = f"level {number}"
            if live != level.live:
                raise AssertionError(f"level {number}: live count {level.live}, entries say {live}")
            _check_table(table, number)
        for uri, doc in self.overlay.items():
            if resident.get(uri) is not doc or doc.level is not None or uri in placed:
                raise AssertionError(f"overlay entry {uri} is not a resident document outside the levels")
            placed[uri] = "overlay"
        missing = set(resident) - set(placed)
        if missing:
            raise AssertionError(f"resident documents not matched anywhere: {sorted(missing)[:3]}")


def _stored_table_fits(order: np.ndarray, groups: np.ndarray, total_tokens: int) -> bool:
    """Cheap bounds checks on a persisted table (a damaged one must not index out of range)."""
    if len(order) > total_tokens or (len(order) and (int(order.min()) < 0 or int(order.max()) >= total_tokens)):
        return False
    if groups.ndim != 2 or groups.shape[1] != 4:
        return False
    lo, hi = groups[:, 2], groups[:, 3]
    return bool(np.all((lo >= 0) & (lo <= hi) & (hi <= len(order))))


def _describe(levels: Sequence[Level]) -> str:
    live = sum(level.live for level in levels)
    if len(levels) == 1:
        return f"rebuild of a level ({live:,} live tokens)"
    return f"merge of {len(levels)} levels ({live:,} live tokens)"


def _check_table(table: NgramTable, number: int) -> None:
    """``order`` is sorted as :func:`index.ngram.sort_positions` promises, and each sampled trie
    group is exactly its prefix run."""
    from codespec.index.ngram import DEEP_SORT_GROUP, _word_layout, sort_words

    bits, per_word = _word_layout(table.tokens.dtype)
    words = sort_words(table.tokens, table.order, table.max_ngram)
    first = words[0]
    if len(first) > 1 and not np.all(first[1:] >= first[:-1]):
        raise AssertionError(f"level {number}: positions are not sorted by their nearest tokens")
    if len(words) > 1 and len(first) > 1:
        starts = np.flatnonzero(np.concatenate([[True], first[1:] != first[:-1]]))
        sizes = np.diff(np.append(starts, len(first)))
        big = np.repeat(sizes > DEEP_SORT_GROUP, sizes)
        pair = big[:-1] & (first[1:] == first[:-1])  # consecutive entries of one large group
        equal, disorder = np.ones(len(pair), dtype=bool), np.zeros(len(pair), dtype=bool)
        for word in words[1:]:
            disorder |= equal & (word[:-1] > word[1:])
            equal &= word[:-1] == word[1:]
        if np.any(pair & disorder):
            raise AssertionError(f"level {number}: a large group is not sorted by its deeper tokens")
    for key, gid in itertools.islice(table.automaton.items(), 256):
        lo, hi = int(table.group_lo[gid]), int(table.group_hi[gid])
        k = len(key)
        prefix = first >> np.uint64(bits * (per_word - k))
        value = 0
        for ch in key:
            value = (value << bits) | (ord(ch) - 1)
        inside = np.flatnonzero(prefix == np.uint64(value))
        if len(inside) != hi - lo or (len(inside) and (inside[0] != lo or inside[-1] != hi - 1)):
            raise AssertionError(f"level {number}: trie group {key!r} does not match its range")


def check_document(uri: str, doc: Doc, adapter: TokenizerAdapter | None = None) -> None:
    """Raise AssertionError if a resident document disagrees with itself; with ``adapter``, also
    with a fresh encode of its text (slow on big workspaces)."""
    if doc.uri != uri or doc.tokens is None or doc.text is None:
        raise AssertionError(f"{uri}: resident document without text or tokens")
    if doc.starts is not None and len(doc.starts) != len(doc.tokens):
        raise AssertionError(f"{uri}: {len(doc.starts)} starts for {len(doc.tokens)} tokens")
    if doc.hash is not None and doc.hash != content_hash(doc.text):
        raise AssertionError(f"{uri}: content hash is stale")
    if adapter is not None:
        expected = adapter.encode_array(doc.text)
        if not np.array_equal(expected, doc.tokens):
            raise AssertionError(f"{uri}: tokens differ from a fresh encode of the text")
        if doc.starts is not None and not np.array_equal(adapter.char_starts(doc.text, expected), doc.starts):
            raise AssertionError(f"{uri}: token starts differ from a fresh encode")
