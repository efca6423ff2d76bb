"""The user's last edits, turned into rules that rewrite other places the same way (docs/next-edit.md).

A next-edit suggestion is mostly "the change the user just made, at the next site": a rename
applied to the next use of the name, an argument added at the next call. These pure functions
read one edit (the lines it touched, before and after) at the level of code tokens (words,
runs of white space, single punctuation marks) and produce :class:`Rule` values; applying them
to an editable window gives the *predicted* window, which the next-edit proposer drafts from.
A wrong prediction only costs a rejected draft: verification decides every token.

Rules, from one word-level diff hunk of an edit:

- a replaced identifier (``fetch`` -> ``fetch_all``, ``self._pool`` -> ``self._transport``) is
  replaced at every whole-token occurrence (a rename);
- text inserted right before the closing parenthesis of a call (``f(a, b)`` -> ``f(a, b, c)``) is
  inserted before the closing parenthesis of every other call of the same name, unless that call
  already ends with it; the same right after the opening parenthesis; an empty call's new
  arguments (``f()`` -> ``f(x)``) go only into the name's other empty calls;
- any other change is applied where the same tokens around it occur again (two on each side, more
  until each side holds one that is not blank; with none, no rule).

A prediction is abandoned (the text is kept as it is) when it grows past twice its length: rules
from several edits can match inside each other's replacements.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_TOKEN = re.compile(r"\w+|\s+|[^\w\s]")
_WORD = re.compile(r"\w+")
_IDENTIFIER = re.compile(r"[^\W\d]\w*")
CONTEXT_TOKENS = 2  # tokens on each side that must match for a contextual rule
MAX_EDIT_CHARS = 1200  # longer edits (pastes, generated blocks) make no rules: they do not repeat
MAX_RULES = 16
MAX_CONTEXT_TOKENS = 6  # a contextual rule's context grows to this many tokens to hold a non-blank one
GROWTH_CHARS = 1024  # a prediction longer than twice its input plus this is abandoned (rules feeding rules)


def code_tokens(text: str) -> list[str]:
    """Words, runs of white space and single punctuation marks, in order ("".join gives ``text``)."""
    return _TOKEN.findall(text)


@dataclass(frozen=True)
class Rule:
    """One way to repeat an edit: ``kind`` is "rename", "call-end", "call-start", "call-empty" or "context"."""

    kind: str
    pattern: tuple[str, ...]  # rename/context: the tokens to replace; call-*: the call's name
    replacement: tuple[str, ...]  # rename/context: what replaces them; call-*: the tokens inserted


def rules_from_edit(before: str, after: str) -> list[Rule]:
    """The rules one edit (``before`` -> ``after``: the lines it touched) implies."""
    return list(_rules(before, after))


@functools.lru_cache(maxsize=256)  # the same recent edits are read for every request and draft
def _rules(before: str, after: str) -> tuple[Rule, ...]:
    if before == after or len(before) > MAX_EDIT_CHARS or len(after) > MAX_EDIT_CHARS:
        return ()
    old, new = code_tokens(before), code_tokens(after)
    rules: list[Rule] = []
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        removed, inserted = tuple(old[i1:i2]), tuple(new[j1:j2])
        rule = _call_rule(old, i1, i2, inserted) if not removed else None
        if rule is None and removed and _is_name(removed) and _is_name(inserted):
            # ``self.`` of ``self._pool``: that attribute only (the qualifier as it reads after the edit)
            qualifier, renamed_qualifier = _qualifier(old, i1), _qualifier(new, j1)
            right: tuple[str, ...] = ()
            if _contains(new, removed) and i2 < len(old) and old[i2].strip():
                right = (old[i2],)  # the name stays elsewhere in the line (``data=data``): this use only
            rule = Rule("rename", qualifier + removed + right, renamed_qualifier + inserted + right)
        if rule is None:
            left, right = _context(old, i1, -1), _context(old, i2, 1)
            if not _holds_code(left) or not _holds_code(right):
                continue  # ``)`` -> ``x)`` at every ``)``: no context, no rule
            rule = Rule("context", left + removed + right, left + inserted + right)
        if rule not in rules:
            rules.append(rule)
    return tuple(rules[:MAX_RULES])


def _context(tokens: Sequence[str], at: int, direction: int) -> tuple[str, ...]:
    """``CONTEXT_TOKENS`` tokens before (direction -1) or from (1) ``at``, more up to
    ``MAX_CONTEXT_TOKENS`` until they hold a non-blank one."""
    size = CONTEXT_TOKENS
    while True:
        run = tokens[max(0, at - size) : at] if direction < 0 else tokens[at : at + size]
        if _holds_code(run) or size >= MAX_CONTEXT_TOKENS:
            return tuple(run)
        size += 1


def _holds_code(tokens: Sequence[str]) -> bool:
    """Something to anchor on: a non-blank token, or a line break (the edit was at a line's end)."""
    return any(token.strip() or "\n" in token for token in tokens)


def _contains(tokens: Sequence[str], run: tuple[str, ...]) -> bool:
    size = len(run)
    return any(tuple(tokens[i : i + size]) == run for i in range(len(tokens) - size + 1))


def _is_name(tokens: Sequence[str]) -> bool:
    """An identifier, possibly dotted (``self._pool``): what a rename changes (not a number)."""
    words = [t for t in tokens if t != "."]
    return bool(words) and all(_IDENTIFIER.fullmatch(t) for t in words)


def _qualifier(tokens: Sequence[str], at: int) -> tuple[str, ...]:
    """The ``obj.`` chain right before token ``at`` (empty when it is a bare name)."""
    start = at
    while start >= 2 and tokens[start - 1] == "." and _IDENTIFIER.fullmatch(tokens[start - 2]):
        start -= 2
    return tuple(tokens[start:at])


def _call_rule(old: Sequence[str], at: int, stop: int, inserted: tuple[str, ...]) -> Rule | None:
    """An insertion at the start or the end of a call's arguments: the call's name and what went in."""
    if not inserted or not "".join(inserted).strip():
        return None
    if stop < len(old) and old[stop] == ")":
        opening = _matching_open(old, stop)
        if opening is not None and (name := _callee(old, opening)) is not None:
            # ``f()`` -> ``f(x)``: ``x`` is the whole argument list, right only where there was none
            return Rule("call-empty" if opening + 1 == stop else "call-end", name, inserted)
    if at > 0 and old[at - 1] == "(" and (name := _callee(old, at - 1)) is not None:
        return Rule("call-start", name, inserted)
    return None


def _matching_open(tokens: Sequence[str], close: int) -> int | None:
    depth = 0
    for index in range(close, -1, -1):
        if tokens[index] == ")":
            depth += 1
        elif tokens[index] == "(":
            depth -= 1
            if depth == 0:
                return index
    return None


def _matching_close(tokens: Sequence[str], opening: int) -> int | None:
    depth = 0
    for index in range(opening, len(tokens)):
        if tokens[index] == "(":
            depth += 1
        elif tokens[index] == ")":
            depth -= 1
            if depth == 0:
                return index
    return None


def _callee(tokens: Sequence[str], opening: int) -> tuple[str, ...] | None:
    """The name right before an opening parenthesis (``obj.method``), or None (a bare group)."""
    index = opening - 1
    name: list[str] = []
    while index >= 0 and (_WORD.fullmatch(tokens[index]) or tokens[index] == "."):
        name.insert(0, tokens[index])
        index -= 1
    return tuple(name) if name and _WORD.fullmatch(name[-1]) else None


def apply_rules(text: str, rules: Iterable[Rule]) -> str:
    """``text`` with every rule applied wherever it matches, the most specific (longest pattern)
    first, so ``httpcore.SyncHTTPTransport`` is renamed whole before ``httpcore`` alone is."""
    tokens = code_tokens(text)
    limit = 2 * len(text) + GROWTH_CHARS
    for rule in sorted(rules, key=lambda rule: -len(rule.pattern) if rule.kind in ("rename", "context") else 0):
        if rule.kind in ("rename", "context"):
            tokens = _substitute(tokens, rule.pattern, rule.replacement)
        else:
            tokens = _extend_calls(tokens, rule)
        if sum(map(len, tokens)) > limit:  # rules matching inside each other's replacements
            return text
    return "".join(tokens)


def _substitute(tokens: list[str], pattern: tuple[str, ...], replacement: tuple[str, ...]) -> list[str]:
    if not pattern:
        return tokens
    out: list[str] = []
    index, size = 0, len(pattern)
    while index < len(tokens):
        if tuple(tokens[index : index + size]) == pattern and not _follows_name(tokens, index, pattern):
            out.extend(replacement)
            index += size
        else:
            out.append(tokens[index])
            index += 1
    return out


def _follows_name(tokens: Sequence[str], index: int, pattern: tuple[str, ...]) -> bool:
    """A rename of ``name`` must not touch ``obj.name`` (another object's attribute)."""
    return _WORD.fullmatch(pattern[0]) is not None and index > 0 and tokens[index - 1] == "."


def _extend_calls(tokens: list[str], rule: Rule) -> list[str]:
    size = len(rule.pattern)
    inserts: dict[int, tuple[str, ...]] = {}  # token index -> tokens inserted before it
    for index in range(len(tokens) - size):
        if tuple(tokens[index : index + size]) != rule.pattern or tokens[index + size] != "(":
            continue
        if index > 0 and (tokens[index - 1] == "." and rule.pattern[0] != "." and size == 1):
            continue  # ``obj.f(`` is another function than ``f(``
        opening = index + size
        close = _matching_close(tokens, opening)
        if close is None:
            continue
        arguments = tokens[opening + 1 : close]
        if rule.kind == "call-empty":
            if not "".join(arguments).strip():
                inserts[close] = rule.replacement
        elif rule.kind == "call-end":
            if tuple(arguments[-len(rule.replacement) :]) != rule.replacement:
                inserts[close] = rule.replacement
        elif tuple(arguments[: len(rule.replacement)]) != rule.replacement:
            inserts[opening + 1] = rule.replacement
    if not inserts:
        return tokens
    out: list[str] = []
    for index, token in enumerate(tokens):
        out.extend(inserts.get(index, ()))
        out.append(token)
    return out


def rules_of(edits: Sequence[tuple[str, str]], max_edits: int = 3) -> list[Rule]:
    """The rules of the newest ``max_edits`` edits (``edits`` oldest first), newest edit's first."""
    rules: list[Rule] = []
    for before, after in list(edits)[-max_edits:][::-1]:
        rules.extend(rule for rule in rules_from_edit(before, after) if rule not in rules)
    return rules


def predict(text: str, edits: Sequence[tuple[str, str]], max_edits: int = 3) -> str:
    """``text`` rewritten by the rules of the newest ``max_edits`` edits (``edits`` oldest first)."""
    rules = rules_of(edits, max_edits)
    return apply_rules(text, rules) if rules else text


def anchors(edits: Sequence[tuple[str, str]], max_edits: int = 3) -> tuple[str, ...]:
    """Literal text every place a rule applies contains (a rename's old name, a changed call's
    ``name(``): a substring search for these finds the candidates for a site in a whole file
    without applying the rules to it."""
    found: list[str] = []
    for rule in rules_of(edits, max_edits):
        anchor = "".join(rule.pattern) + ("(" if rule.kind.startswith("call-") else "")
        if anchor.strip() and anchor not in found:
            found.append(anchor)
    return tuple(found)
