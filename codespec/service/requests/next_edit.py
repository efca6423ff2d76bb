"""Next-edit requests: after an edit, the rewrite of the window where it applies next (docs/next-edit.md).

Plain functions, no server: a door hands the document text, the cursor and the document's recent
edits (``service.edit_history``), and gets a ``GenerationRequest`` and a ``NextEditPlan``; when the
job is done, :func:`suggestion` turns its text into the one replacement to show (the smallest
span that changed), or None when the model left the window as it was.

The editable window is a few lines around the cursor; when the last edits' rules (``proposers.
edit_rules``) change nothing there, it moves to the nearest place in the document where they do
(the next use of a renamed name, the next call of a changed function), after the cursor first;
when they change nothing in the document, to the first place they change in another document the
door offers (its other open documents, then the workspace index's files), and the plan names that
document.
"""

from __future__ import annotations

import bisect
import difflib
import functools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from codespec.core.next_edit_prompts import (
    EDITABLE_END,
    EDITABLE_START,
    START_OF_FILE,
    EditEvent,
    edits_instruction,
    zeta_prompt,
    zeta_region,
)
from codespec.core.prompts import Prompt, Rewrite
from codespec.proposers.edit_rules import anchors, predict
from codespec.service.requests.edit_history import RecordedEdit
from codespec.service.requests.positions import LineIndex, changed_span
from codespec.service.requests.schema import GenerationRequest, RequestKind, Sampling, request_of

LINES_BEFORE = 2  # editable window: lines above the cursor's line
LINES_AFTER = 6  # and below it
CONTEXT_LINES = 3  # Zeta's excerpt: unchanged lines around the window
SEARCH_LINES = 400  # how far from the cursor the window may move to find the next site
SEARCH_CHARS = 100_000  # and at most this many characters of the document on either side
MAX_WINDOW_CHARS = 4000  # a longer window shrinks to the cursor's line; a longer line: no window
RECENT_EDITS = 3
PROBES = 32  # places tried per other document: the first occurrences of the rules' anchors
OTHER_CHARS = 16_000_000  # characters of other documents searched per request (a substring scan)


@dataclass(frozen=True)
class NextEditPlan:
    uri: str
    version: int | None
    start: int  # code point offsets of the editable window in the document
    end: int
    window: str
    format: str  # "zeta" or "rewrite"
    moved: bool  # the window is not at the cursor: the rules found the next site elsewhere
    text: str = field(default="", repr=False, compare=False)  # the whole document the window is in


@dataclass(frozen=True)
class OtherDocument:
    """A document the next site may be in: open in the editor (its version), or a file the
    editor has not opened (``version`` None: the client opens it and asks there)."""

    uri: str
    text: str  # what the search reads (for a file: the index's copy, maybe older than the disk)
    version: int | None
    read: Callable[[], str | None] | None = None  # the file's text now (None: gone), asked only of a candidate


@dataclass(frozen=True)
class NextEditSuggestion:
    start: int  # code point offsets in the document
    end: int
    text: str


def choose_window(text: str, cursor: int, edits: Sequence[tuple[str, str]]) -> tuple[int, int, bool]:
    """(start, end, moved): whole lines around the cursor, or around the nearest line the edits'
    rules would change (after the cursor first, then before)."""
    start, end, moved, _ = _locate(text, cursor, edits)
    return start, end, moved


def _locate(text: str, cursor: int, edits: Sequence[tuple[str, str]]) -> tuple[int, int, bool, bool]:
    """``choose_window``'s answer and whether the rules change the window (False: no site found)."""
    starts = LineIndex(text).starts  # the LSP's lines (\n, \r\n, \r)
    line = _line_of(starts, cursor)
    here = _window(text, starts, line)
    if not edits:
        return here[0], here[1], False, False
    if predict(text[here[0] : here[1]], edits) != text[here[0] : here[1]]:
        return here[0], here[1], False, True
    first, last = max(0, line - SEARCH_LINES), min(len(starts) - 1, line + SEARCH_LINES)
    first = max(first, _line_of(starts, max(0, cursor - SEARCH_CHARS)))
    last = min(last, _line_of(starts, min(len(text), cursor + SEARCH_CHARS)))
    region_start = starts[first]
    region_end = starts[last + 1] - 1 if last + 1 < len(starts) else len(text)
    region = text[region_start:region_end]
    changed = _changed_lines(region, predict(region, edits))
    if not changed:
        return here[0], here[1], False, False
    offsets = [first + index for index in changed]
    after = [at for at in offsets if at > line]
    target = after[0] if after else max(offsets)
    start, end = _window(text, starts, target)
    return start, end, True, True


