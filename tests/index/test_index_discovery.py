"""Workspace discovery: .gitignore subset, excludes, binary / oversize / link-escape skips."""

from __future__ import annotations

import logging
import os

from codespec.index import WorkspaceIndex
from codespec.index.discovery import Found, Skipped, discover, parse_rules


def _names(root, items):
    return sorted(str(i.path.relative_to(root)) for i in items if isinstance(i, Found))


def test_gitignore_subset(tmp_path):
    root = tmp_path / "ws"
    files = [
        "keep.py",
        "build/out.py",
        "src/app.py",
        "src/app.log",
        "src/important.log",
        "src/gen/x.py",
        "docs/a.md",
        "docs/deep/b.md",
        "deep/nested/tmp/y.py",
        "top.py",
        "sub/top.py",
        "src/.cache/z.py",
    ]
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"# {name}\n")
    (root / ".gitignore").write_text(
        "# comment\n\nbuild/\n*.log\n!important.log\n/top.py\n**/tmp/\ndocs/**/*.md\n.cache\n"
    )
    (root / "src" / ".gitignore").write_text("gen/\n")
    (root / ".git").mkdir()
    (root / ".git" / "config.py").write_text("x = 1\n")
    found = _names(root, discover([root]))
    assert found == sorted(
        [".gitignore", "keep.py", "src/.gitignore", "src/app.py", "src/important.log", "sub/top.py"]
    )  # docs/**/*.md also matches docs/a.md, as in git
    found = _names(root, discover([root], exclude=["keep.*", "sub/"]))
    assert "sub/top.py" not in found and "keep.py" not in found and "src/app.py" in found


def test_rule_parsing_edge_cases():
    rules = parse_rules(["a?c", "[xy]z", "\\!bang", "lib/**", "trailing   "])

    def ignored(path):
        verdict = False
        for rule in rules:
            if rule.regex.match(path):
                verdict = not rule.negate
        return verdict

    assert ignored("abc") and ignored("d/abc") and not ignored("abbc")
    assert ignored("xz") and not ignored("zz")
    assert ignored("!bang")
    assert ignored("lib/a/b.py") and not ignored("other/lib")
    assert ignored("trailing")


def test_binary_oversize_and_link_escape(tmp_path, caplog, index_tokenizer):
    root = tmp_path / "ws"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "ok.py").write_text("value = 1\n")
    (root / "blob.bin").write_bytes(b"\x00\x01\x02abc")
    (root / "latin.txt").write_bytes(b"caf\xe9\n")
    (root / "big.py").write_text("x = 1\n" * 1000)
    (outside / "secret.py").write_text("secret = 1\n")
    (outside / "dir").mkdir()
    (outside / "dir" / "more.py").write_text("more = 1\n")
    os.symlink(outside / "secret.py", root / "escape.py")
    os.symlink(outside / "dir", root / "escape_dir")
    os.symlink(root / "ok.py", root / "alias.py")  # a link inside the roots: its target is read once, directly
    with caplog.at_level(logging.INFO, logger="codespec.index"):
        items = list(discover([root], max_file_bytes=1000))
    assert _names(root, items) == ["ok.py"]
    reasons = {i.path.name: i.reason for i in items if isinstance(i, Skipped)}
    assert reasons["blob.bin"].startswith("binary") and reasons["latin.txt"].startswith("binary")
    assert reasons["big.py"].startswith("oversize")
    assert reasons["escape.py"] == reasons["escape_dir"] == "link outside roots"
    for name in ("blob.bin", "latin.txt", "big.py", "escape.py", "escape_dir"):
        assert sum(name in r.getMessage() for r in caplog.records) == 1  # one log line each
    index = WorkspaceIndex(index_tokenizer)
    calls = []
    report = index.index_workspace(
        [root], max_file_bytes=1000, progress=lambda done, total: calls.append((done, total))
    )
    assert report.files == 1 and len(report.skipped) == 5
    assert calls and calls[-1] == (1, 1)
    assert all("secret" not in index.document_text(u) for u in index.documents())


def _found_paths(items):
    paths = [os.path.realpath(i.path) for i in items if isinstance(i, Found)]
    assert len(paths) == len(set(paths)), f"a file was yielded twice: {paths}"
    return sorted(paths)


def test_several_roots_yield_each_file_once(tmp_path, caplog, index_tokenizer):
    a, b, outside = tmp_path / "a", tmp_path / "b", tmp_path / "outside"
    for directory in (a / "sub", b, outside):
        directory.mkdir(parents=True)
    (a / "x.py").write_text("alpha = 1\n")
    (a / "sub" / "y.py").write_text("beta = 2\n")
    (b / "z.py").write_text("gamma = 3\n")
    (outside / "secret.py").write_text("secret = 4\n")
    os.symlink(b / "z.py", a / "link_to_z.py")  # from one root into the other
    os.symlink(a / "sub", b / "link_to_sub")
    os.symlink(outside / "secret.py", b / "escape.py")  # out of every root
    os.symlink(a, tmp_path / "a_again")
    x, y, z = (os.path.realpath(p) for p in (a / "x.py", a / "sub" / "y.py", b / "z.py"))

    with caplog.at_level(logging.INFO, logger="codespec.index"):
        items = list(discover([a, b]))
    assert _found_paths(items) == sorted([x, y, z])
    assert [i.path.name for i in items if isinstance(i, Skipped)] == ["escape.py"]
    assert sum("escape.py" in r.getMessage() for r in caplog.records) == 1
    for roots in ([a, a / "sub"], [a / "sub", a], [a, a], [a, tmp_path / "a_again"]):
        assert _found_paths(discover(roots)) == sorted([x, y]), roots
    assert _found_paths(discover([a / "sub", b])) == sorted([y, z])

    index = WorkspaceIndex(index_tokenizer)
    assert index.index_workspace([a, a / "sub"]).files == 2
    report = index.index_workspace([a, b, a / "sub"])
    assert report.files == 3 and report.tokenized == 1
    assert sorted(index.documents()) == sorted(p.as_uri() for p in (a / "x.py", a / "sub" / "y.py", b / "z.py"))
    assert all("secret" not in index.document_text(u) for u in index.documents())
    index.check_integrity()


