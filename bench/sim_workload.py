"""Workload records -> simulation cases (formats: shared/workloads/README.md).

An edit record ``{id, instruction, before, after}`` replays ``after`` after the rewrite prompt
(rendered in the replay tokenizer's prompt format, ``bench.sim_run``; ``prompt`` holds the default
format's rendering), with ``before`` as the reference and as the indexed document. A completion record
``{id, path, prefix, suffix, target}`` replays ``target`` after ``prefix`` (the context), with
``prefix + suffix`` as the indexed document (cursor at the end of ``prefix``) and as the
reference, its pointer starting at the cursor. Bad input is an error naming the file and line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from codespec.core.errors import CodespecError
from codespec.core.prompts import Prompt, Rewrite


@dataclass(frozen=True)
class SimCase:
    id: str
    kind: str  # "edit" | "completion"
    prompt: str  # the text before the output (edit prompt, or the completion's prefix)
    output: str  # what the target is replayed as emitting
    reference: str  # the copy pointer's text
    reference_start: int  # character offset in ``reference`` where the output begins
    uri: str  # the document this request is about, as indexed
    document: str
    cursor: int  # character offset in ``document``
    request: Prompt | None = None  # what the prompt asks (an edit's Rewrite), rendered per tokenizer


def edit_prompt(before: str, instruction: str | None) -> str:
    """The engine's rewrite prompt (codespec.prompts), so baselines see what a real request has."""
    from codespec.core.prompts import rewrite_prompt

    return rewrite_prompt(before, instruction)


def read_jsonl(path: Path, max_records: int | None = None, what: str = "workload file") -> list[dict]:
    return [record for _, record in numbered_records(path, max_records, what)]


def numbered_records(path: Path, max_records: int | None = None, what: str = "workload file") -> list[tuple[int, dict]]:
    """(line number, object) per non-blank line. Read as bytes and decoded line by line, so text
    that is not UTF-8 is an error naming its line (a BOM at the start is allowed)."""
    if not path.is_file():
        raise CodespecError(f"{what} {path} does not exist" if not path.exists() else f"{what} {path} is not a file")
    records = []
    try:
        with path.open("rb") as lines:
            for number, raw in enumerate(lines, 1):
                try:
                    line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
                except UnicodeDecodeError as error:
                    raise CodespecError(
                        f"{path}:{number}: not UTF-8 text (byte {error.start + 1} of the line: "
                        f"{raw[error.start : error.start + 1]!r}); {what}s are UTF-8 JSONL"
                    ) from None
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise CodespecError(f"{path}:{number}: not JSON ({error.msg})") from None
                if not isinstance(record, dict):
                    raise CodespecError(f"{path}:{number}: expected a JSON object per line")
                records.append((number, record))
                if max_records is not None and len(records) >= max_records:
                    break
    except OSError as error:
        raise CodespecError(f"{what} {path}: cannot read it ({error.strerror or error})") from None
    return records


def text_field(record: dict, key: str, where: str) -> str:
    """A record's string field, or a CodespecError naming the record and the field."""
    value = record.get(key)
    if not isinstance(value, str):
        raise CodespecError(f"{where}: field {key!r} must be a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:  # a lone surrogate escape such as "\ud800"
        raise CodespecError(
            f"{where}: field {key!r} is not valid Unicode ({error.reason} at character {error.start})"
        ) from None
    return value


def case_from_record(record: dict, where: str) -> SimCase:
    record_id = str(record.get("id", where))
    if "before" in record or "after" in record:
        before, after = text_field(record, "before", where), text_field(record, "after", where)
        instruction = record.get("instruction") if isinstance(record.get("instruction"), str) else None
        return SimCase(
            record_id,
            "edit",
            edit_prompt(before, instruction),
            after,
            before,
            0,
            f"edit:{record_id}",
            before,
            0,
            Rewrite(before, instruction),
        )
    if "prefix" in record or "target" in record:
        prefix, suffix = text_field(record, "prefix", where), record.get("suffix", "")
        if not isinstance(suffix, str):
            raise CodespecError(f"{where}: field 'suffix' must be a string")
        target = text_field(record, "target", where)
        uri = str(record.get("path") or f"completion:{record_id}")
        return SimCase(
            record_id, "completion", prefix, target, prefix + suffix, len(prefix), uri, prefix + suffix, len(prefix)
        )
    raise CodespecError(f"{where}: neither an edit record (before/after) nor a completion record (prefix/target)")


def load_cases(path: Path, max_records: int | None = None) -> list[SimCase]:
    records = numbered_records(path, max_records)
    cases = [case_from_record(record, f"{path}:{line}") for line, record in records]
    if not cases:
        raise CodespecError(f"workload file {path} holds no records")
    return cases


def load_workspace(path: Path) -> list[tuple[str, str]]:
    """``{path, text}`` records -> (uri, text) pairs."""
    files = []
    for line, record in numbered_records(path, what="workspace file"):
        where = f"{path}:{line}"
        files.append((text_field(record, "path", where), text_field(record, "text", where)))
    return files