def _window(text: str, starts: Sequence[int], at: int) -> tuple[int, int]:
    """Whole lines (each with its newline) around line ``at``; the line alone when that is too
    long, and an empty window when the line itself is."""

    def lines(first: int, last: int) -> tuple[int, int]:
        return starts[first], starts[last + 1] if last + 1 < len(starts) else len(text)

    start, end = lines(max(0, at - LINES_BEFORE), min(len(starts) - 1, at + LINES_AFTER))
    if end - start > MAX_WINDOW_CHARS:
        start, end = lines(at, at)
    return (start, end) if end - start <= MAX_WINDOW_CHARS else (start, start)


def site_in(text: str, edits: Sequence[tuple[str, str]], found: Sequence[str] | None = None) -> tuple[int, int] | None:
    """The window around the first place in ``text`` the edits' rules change, or None: only the
    lines where one of the rules' anchors occurs are tried, the first ``PROBES`` of them."""
    found = anchors(edits) if found is None else found
    hits: set[int] = set()
    for anchor in found:
        for count, match in enumerate(_whole_tokens(anchor).finditer(text)):
            if count >= PROBES:
                break
            hits.add(match.start())
    if not hits:
        return None
    starts = LineIndex(text).starts
    tried: set[int] = set()
    for offset in sorted(hits):
        line = _line_of(starts, offset)
        if line in tried:
            continue
        tried.add(line)
        if len(tried) > PROBES:
            break
        start, end = _window(text, starts, line)
        if end > start and predict(text[start:end], edits) != text[start:end]:
            return start, end
    return None


@functools.lru_cache(maxsize=64)
def _whole_tokens(anchor: str) -> re.Pattern[str]:
    """``anchor`` where it is whole code tokens (``fetch`` not inside ``prefetch`` or ``fetch_all``)."""
    head = r"(?<!\w)" if re.match(r"\w", anchor) else ""
    tail = r"(?!\w)" if re.search(r"\w$", anchor) else ""
    return re.compile(head + re.escape(anchor) + tail)


def find_site(
    others: Iterable[OtherDocument], edits: Sequence[tuple[str, str]], budget: int = OTHER_CHARS
) -> tuple[OtherDocument, int, int] | None:
    """The first of ``others`` (in the order given) where the edits' rules change something, with
    the window there; ``budget``: characters searched at most (documents past it are skipped)."""
    found = anchors(edits)
    if not found:
        return None
    for other in others:
        budget -= len(other.text)
        if budget < 0:
            return None
        if not any(anchor in other.text for anchor in found):
            continue
        text = other.read() if other.read is not None else other.text
        window = site_in(text, edits, found) if text is not None else None
        if text is not None and window is not None:
            return OtherDocument(other.uri, text, other.version), window[0], window[1]
    return None


def _line_of(starts: Sequence[int], offset: int) -> int:
    return max(0, bisect.bisect_right(starts, offset) - 1)


def _changed_lines(old: str, new: str) -> list[int]:
    """Indexes of ``old``'s lines that differ in ``new`` (the rules keep line counts for renames and
    argument changes; a line-level diff covers the rest)."""
    old_lines, new_lines = old.split("\n"), new.split("\n")
    changed: list[int] = []
    for op, i1, i2, _, _ in difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False).get_opcodes():
        if op != "equal":
            changed.extend(range(i1, max(i2, i1 + 1)))
    return changed


def events_of(edits: Sequence[RecordedEdit], path_of=lambda uri: uri) -> list[EditEvent]:
    return [EditEvent(path_of(edit.uri), edit.before, edit.after, edit.truncated) for edit in edits]


def rule_inputs(edits: Sequence[RecordedEdit]) -> tuple[tuple[str, str], ...]:
    """What the next-edit proposer's rules read: (before, after) of each untruncated edit."""
    return tuple((edit.before, edit.after) for edit in edits if not edit.truncated)


