"""Workspace discovery: which files under the roots are source worth indexing.

Supported ``.gitignore`` subset (nested files included, each relative to its own directory):
comments, blank lines, ``!`` negation, trailing ``/`` (directories only), leading or inner ``/``
(anchored), ``*``, ``?``, ``[...]``, ``**`` (``**/x``, ``x/**``, ``a/**/b``), ``\\`` escapes; the
last matching rule wins and an ignored directory is not entered. Exclude globs from the
configuration use the same syntax, relative to each root. ``.git`` is always skipped.

Links: a link whose target lies outside every root is never followed (a ``.gitignore`` that is
such a link is not read either). Directory links inside the roots are not entered (their
targets are walked directly, and this rules out cycles).

Each file is yielded once, by its real path: every root is walked (outer ones first, each with
its own ignore files and excludes), so a root nested in another adds what the outer walk left
out, and a file link inside the roots is read (after every root is walked) only when its
target was not reached directly. Binary (a NUL byte or invalid UTF-8) and oversize
files are skipped with one log line each.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("codespec.index")
# Never source worth drafting from, whether or not a .gitignore says so (virtual environments are
# often left out of it; .codespec holds the index itself).
DEFAULT_EXCLUDE = (".git", "node_modules", ".venv", "__pycache__", ".codespec")


@dataclass(frozen=True)
class Rule:
    regex: re.Pattern
    negate: bool
    dir_only: bool


@dataclass(frozen=True)
class Found:
    path: Path
    uri: str
    text: str


@dataclass(frozen=True)
class Skipped:
    path: Path
    reason: str  # "binary", "oversize", "link outside roots", "unreadable: ..."


def _glob_regex(pattern: str) -> str:
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("/**", i) and i + 3 == len(pattern):
            out.append("/.*")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        char = pattern[i]
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            close = pattern.find("]", i + 2)
            if close == -1:
                out.append(re.escape(char))
            else:
                body = pattern[i + 1 : close]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = close
        elif char == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)


def parse_rules(lines: Sequence[str]) -> list[Rule]:
    rules = []
    for raw in lines:
        line = raw.rstrip("\n").rstrip("\r")
        if not line.strip() or line.startswith("#"):
            continue
        if not line.endswith("\\ "):
            line = line.rstrip(" ")
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        elif line.startswith("\\!") or line.startswith("\\#"):
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        body = _glob_regex(line.lstrip("/"))
        regex = re.compile(("" if anchored else "(?:.*/)?") + body + "$", re.DOTALL)
        rules.append(Rule(regex, negate, dir_only))
    return rules


class IgnoreMatcher:
    """Stacked rule sets: (directory relative to the root, rules) from outermost to innermost."""

    def __init__(self, extra: Sequence[Rule] = ()) -> None:
        self.layers: list[tuple[str, list[Rule]]] = [("", list(extra))] if extra else []

    def with_layer(self, base: str, rules: list[Rule]) -> IgnoreMatcher:
        child = IgnoreMatcher()
        child.layers = self.layers + ([(base, rules)] if rules else [])
        return child

    def ignored(self, relative: str, is_dir: bool) -> bool:
        verdict = False
        for base, rules in self.layers:
            if base:
                if not relative.startswith(base + "/"):
                    continue
                local = relative[len(base) + 1 :]
            else:
                local = relative
            for rule in rules:
                if rule.dir_only and not is_dir:
                    continue
                if rule.regex.match(local):
                    verdict = not rule.negate
        return verdict


def _inside(path: str, roots: Sequence[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


def read_text(path: Path, max_bytes: int) -> tuple[str | None, str | None]:
    """The file's text, or why not. A file that vanished, changed kind (a FIFO would block the
    read forever) or lost its permissions since the directory was listed is one skip, not an
    error: editors save by rename, so a scan meets this routinely."""
    try:
        with open(path, "rb", opener=_open_nonblocking) as file:
            info = os.fstat(file.fileno())
            if not stat.S_ISREG(info.st_mode):
                return None, "not a regular file"
            if info.st_size > max_bytes:
                return None, f"oversize ({info.st_size} bytes > {max_bytes})"
            data = file.read(max_bytes + 1)
    except OSError as error:
        return None, f"unreadable: {error.strerror or error}"
    if len(data) > max_bytes:
        return None, f"oversize ({len(data)} bytes > {max_bytes})"
    if b"\0" in data:
        return None, "binary (NUL byte)"
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError:
        return None, "binary (not UTF-8)"


def _open_nonblocking(path, flags: int) -> int:
    return os.open(path, flags | getattr(os, "O_NONBLOCK", 0))


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # e.g. a directory that may be listed but not entered
        return False


def _walk_order(roots: Sequence[Path], real_roots: Sequence[str]) -> list[tuple[Path, str]]:
    """(root, its real path), each real path once (the first listed), outer roots first: a file
    the outer walk yields is not yielded again by a nested root, and a nested root the user
    listed still contributes what the outer root's ignore rules leave out."""
    unique = {real: Path(root) for root, real in reversed(list(zip(roots, real_roots)))}
    order = sorted(unique, key=lambda real: (real.count(os.sep), real_roots.index(real)))
    return [(unique[real], real) for real in order]


