"""Next-edit cases from real commits: the first hunk applied, the request at the next hunk that
repeats its change (docs/next-edit.md, "Workload").

A commit (``edits-httpx.jsonl``: a file before and after) is split into line hunks. Two hunks
*repeat one change* when their word-level diffs share an identical change (the same tokens
removed and the same inserted: a rename, an argument added at two calls, one keyword changed in
two places), a criterion that reads the data only, not the proposer's rules. For each hunk that
repeats an earlier one, a case is the document with the earlier hunk applied (the user's edit), the
cursor where that edit ended, and the editable window around the later hunk (its lines and
``CONTEXT_LINES`` on each side) with that hunk applied as the recorded output.

*Cross-file* cases (:func:`cross_file_cases`) pair hunks of two files of one commit the same way:
the user's edit is a hunk of one file, the request is at the hunk of the other file that repeats
it, in that file as it was before the commit (the next site the service must find in another
file).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from codespec.proposers.edit_rules import code_tokens, rules_from_edit

CONTEXT_LINES = 2
MAX_HUNK_LINES = 8  # larger hunks are rewrites, not a change repeated


@dataclass(frozen=True)
class NextEditCase:
    id: str
    kind: str  # "rename", "signature" or "other" (what the first hunk's change is)
    document: str  # the file with the first hunk applied
    cursor: int  # where the first hunk's new text ends
    edit_before: str  # the first hunk's lines, before and after (the user's edit)
    edit_after: str
    window_start: int  # code point offsets of the editable window in ``document``
    window_end: int
    output: str  # the window with the second hunk applied
    edit_path: str = ""  # the file the user's edit was made in, when it is not ``document`` (cross-file)

    @property
    def window(self) -> str:
        return self.document[self.window_start : self.window_end]

    @property
    def edits(self) -> tuple[tuple[str, str], ...]:
        return ((self.edit_before, self.edit_after),)


@dataclass(frozen=True)
class _Hunk:
    i1: int
    i2: int
    j1: int
    j2: int
    changes: frozenset[tuple[tuple[str, ...], tuple[str, ...]]]


def word_changes(before: str, after: str) -> frozenset[tuple[tuple[str, ...], tuple[str, ...]]]:
    """The (removed, inserted) token runs of a word-level diff, white space ignored."""
    old = [t for t in code_tokens(before) if t.strip()]
    new = [t for t in code_tokens(after) if t.strip()]
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    return frozenset(
        (tuple(old[i1:i2]), tuple(new[j1:j2])) for op, i1, i2, j1, j2 in matcher.get_opcodes() if op != "equal"
    )


def _hunks(old: Sequence[str], new: Sequence[str]) -> list[_Hunk]:
    hunks = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if op == "equal" or i2 - i1 > MAX_HUNK_LINES or j2 - j1 > MAX_HUNK_LINES:
            continue
        changes = word_changes("".join(old[i1:i2]), "".join(new[j1:j2]))
        if changes:
            hunks.append(_Hunk(i1, i2, j1, j2, changes))
    return hunks


def _kind(before: str, after: str) -> str:
    kinds = {rule.kind for rule in rules_from_edit(before, after)}
    if "rename" in kinds:
        return "rename"
    if kinds & {"call-end", "call-start", "call-empty"}:
        return "signature"
    return "other"


def cases_of(record_id: str, before: str, after: str, per_record: int = 4) -> Iterator[NextEditCase]:
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    hunks = _hunks(old, new)
    made = 0
    for index, second in enumerate(hunks):
        first = next((h for h in reversed(hunks[:index]) if h.changes & second.changes), None)
        if first is None or made >= per_record:
            continue
        state = [*old[: first.i1], *new[first.j1 : first.j2], *old[first.i2 :]]
        shift = (first.j2 - first.j1) - (first.i2 - first.i1)
        top, bottom = second.i1 + shift, second.i2 + shift
        lo, hi = max(0, top - CONTEXT_LINES), min(len(state), bottom + CONTEXT_LINES)
        window_lines = state[lo:hi]
        output_lines = [*state[lo:top], *new[second.j1 : second.j2], *state[bottom:hi]]
        document = "".join(state)
        start = len("".join(state[:lo]))
        edit_before, edit_after = "".join(old[first.i1 : first.i2]), "".join(new[first.j1 : first.j2])
        yield NextEditCase(
            id=f"{record_id}/{index}",
            kind=_kind(edit_before, edit_after),
            document=document,
            cursor=len("".join(state[: first.i1 + (first.j2 - first.j1)])),
            edit_before=edit_before,
            edit_after=edit_after,
            window_start=start,
            window_end=start + len("".join(window_lines)),
            output="".join(output_lines),
        )
        made += 1


def cross_file_cases(records: Sequence[dict], per_pair: int = 2) -> list[NextEditCase]:
    """For each commit's ordered pair of files (A, B): B's hunks that repeat a change of one of A's,
    at most ``per_pair`` of them; the document is B before the commit, the cursor at the site."""
    by_commit: dict[str, list[dict]] = {}
    for record in records:
        by_commit.setdefault(str(record["id"]).split(":", 1)[0], []).append(record)
    cases: list[NextEditCase] = []
    for files in by_commit.values():
        split = [(r, r["before"].splitlines(keepends=True), r["after"].splitlines(keepends=True)) for r in files]
        hunks = [_hunks(old, new) for _, old, new in split]
        for a, (record_a, old_a, new_a) in enumerate(split):
            for b, (record_b, old_b, new_b) in enumerate(split):
                if a == b:
                    continue
                made = 0
                for index, second in enumerate(hunks[b]):
                    first = next((h for h in hunks[a] if h.changes & second.changes), None)
                    if first is None or made >= per_pair:
                        continue
                    lo, hi = max(0, second.i1 - CONTEXT_LINES), min(len(old_b), second.i2 + CONTEXT_LINES)
                    edit_before, edit_after = "".join(old_a[first.i1 : first.i2]), "".join(new_a[first.j1 : first.j2])
                    start = len("".join(old_b[:lo]))
                    cases.append(
                        NextEditCase(
                            id=f"{record_b['id']}/from:{str(record_a['id']).split(':', 1)[1]}/{index}",
                            kind=_kind(edit_before, edit_after),
                            document=record_b["before"],
                            cursor=len("".join(old_b[: second.i1])),
                            edit_before=edit_before,
                            edit_after=edit_after,
                            window_start=start,
                            window_end=start + len("".join(old_b[lo:hi])),
                            output="".join(
                                [*old_b[lo : second.i1], *new_b[second.j1 : second.j2], *old_b[second.i2 : hi]]
                            ),
                            edit_path=str(record_a["id"]).split(":", 1)[1],
                        )
                    )
                    made += 1
    return cases


def build(records: Iterable[dict], per_record: int = 4) -> list[NextEditCase]:
    cases: list[NextEditCase] = []
    for record in records:
        cases.extend(cases_of(str(record["id"]), record["before"], record["after"], per_record))
    return cases


def load(path: Path, limit: int | None = None, per_record: int = 4, cross_file: bool = False) -> list[NextEditCase]:
    with open(path, encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    cases = cross_file_cases(records) if cross_file else build(records, per_record)
    return cases[:limit] if limit is not None else cases


def to_json(case: NextEditCase) -> dict:
    return asdict(case)