def test_a_nested_root_adds_what_the_outer_root_ignores(tmp_path, caplog):
    """A folder the user lists inside another (a multi-root workspace with vendor/lib) is indexed
    even when the outer root's .gitignore leaves it out; nothing is yielded or logged twice."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    lib = ws / "vendor" / "lib"
    (lib / "build").mkdir(parents=True)
    outside.mkdir()
    (ws / ".gitignore").write_text("vendor/\n")
    (ws / "main.py").write_text("main = 1\n")
    (lib / "api.py").write_text("api = 2\n")
    (lib / "build" / "gen.py").write_text("gen = 3\n")
    (outside / "secret.py").write_text("secret = 4\n")
    os.symlink(outside / "secret.py", lib / "escape.py")
    with caplog.at_level(logging.INFO, logger="codespec.index"):
        items = list(discover([ws, lib], exclude=["build/"]))  # the exclude is relative to each root
    assert _names(ws, items) == [".gitignore", "main.py", "vendor/lib/api.py"]
    assert [i.path.name for i in items if isinstance(i, Skipped)] == ["escape.py"]
    assert sum("escape.py" in r.getMessage() for r in caplog.records) == 1
    (ws / ".gitignore").write_text("")  # now the outer walk reaches the folder itself: each file once
    both = list(discover([lib, ws], exclude=["build/"]))  # both walks meet the link out: one skip
    assert _names(ws, both) == [".gitignore", "main.py", "vendor/lib/api.py"]
    assert [i.path.name for i in both if isinstance(i, Skipped)] == ["escape.py"]
    assert _names(ws, discover([lib, ws])) == [".gitignore", "main.py", "vendor/lib/api.py", "vendor/lib/build/gen.py"]


def test_gitignore_link_out_of_the_roots_is_not_read(tmp_path, caplog):
    root, outside = tmp_path / "ws", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "rules").write_text("secret_rule.py\n")
    os.symlink(outside / "rules", root / ".gitignore")
    (root / "secret_rule.py").write_text("x = 1\n")
    (root / "ok.py").write_text("y = 2\n")
    (root / "inside_rules").write_text("*.tmp.py\n")
    os.symlink(root / "inside_rules", root / "sub" / ".gitignore")  # a link inside the roots is read
    (root / "sub" / "scratch.tmp.py").write_text("z = 3\n")
    (root / "sub" / "kept.py").write_text("w = 4\n")
    with caplog.at_level(logging.INFO, logger="codespec.index"):
        items = list(discover([root]))
    names = _names(root, items)
    assert "secret_rule.py" in names and "sub/scratch.tmp.py" not in names
    assert names == ["inside_rules", "ok.py", "secret_rule.py", "sub/kept.py"]
    assert [(i.path.name, i.reason) for i in items if isinstance(i, Skipped)] == [(".gitignore", "link outside roots")]
    assert sum(".gitignore" in r.getMessage() for r in caplog.records) == 1  # one log line


def test_open_buffer_wins_over_disk(tmp_path, index_tokenizer):
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.py").write_text("on_disk = 1\n")
    index = WorkspaceIndex(index_tokenizer)
    index.index_workspace([root])
    uri = (root / "a.py").absolute().as_uri()
    assert index.document_text(uri) == "on_disk = 1\n"
    index.add_document(uri, "in_buffer = 2\n", version=5)
    report = index.index_workspace([root])
    assert index.document_text(uri) == "in_buffer = 2\n" and report.unchanged == 1 and report.tokenized == 0
    index.check_integrity()


def test_lookups_and_edits_proceed_during_a_scan(tmp_path, index_tokenizer, index_adapter):
    """The scan tokenizes without the lock: another thread can look up and edit meanwhile, and
    a file opened in the editor during the scan keeps its buffer."""
    import threading

    root = tmp_path / "ws"
    root.mkdir()
    for n in range(300):
        (root / f"m{n}.py").write_text(f"value_{n} = compute_{n}(argument)\n")
    index = WorkspaceIndex(index_tokenizer)
    index.add_document("mem://open", "opened = make_opened(buffer)\n")
    scanning, resumed = threading.Event(), threading.Event()

    def progress(done, total):
        if done < total:
            scanning.set()
            assert resumed.wait(30), "the main thread could not use the index during the scan"

    worker = threading.Thread(target=lambda: index.index_workspace([root], progress=progress))
    worker.start()
    assert scanning.wait(30)
    found = index.lookup(index_adapter.encode("x = make_opened("), 4)
    assert found and found[0].source == "mem://open"
    buffer_uri = (root / "m7.py").absolute().as_uri()
    index.add_document(buffer_uri, "editor_buffer = 7\n")
    resumed.set()
    worker.join(60)
    assert not worker.is_alive()
    assert index.document_text(buffer_uri) == "editor_buffer = 7\n"
    assert index.document_text((root / "m8.py").absolute().as_uri()) == "value_8 = compute_8(argument)\n"
    index.check_integrity()