def _ignore_file(path: Path, real_roots: Sequence[str]) -> str | None:
    """Where to read ``path``'s rules from: None when it is missing or a link leading out of the
    roots (the directory listing logs that link once, like any other)."""
    if not _is_file(path):
        return None
    real = os.path.realpath(path)
    return real if _inside(real, real_roots) else None


def _read_found(path: Path, max_file_bytes: int) -> Found | Skipped:
    text, reason = read_text(path, max_file_bytes)
    if reason is not None:
        log.info("index: skip %s: %s", path, reason)
        return Skipped(path, reason)
    assert text is not None  # no reason to skip: the text was read
    return Found(path, path.absolute().as_uri(), text)


def discover(
    roots: Sequence[Path], exclude: Sequence[str] = (), max_file_bytes: int = 1_000_000
) -> Iterator[Found | Skipped]:
    """Walk the roots in a stable order; yield each indexable file once with its text, or why not."""
    real_roots = [os.path.realpath(r) for r in roots]
    excluded = parse_rules(exclude)
    seen: set[str] = set()  # real paths of files yielded (or skipped) so far
    file_links: list[tuple[Path, str]] = []  # (link, real target inside the roots), read last
    for root, real_root in _walk_order(roots, real_roots):
        yield from _walk(root, real_root, real_roots, excluded, max_file_bytes, seen, file_links)
    for path, target in file_links:
        if target not in seen:
            seen.add(target)
            yield _read_found(path, max_file_bytes)


def _walk(
    root: Path,
    real_root: str,
    real_roots: Sequence[str],
    excluded: Sequence[Rule],
    max_file_bytes: int,
    seen: set[str],
    file_links: list[tuple[Path, str]],
) -> Iterator[Found | Skipped]:
    """One root, depth first in name order. Its directories are never links, so a file's real
    path is its directory's real path plus its name (no ``realpath`` call per file)."""
    stack: list[tuple[Path, str, str, IgnoreMatcher]] = [(root, real_root, "", IgnoreMatcher(excluded))]
    while stack:
        directory, real_dir, relative_dir, matcher = stack.pop()
        rules_file = _ignore_file(directory / ".gitignore", real_roots)
        if rules_file is not None:
            try:
                with open(rules_file, encoding="utf-8", errors="replace") as file:
                    rules = parse_rules(file.read().splitlines())
            except OSError:
                rules = []
            matcher = matcher.with_layer(relative_dir, rules)
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as error:
            log.info("index: skip %s: unreadable directory (%s)", directory, error)
            yield Skipped(directory, f"unreadable: {error}")
            continue
        subdirs = []
        for entry in entries:
            relative = f"{relative_dir}/{entry.name}" if relative_dir else entry.name
            path = Path(entry.path)
            if entry.name == ".git":
                continue
            try:
                is_link = entry.is_symlink()
            except OSError:
                is_link = False
            target = os.path.join(real_dir, entry.name)
            if is_link:
                where = target  # the link itself: met again by a nested root's walk, logged once
                target = os.path.realpath(entry.path)
                if not _inside(target, real_roots):
                    if where in seen:
                        continue
                    seen.add(where)
                    log.info("index: skip %s: link to %s outside the roots", path, target)
                    yield Skipped(path, "link outside roots")
                    continue
                if os.path.isdir(target):
                    continue  # walked directly; entering it could cycle
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
                is_file = entry.is_file()
            except OSError:
                continue
            if matcher.ignored(relative, is_dir):
                continue
            if is_dir:
                subdirs.append((path, target, relative, matcher))
            elif is_file and is_link:
                file_links.append((path, target))
            elif is_file and target not in seen:
                seen.add(target)
                yield _read_found(path, max_file_bytes)
        stack.extend(reversed(subdirs))