def next_edit_request(
    text: str,
    cursor: int,
    edits: Sequence[RecordedEdit],
    *,
    uri: str,
    version: int | None,
    prompt_format: str,
    budget: int,
    path: str | None = None,
    sampling: Sampling = Sampling(),
    origin: str = "",
    elsewhere: Callable[[], Iterable[OtherDocument]] | None = None,
    fixed_window: tuple[int, int] | None = None,
) -> tuple[GenerationRequest, NextEditPlan]:
    """The request for the next edit after ``edits`` (oldest first) in ``text`` at ``cursor``;
    ``prompt_format``: "zeta" or "rewrite"; ``budget``: tokens on top of the window's length;
    ``elsewhere``: the other documents to search when the rules find no site in this one (called
    only then); the plan names the document its window is in. ``fixed_window``: (start, end)
    offsets of the editable window, when it is known already (the one an earlier answer was for)."""
    recent = list(edits)[-RECENT_EDITS:]
    pairs = rule_inputs(recent)
    if fixed_window is not None:
        (start, end), moved, found = fixed_window, False, True
    else:
        start, end, moved, found = _locate(text, cursor, pairs)
    if not found and pairs and elsewhere is not None and (site := find_site(elsewhere(), pairs)) is not None:
        other, start, end = site
        text, cursor, uri, version, path, moved = other.text, start, other.uri, other.version, None, True
    window = text[start:end]
    events = events_of(recent, path_of=lambda edit_uri: _display_path(edit_uri, path))
    plan = NextEditPlan(uri, version, start, end, window, prompt_format, moved, text)
    stop = tuple(sampling.stop or ())
    reference = window
    prompt: Prompt
    if prompt_format == "zeta":
        starts = LineIndex(text).starts
        first = _line_of(starts, start)
        context_start = starts[max(0, first - CONTEXT_LINES)]
        last = _line_of(starts, max(start, end - 1))  # the window's last line (it ends with its newline)
        context_end = starts[last + CONTEXT_LINES + 1] if last + CONTEXT_LINES + 1 < len(starts) else len(text)
        before, after = text[context_start:start], text[end:context_end]
        editable = window.removesuffix("\n")  # Zeta's region ends at a line's end, the marker on the next line
        at_cursor = min(max(cursor - start, 0), len(editable))
        prompt = zeta_prompt(_display_path(uri, path), before, editable, at_cursor, after, events, context_start == 0)
        # the answer repeats the excerpt with the window rewritten, and is over at the region's end
        file_start = f"{START_OF_FILE}\n" if context_start == 0 else ""
        reference = f"```{_display_path(uri, path)}\n{file_start}{before}{EDITABLE_START}\n{editable}\n{EDITABLE_END}"
        stop = (*stop, EDITABLE_END)
    else:
        prompt = Rewrite(window, edits_instruction(events))
    request = request_of(
        prompt,
        budget,
        RequestKind.NEXT_EDIT,
        sampling,
        stop,
        reference=reference,
        cache_key=f"next-edit:{uri}",
        uri=uri,
        cursor=start,
        edits=pairs,
        origin=origin,
    )
    return request, plan


FINISHED = ("eos", "stop")  # an answer cut by its budget, the context or a deadline is no rewrite


def suggestion(plan: NextEditPlan, output: str, reason: str = "eos") -> NextEditSuggestion | None:
    """The one replacement a finished answer (``reason``: why it ended) makes in the window:
    common prefix and suffix trimmed. An unfinished answer would read as deleting the window's rest."""
    if reason not in FINISHED:
        return None
    rewritten = zeta_region(output) if plan.format == "zeta" else output
    if rewritten is not None and plan.format == "zeta" and plan.window.endswith("\n"):
        rewritten += "\n"  # the region was shown without the window's last newline
    if rewritten is None or rewritten == plan.window:
        return None
    first, last, new_text = changed_span(plan.window, rewritten)
    return NextEditSuggestion(plan.start + first, plan.start + last, new_text)


def _display_path(uri: str, path: str | None) -> str:
    if path is not None:
        return path
    return uri.rsplit("/", 1)[-1] if "/" in uri else uri
