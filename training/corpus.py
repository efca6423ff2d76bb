"""Training text: the standard library's own ``.py`` files (minus tests), present on every machine.

The held-out split is by a hash of the path relative to the stdlib root, so it is the same on any
machine and any run; held-out functions (for the copy and FIM bars) come only from held-out files.
"""

from __future__ import annotations

import ast
import hashlib
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

HELDOUT_PERCENT = 5
_SKIP_PARTS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


@dataclass(frozen=True)
class SourceFile:
    path: str  # relative to the stdlib root, '/'-separated
    text: str


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(relative_path: str) -> bool:
    digest = hashlib.sha256(relative_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % 100 < HELDOUT_PERCENT


def stdlib_files(root: Path | None = None) -> list[SourceFile]:
    """Every non-test stdlib ``.py`` file that decodes as UTF-8, sorted by path (deterministic)."""
    root = root or stdlib_root()
    files = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        parts = relative.split("/")
        if _SKIP_PARTS.intersection(parts[:-1]) or parts[-1].startswith("test_"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            files.append(SourceFile(relative, text))
    return files


def split_files(files: list[SourceFile]) -> tuple[list[SourceFile], list[SourceFile]]:
    train = [f for f in files if not is_heldout(f.path)]
    heldout = [f for f in files if is_heldout(f.path)]
    return train, heldout


def functions(text: str) -> list[str]:
    """Source of every top-level or method ``def`` in ``text`` (dedented, with its trailing newline)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    lines = text.splitlines(keepends=True)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.decorator_list:
            chunk = lines[node.lineno - 1 : node.end_lineno]
            indent = len(chunk[0]) - len(chunk[0].lstrip(" "))
            if all(line[:indent].strip() == "" for line in chunk):
                body = "".join(line[indent:] if line.strip() else line.lstrip(" ") for line in chunk)
                found.append(body if body.endswith("\n") else body + "\n")
    return found


_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def heldout_functions(
    count: int, min_lines: int = 3, max_chars: int = 400, files: list[SourceFile] | None = None
) -> list[str]:
    """A fixed list of short, distinct held-out functions (the copy and FIM evaluation set)."""
    if files is None:
        files = split_files(stdlib_files())[1]
    chosen, seen = [], set()
    for source in sorted(files, key=lambda f: f.path):
        for body in functions(source.text):
            if (
                body.count("\n") >= min_lines
                and len(body) <= max_chars
                and body not in seen
                and "\t" not in body
                and not _NON_ASCII.search(body)
            ):
                seen.add(body)
                chosen.append(body)
    # Interleave across files deterministically: sort by a hash so one big file does not dominate.
    chosen.sort(key=lambda body: hashlib.sha256(body.encode()).hexdigest())
    return chosen[:count]
