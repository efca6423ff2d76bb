"""Next-edit requests: after an edit, the rewrite of the window where it applies next (docs/next-edit.md).

Plain functions, no server: a door hands the document text, the cursor and the document's recent
edits (``service.edit_history``), and gets a ``GenerationRequest`` and a ``NextEditPlan``; when the
job is done, :func:`suggestion` turns its text into the one replacement to show (the smallest
span that changed), or None when the model left the window as it was.

The editable window is a few lines around the cursor; when the last edits' rules (``proposers.
edit_rules``) change nothing there, it moves to the nearest place in the document where they do
(the next use of a renamed name, the next call of a changed function), after the cursor first.
"""

from __future__ import annotations

import bisect
import difflib
from collections.abc import Sequence
from dataclasses import dataclass

from codespec.next_edit_prompts import (
    EDITABLE_END,
    EDITABLE_START,
    START_OF_FILE,
    EditEvent,
    edits_instruction,
    zeta_prompt,
    zeta_region,
)
from codespec.prompts import Prompt, Rewrite
from proposers.edit_rules import predict
from service.edit_history import RecordedEdit
from service.jobs import GenerationRequest, request_of
from service.positions import LineIndex, changed_span
from service.schema import RequestKind, Sampling

LINES_BEFORE = 2  # editable window: lines above the cursor's line
LINES_AFTER = 6  # and below it
CONTEXT_LINES = 3  # Zeta's excerpt: unchanged lines around the window
SEARCH_LINES = 400  # how far from the cursor the window may move to find the next site
SEARCH_CHARS = 100_000  # and at most this many characters of the document on either side
MAX_WINDOW_CHARS = 4000  # a longer window shrinks to the cursor's line; a longer line: no window
RECENT_EDITS = 3


@dataclass(frozen=True)
class NextEditPlan:
    uri: str
    version: int | None
    start: int  # code point offsets of the editable window in the document
    end: int
    window: str
    format: str  # "zeta" or "rewrite"
    moved: bool  # the window is not at the cursor: the rules found the next site elsewhere


@dataclass(frozen=True)
class NextEditSuggestion:
    start: int  # code point offsets in the document
    end: int
    text: str


def choose_window(text: str, cursor: int, edits: Sequence[tuple[str, str]]) -> tuple[int, int, bool]:
    """(start, end, moved): whole lines around the cursor, or around the nearest line the edits'
    rules would change (after the cursor first, then before)."""
    starts = LineIndex(text).starts  # the LSP's lines (\n, \r\n, \r)
    line = _line_of(starts, cursor)

    def lines(first: int, last: int) -> tuple[int, int]:  # whole lines, each with its newline
        return starts[first], starts[last + 1] if last + 1 < len(starts) else len(text)

    def window(at: int) -> tuple[int, int]:
        start, end = lines(max(0, at - LINES_BEFORE), min(len(starts) - 1, at + LINES_AFTER))
        if end - start > MAX_WINDOW_CHARS:
            start, end = lines(at, at)
        return (start, end) if end - start <= MAX_WINDOW_CHARS else (start, start)  # empty: none

    here = window(line)
    if not edits or predict(text[here[0] : here[1]], edits) != text[here[0] : here[1]]:
        return here[0], here[1], False
    first, last = max(0, line - SEARCH_LINES), min(len(starts) - 1, line + SEARCH_LINES)
    first = max(first, _line_of(starts, max(0, cursor - SEARCH_CHARS)))
    last = min(last, _line_of(starts, min(len(text), cursor + SEARCH_CHARS)))
    region_start = starts[first]
    region_end = starts[last + 1] - 1 if last + 1 < len(starts) else len(text)
    region = text[region_start:region_end]
    changed = _changed_lines(region, predict(region, edits))
    if not changed:
        return here[0], here[1], False
    offsets = [first + index for index in changed]
    after = [at for at in offsets if at > line]
    target = after[0] if after else max(offsets)
    start, end = window(target)
    return start, end, True


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
) -> tuple[GenerationRequest, NextEditPlan]:
    """The request for the next edit after ``edits`` (oldest first) in ``text`` at ``cursor``;
    ``prompt_format``: "zeta" or "rewrite"; ``budget``: tokens on top of the window's length."""
    recent = list(edits)[-RECENT_EDITS:]
    pairs = rule_inputs(recent)
    start, end, moved = choose_window(text, cursor, pairs)
    window = text[start:end]
    events = events_of(recent, path_of=lambda edit_uri: _display_path(edit_uri, path))
    plan = NextEditPlan(uri, version, start, end, window, prompt_format, moved)
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
