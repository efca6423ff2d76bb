"""Workload records (shared/workloads/README.md) -> bench cases, with length subsampling.

An edit record becomes a rewrite request (``codespec.prompts.Rewrite``) whose recorded output is
``after`` and whose reference is ``before``; a completion record becomes a FIM request
(``codespec.prompts.Fim``) whose recorded output is ``target``, with ``prefix + suffix`` as the
reference (pointer at the cursor) and as the indexed document (as in ``codespec simulate``). The
prompt is rendered in the target's format: pass ``renderer=PromptRenderer(target.tokenizer,
target.prompt_format)`` (without one, the default model's format), or re-render loaded cases with
``render_cases``; ``BenchCase.request`` keeps what was asked.

Profiles shorten long records instead of dropping them (``window_edit``, ``window_completion``):
an edit keeps its changed lines with a few unchanged lines around them, a completion keeps the
text nearest the cursor. That keeps what makes the record realistic (where and how it changes)
while bounding prefill and decode time.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.sim_workload import text_field
from codespec.core.errors import CodespecError
from codespec.core.prompts import DEFAULT_FORMAT, Fim, Prompt, PromptRenderer, Rewrite


@dataclass(frozen=True)
class BenchCase:
    id: str
    workload: str
    kind: str  # "edit" | "completion"
    prompt: str
    output: str  # the recorded output (replay forces it; real mode ignores it)
    reference: str
    reference_start: int  # character offset of the output's start in ``reference``
    uri: str  # the document this request is about, as indexed
    document: str
    cursor: int
    instruction: str | None = None
    prefix: str = ""  # completion fields, for the websocket `complete` message
    suffix: str = ""
    request: Prompt | None = None  # what ``prompt`` renders (Rewrite / Fim)


def render(request: Prompt, renderer: PromptRenderer | None) -> str:
    """``request`` in the renderer's format; without one, in the default model's."""
    if renderer is not None:
        return renderer.render(request).text
    if isinstance(request, Fim):
        return DEFAULT_FORMAT.fim(request.prefix, request.suffix)
    if isinstance(request, Rewrite):
        return DEFAULT_FORMAT.rewrite(request.original, request.instruction)
    return request


def render_cases(cases: Sequence[BenchCase], renderer: PromptRenderer) -> list[BenchCase]:
    """The cases with their prompts rendered by ``renderer`` (a target's format and chat template)."""
    return [
        case if case.request is None else dataclasses.replace(case, prompt=render(case.request, renderer))
        for case in cases
    ]


def window_edit(before: str, after: str, max_chars: int | None, context_lines: int = 6) -> tuple[str, str]:
    """Both texts cut to the changed lines plus ``context_lines`` unchanged lines either side, then
    (if still longer than ``max_chars``) to their first ``max_chars`` characters at a line end."""
    if max_chars is None or max(len(before), len(after)) <= max_chars:
        return before, after
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    blocks = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    changed = [(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in blocks if tag != "equal"]
    if changed:
        start = max(0, min(c[0] for c in changed) - context_lines)
        shift = changed[0][2] - changed[0][0]  # new-line offset where the first change begins
        old = old[start:]
        new = new[max(0, start + shift) :]
    return _head(old, max_chars), _head(new, max_chars)


def window_completion(prefix: str, suffix: str, max_chars: int | None) -> tuple[str, str]:
    """The ``max_chars`` characters before the cursor (from a line start) and a quarter as many after."""
    if max_chars is None:
        return prefix, suffix
    if len(prefix) > max_chars:
        cut = prefix.find("\n", len(prefix) - max_chars)
        prefix = prefix[cut + 1 :] if cut != -1 else prefix[-max_chars:]
    return prefix, suffix[: max(max_chars // 4, 1)]


def _head(lines: list[str], max_chars: int) -> str:
    kept: list[str] = []
    size = 0
    for line in lines:
        if size + len(line) > max_chars and kept:
            break
        kept.append(line)
        size += len(line)
    return "".join(kept)


def case_from_record(
    record: dict, workload: str, where: str, max_chars: int | None = None, renderer: PromptRenderer | None = None
) -> BenchCase:
    record_id = str(record.get("id", where))
    if "before" in record or "after" in record:
        before, after = text_field(record, "before", where), text_field(record, "after", where)
        instruction = record.get("instruction") if isinstance(record.get("instruction"), str) else None
        before, after = window_edit(before, after, max_chars)
        rewrite = Rewrite(before, instruction)
        return BenchCase(
            record_id,
            workload,
            "edit",
            render(rewrite, renderer),
            after,
            before,
            0,
            f"edit:{record_id}",
            before,
            0,
            instruction,
            request=rewrite,
        )
    if "prefix" in record or "target" in record:
        prefix, target = text_field(record, "prefix", where), text_field(record, "target", where)
        suffix = record.get("suffix", "")
        if not isinstance(suffix, str):
            raise CodespecError(f"{where}: field 'suffix' must be a string")
        prefix, suffix = window_completion(prefix, suffix, max_chars)
        uri = str(record.get("path") or f"completion:{record_id}")
        fim = Fim(prefix, suffix)
        return BenchCase(
            record_id,
            workload,
            "completion",
            render(fim, renderer),
            target,
            prefix + suffix,
            len(prefix),
            uri,
            prefix + suffix,
            len(prefix),
            prefix=prefix,
            suffix=suffix,
            request=fim,
        )
    raise CodespecError(f"{where}: neither an edit record (before/after) nor a completion record (prefix/target)")


CHARS_PER_TOKEN = 3.5  # rough, for budgeting only (code under a 4k byte-level BPE)


def load_cases(
    path: Path,
    max_records: int | None = None,
    max_chars: int | None = None,
    stride: int = 1,
    token_budget: int | None = None,
    max_new_tokens: int | None = None,
    renderer: PromptRenderer | None = None,
) -> list[BenchCase]:
    """Every ``stride``-th record (a spread-out subsample), at most ``max_records`` of them, and
    (``token_budget``) only until their estimated output tokens add up to the budget: a profile
    then takes a few long edits or many short completions in about the same time. ``renderer``:
    the target's prompt format (module docstring)."""
    from bench.sim_workload import read_jsonl

    records = read_jsonl(path)
    picked = list(enumerate(records, 1))[:: max(stride, 1)]
    cases: list = []
    spent = 0.0
    for number, record in picked:
        case = case_from_record(record, path.stem, f"{path} record {number}", max_chars, renderer)
        if not case.output:
            continue
        if token_budget is not None and cases and spent >= token_budget:
            break
        estimate = len(case.output) / CHARS_PER_TOKEN
        spent += min(estimate, max_new_tokens) if max_new_tokens else estimate
        cases.append(case)
        if max_records is not None and len(cases) >= max_records:
            break
    if not cases:
        raise CodespecError(f"workload file {path} holds no usable records")
    return cases
