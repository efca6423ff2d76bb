"""The docs as a user and a maintainer read them: the README stays a short page, every relative
link lands on a file (and, for a Markdown file, on a heading or an ``<a id>`` anchor in it), the
docs describe the system as it is (dated runs live only in docs/benchmarks.md), and no doc names a
module path from before the one ``codespec`` namespace."""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))


def editor_readmes() -> list[Path]:
    """README files of the editor clients; an ``npm install`` tree is not walked."""
    found = []
    for folder, subfolders, files in os.walk(ROOT / "editors"):
        subfolders[:] = [name for name in subfolders if name != "node_modules" and not name.startswith(".")]
        found += [Path(folder) / name for name in files if name.startswith("README")]
    return sorted(found)


EDITOR_READMES = editor_readmes()
PAGES = [README, *DOCS, *EDITOR_READMES]
README_MAX_LINES = 150
RUN_LOG = ROOT / "docs" / "benchmarks.md"  # the one page that records what was measured, on what

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.MULTILINE)
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)
DATED = re.compile(r"\b20\d\d-\d\d-\d\d\b|\bthis session\b", re.IGNORECASE)
OLD_PARTS = "service|lsp|proposers|index|http_api|websocket_api|commands|vllm_proposer"
# `service/engine/service.py`, `lsp/` ... as a path of its own (not `codespec/lsp/`, not `tests/lsp/`)
OLD_DIR = re.compile(rf"(?<![\w./-])(?:{OLD_PARTS})/")
# `commands.cli`, `vllm_proposer.proposer...` as a module path of its own (not `codespec.commands.cli`)
OLD_MODULE = re.compile(
    r"(?<![\w./-])(?:service|lsp|proposers|http_api|websocket_api|commands|vllm_proposer)\.(?!md\b|py\b)[a-z_]+"
)
OLD_RUN = re.compile(r"python -m commands\b")


def core_module_names() -> list[str]:
    return sorted(path.stem for path in (ROOT / "codespec" / "core").glob("*.py") if path.stem != "__init__")


def prose(text: str) -> str:
    """The text a reader sees as prose and links: fenced blocks and code spans left out."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
    text = re.sub(r"<[^>]+>", "", text).lower()
    kept = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LN")
    return kept.replace(" ", "-")


def anchors_of(page: Path) -> set[str]:
    text = page.read_text(encoding="utf-8")
    anchors = set(HTML_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for heading in HEADING.findall(FENCE.sub("", text)):
        base = slug(heading)
        count = seen.get(base, 0)
        anchors.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return anchors


def relative_links(page: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(prose(page.read_text(encoding="utf-8")))
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:
    ]


def test_slug_follows_github():
    assert slug("§3 Metrics") == "3-metrics"
    assert (
        slug("`codespec demo`: what it shows, and how far to trust it")
        == "codespec-demo-what-it-shows-and-how-far-to-trust-it"
    )
    assert slug("One inline completion, end to end") == "one-inline-completion-end-to-end"


def test_the_link_check_sees_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[there](missing.md) [here](#title) `[code](nowhere.md)`\n", encoding="utf-8")
    assert relative_links(page) == ["missing.md", "#title"]
    assert "title" in anchors_of(page)


def test_readme_is_a_short_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; keep it to {README_MAX_LINES}"


def test_readme_has_the_two_fresh_machine_commands():
    text = README.read_text(encoding="utf-8")
    assert "pip install torch==2.13.0 -e . && codespec demo" in text
    assert 'pip install torch==2.13.0 -e ".[test]" && python -m pytest' in text


@pytest.mark.parametrize("page", PAGES, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_lands(page: Path):
    broken = []
    for target in relative_links(page):
        path_part, _, anchor = target.partition("#")
        destination = (page.parent / path_part).resolve() if path_part else page
        if not destination.exists():
            broken.append(
                f"{target}: no file {destination.relative_to(ROOT) if destination.is_relative_to(ROOT) else destination}"
            )
        elif anchor and destination.suffix == ".md" and anchor not in anchors_of(destination):
            broken.append(f"{target}: no heading or <a id> '{anchor}' in {destination.relative_to(ROOT)}")
    assert not broken, "broken links in " + str(page.relative_to(ROOT)) + ":\n" + "\n".join(broken)


@pytest.mark.parametrize(
    "page", [README, *(doc for doc in DOCS if doc != RUN_LOG)], ids=lambda path: str(path.relative_to(ROOT))
)
def test_docs_describe_the_system_not_a_dated_run(page: Path):
    hits = [line.strip() for line in page.read_text(encoding="utf-8").splitlines() if DATED.search(line)]
    assert not hits, f"{page.relative_to(ROOT)}: dated runs belong in docs/benchmarks.md:\n" + "\n".join(hits)


def test_readme_names_no_issue_or_commit():
    text = README.read_text(encoding="utf-8")
    assert not re.search(r"\bissue \d+|#\d{2,}\b", text, re.IGNORECASE)
    assert not re.search(r"\b[0-9a-f]{7,40}\b", prose(text)), "a commit hash in README.md"


@pytest.mark.parametrize("page", PAGES, ids=lambda path: str(path.relative_to(ROOT)))
def test_docs_name_the_codespec_namespace(page: Path):
    text = page.read_text(encoding="utf-8")
    old_core = re.compile(rf"(?<![\w./-])codespec/(?:{'|'.join(core_module_names())})\.py")
    stale = []
    # the one place a page may name an old path on purpose: quoting the error a stale vLLM config gets
    quoted = {number for number, line in enumerate(text.splitlines(), 1) if "'vllm_proposer." in line}
    for number, line in enumerate(text.splitlines(), 1):
        if number in quoted:
            continue
        for pattern in (OLD_DIR, OLD_MODULE, OLD_RUN, old_core):
            stale += [f"{number}: {match.group(0)!r} in {line.strip()}" for match in pattern.finditer(line)]
    assert not stale, f"{page.relative_to(ROOT)} names paths from before the codespec namespace:\n" + "\n".join(stale)


def test_the_namespace_check_sees_old_paths():
    line = "see `service/engine/service.py`, `python -m commands.cli`, `codespec/model.py` and `vllm_proposer.proposer`"
    old_core = re.compile(rf"(?<![\w./-])codespec/(?:{'|'.join(core_module_names())})\.py")
    found = [m.group(0) for pattern in (OLD_DIR, OLD_MODULE, OLD_RUN, old_core) for m in pattern.finditer(line)]
    assert found == ["service/", "commands.cli", "vllm_proposer.proposer", "python -m commands", "codespec/model.py"]
    assert not OLD_DIR.search("`codespec/service/engine/service.py`, tests/lsp/test_x.py, [index.md](index.md)")
