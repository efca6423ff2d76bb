"""What the user just did: the one owner of recent edits, per document and across the workspace.

Every door that sees a document change (the LSP's ``didChange``, the websocket and HTTP doors'
documents) records it here as it happens, before any debounce, so nothing is collapsed away.
Next-edit requests read it: the prompts show the edits as diffs, the next-edit proposer turns them
into rules (docs/next-edit.md). The index keeps its own token store of replaced text for lookup;
this is the record of *edits*.

- Keystrokes merge: a change that touches (or adjoins) the newest edit of its document within
  ``merge_s`` becomes part of it, so typing ``fetch_all`` over ``fetch`` is one edit, not nine.
- Undo is recognised: a change that brings the edited span back to what it was removes the edit
  (an editor's undo, or typing it back by hand).
- Bounded whatever arrives: at most ``max_edits`` per document and ``max_documents`` documents
  (least recently edited dropped first); an edit's texts are kept up to ``max_chars`` each, and a
  longer one (a huge paste, a binary blob) is kept as a truncated marker that makes no rules.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, replace

MAX_EDITS = 32
MAX_DOCUMENTS = 64
MAX_CHARS = 2048
MERGE_S = 2.0


@dataclass(frozen=True)
class RecordedEdit:
    """One edit of one document: characters [start, start + len(old)) became ``new``."""

    uri: str
    start: int  # code point offset in the text the edit was made in
    old: str
    new: str
    line_before: str  # the rest of the first touched line before ``start``
    line_after: str  # the rest of the last touched line after the edit
    time: float  # time.monotonic() of its last keystroke
    version: int | None = None
    truncated: bool = False  # over ``max_chars``: shown as a size, never turned into rules

    @property
    def before(self) -> str:
        """The touched lines before the edit."""
        return self.line_before + self.old + self.line_after

    @property
    def after(self) -> str:
        """The same lines after it."""
        return self.line_before + self.new + self.line_after

    @property
    def end(self) -> int:
        """Where the edited span ends in the text after the edit."""
        return self.start + len(self.new)


class EditHistory:
    """Recent edits by document; thread-safe (doors record on the event loop, jobs read anywhere)."""

    def __init__(
        self,
        max_edits: int = MAX_EDITS,
        max_documents: int = MAX_DOCUMENTS,
        max_chars: int = MAX_CHARS,
        merge_s: float = MERGE_S,
    ) -> None:
        self.max_edits, self.max_documents, self.max_chars, self.merge_s = max_edits, max_documents, max_chars, merge_s
        self._edits: collections.OrderedDict[str, list[RecordedEdit]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def record(
        self,
        uri: str,
        text: str,
        start: int,
        end: int,
        new_text: str,
        version: int | None = None,
        now: float | None = None,
    ) -> RecordedEdit | None:
        """Characters [start, end) of ``text`` (the document before the change) become ``new_text``.
        Returns the document's newest edit after merging (None when the change undid it or was empty)."""
        if start == end and not new_text:
            return None
        now = time.monotonic() if now is None else now
        removed = text[start:end]
        with self._lock:
            edits = self._edits.setdefault(uri, [])
            self._edits.move_to_end(uri)
            last = edits[-1] if edits else None
            if (
                last is not None
                and not last.truncated
                and now - last.time <= self.merge_s
                and _touches(last, start, end)
            ):
                merged = self._merge(last, text, start, end, removed, new_text, now, version)
                edits.pop()
                if merged is None:
                    return None
                edit = merged
            else:
                edit = self._fresh(uri, text, start, end, removed, new_text, now, version)
            if edits and _undoes(edits[-1], edit):
                edits.pop()
                return None
            edits.append(edit)
            del edits[: -self.max_edits]
            while len(self._edits) > self.max_documents:
                self._edits.popitem(last=False)
            return edit

    def recent(self, uri: str | None = None, limit: int = 8) -> list[RecordedEdit]:
        """The newest ``limit`` edits, oldest first: of one document, or across every document."""
        with self._lock:
            if uri is not None:
                return list(self._edits.get(uri, ())[-limit:])
            every = [edit for edits in self._edits.values() for edit in edits]
        return sorted(every, key=lambda edit: edit.time)[-limit:]

    def forget(self, uri: str) -> None:
        with self._lock:
            self._edits.pop(uri, None)

    def clear(self) -> None:
        with self._lock:
            self._edits.clear()

    def __len__(self) -> int:
        with self._lock:
            return sum(len(edits) for edits in self._edits.values())

    def edit_for(
        self, uri: str, text: str, start: int, end: int, new_text: str, version: int | None = None
    ) -> RecordedEdit:
        """The edit [start, end) of ``text`` -> ``new_text`` would be on its own, without recording it
        (what accepting a suggestion will add: the next request can be speculated before it comes)."""
        return self._fresh(uri, text, start, end, text[start:end], new_text, time.monotonic(), version)

    # -- building edits ----------------------------------------------------------------------------
    def _fresh(self, uri, text, start, end, removed, new_text, now, version) -> RecordedEdit:
        edit = RecordedEdit(
            uri, start, removed, new_text, _line_prefix(text, start), _line_suffix(text, end), now, version
        )
        return self._bounded(edit)

    def _merge(self, last, text, start, end, removed, new_text, now, version) -> RecordedEdit | None:
        """``last`` with the change folded in: the union of both spans, in the text before ``last``."""
        union_start = min(start, last.start)
        union_end = max(end, last.end)  # in ``text`` (after ``last``)
        grown_before = removed[: max(0, last.start - start)]  # removed text left of last's span
        grown_after = removed[len(removed) - max(0, end - last.end) :] if end > last.end else ""
        old = grown_before + last.old + grown_after
        current = text[union_start:union_end]
        new = current[: start - union_start] + new_text + current[end - union_start :]
        if old == new:
            return None  # typed back to what it was
        line_before = last.line_before if union_start == last.start else _line_prefix(text, union_start)
        line_after = last.line_after if union_end == last.end else _line_suffix(text, union_end)
        return self._bounded(RecordedEdit(last.uri, union_start, old, new, line_before, line_after, now, version))

    def _bounded(self, edit: RecordedEdit) -> RecordedEdit:
        """Texts over ``max_chars`` are cut and the edit marked; the lines' rest around it (a
        minified file's one line) is only clipped: a small edit there still repeats."""
        limit, context = self.max_chars, self.max_chars // 4
        if len(edit.line_before) > context or len(edit.line_after) > context:
            edit = replace(edit, line_before=edit.line_before[-context:], line_after=edit.line_after[:context])
        if len(edit.old) <= limit and len(edit.new) <= limit:
            return edit
        return replace(edit, old=edit.old[:limit], new=edit.new[:limit], truncated=True)


def _touches(last: RecordedEdit, start: int, end: int) -> bool:
    """Whether a change of [start, end) overlaps or adjoins ``last``'s span in the current text."""
    return start <= last.end and end >= last.start


def _undoes(previous: RecordedEdit, edit: RecordedEdit) -> bool:
    """An editor's undo arrives as one change restoring the previous edit's span."""
    return edit.start == previous.start and edit.old == previous.new and edit.new == previous.old


def _line_prefix(text: str, at: int) -> str:
    return text[text.rfind("\n", 0, at) + 1 : at]


def _line_suffix(text: str, at: int) -> str:
    end = text.find("\n", at)
    return text[at : len(text) if end < 0 else end]
