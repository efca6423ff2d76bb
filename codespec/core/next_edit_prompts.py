"""Next-edit prompts: Zeta's published layout, the edits as diffs, and reading a Zeta answer.

Zed's open next-edit model, zed-industries/zeta (a Qwen2.5-Coder fine-tune), is prompted with
the user's recent edits as unified diffs and an excerpt of the file in which the *editable
region* and the cursor are marked; it answers with the excerpt rewritten, markers included
(docs/next-edit.md has the layout). Zed sends the same prompt to any OpenAI-compatible
``/v1/completions``, so the HTTP door recognises it (:func:`zeta_excerpt`) and drafts from the
excerpt. For plain code models the service asks a rewrite of the window instead (``Rewrite``
with :func:`edits_instruction`).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

EDITABLE_START = "<|editable_region_start|>"
EDITABLE_END = "<|editable_region_end|>"
CURSOR = "<|user_cursor_is_here|>"
START_OF_FILE = "<|start_of_file|>"

ZETA_INSTRUCTION = (
    "You are a code completion assistant and your task is to analyze user edits and then rewrite an "
    "excerpt that the user provides, suggesting the appropriate edits within the excerpt, taking into "
    "account the cursor location."
)
EXCERPT_HEADER = "### User Excerpt:"
RESPONSE_HEADER = "### Response:"


@dataclass(frozen=True)
class EditEvent:
    """One recent edit as a prompt shows it: the lines it touched, before and after."""

    path: str
    before: str
    after: str
    truncated: bool = False


def unified_diff(before: str, after: str) -> str:
    """The edit as a unified diff hunk (``@@ ... @@`` and +/- lines, no file header)."""
    lines = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=1)
    return "\n".join(line for line in lines if not line.startswith(("---", "+++")))


def format_events(events: Sequence[EditEvent]) -> str:
    """Zeta's "User Edits" section: each edit as ``User edited "path":`` and a diff block."""
    blocks = []
    for event in events:
        if event.truncated:
            body = f"(a large edit of {len(event.after)}+ characters)"
        else:
            body = unified_diff(event.before, event.after)
        blocks.append(f'User edited "{event.path}":\n```diff\n{body}\n```')
    return "\n\n".join(blocks)


def zeta_prompt(
    path: str,
    context_before: str,
    editable: str,
    cursor: int,
    context_after: str,
    events: Sequence[EditEvent],
    at_file_start: bool,
) -> str:
    """The Zeta prompt for an editable region (``cursor``: offset inside ``editable``)."""
    excerpt = f"```{path}\n"
    if at_file_start:
        excerpt += f"{START_OF_FILE}\n"
    excerpt += context_before + f"{EDITABLE_START}\n" + editable[:cursor] + CURSOR + editable[cursor:]
    excerpt += f"\n{EDITABLE_END}\n" + context_after  # the lines after the region, each on its own
    excerpt += "```" if excerpt.endswith("\n") else "\n```"
    return (
        f"### Instruction:\n{ZETA_INSTRUCTION}\n\n### User Edits:\n\n{format_events(events)}\n\n"
        f"{EXCERPT_HEADER}\n\n{excerpt}\n\n{RESPONSE_HEADER}\n\n"
    )


def zeta_excerpt(prompt: str) -> str | None:
    """What a Zeta-style prompt's answer copies: its excerpt (from the code fence on, cursor marker
    removed), or None when ``prompt`` has no editable region. The answer repeats the excerpt with
    the region rewritten, so this is the best reference draft there is."""
    start = prompt.rfind(EDITABLE_START)
    if start < 0 or prompt.find(EDITABLE_END, start) < 0:
        return None
    header = prompt.rfind(EXCERPT_HEADER, 0, start)
    fence = prompt.find("```", header if header >= 0 else 0, start)
    begin = fence if fence >= 0 else start
    end = prompt.find(RESPONSE_HEADER, start)
    excerpt = prompt[begin : end if end >= 0 else len(prompt)].rstrip()
    return excerpt.replace(CURSOR, "")


def zeta_edits(prompt: str, limit: int = 8) -> tuple[tuple[str, str], ...]:
    """The recent edits a Zeta-style prompt shows, as (lines before, lines after) from each diff
    block of its "User Edits" section, oldest first (the newest ``limit``)."""
    header = prompt.find("### User Edits:")
    end = prompt.find(EXCERPT_HEADER, header)
    if header < 0 or end < 0:
        return ()
    edits: list[tuple[str, str]] = []
    for block in prompt[header:end].split("```diff\n")[1:]:
        before: list[str] = []
        after: list[str] = []
        for line in block.split("\n```", 1)[0].split("\n"):
            if line.startswith(("@@", "---", "+++")):
                continue
            mark, body = line[:1], line[1:]
            if mark in ("-", " "):
                before.append(body)
            if mark in ("+", " "):
                after.append(body)
        if before != after:
            edits.append(("\n".join(before) + "\n", "\n".join(after) + "\n"))
    return tuple(edits[-limit:])


def zeta_region(answer: str) -> str | None:
    """The rewritten editable region in a Zeta answer (None when its start marker is missing)."""
    answer = answer.replace(CURSOR, "")
    start = answer.find(EDITABLE_START)
    if start < 0:
        return None
    begin = start + len(EDITABLE_START)
    if answer.startswith("\n", begin):
        begin += 1
    end = answer.find(EDITABLE_END, begin)
    if end < 0:
        return answer[begin:].removesuffix("\n")
    region = answer[begin:end]
    return region[:-1] if region.endswith("\n") else region


def edits_instruction(events: Sequence[EditEvent]) -> str:
    """A rewrite instruction for a plain code model: repeat the user's recent edits here."""
    diffs = "\n".join(unified_diff(event.before, event.after) for event in events if not event.truncated)
    return (
        "The user just made this edit:\n" + diffs + "\n"
        "Make the same change in this code wherever it applies; keep everything else exactly as it is."
    )
