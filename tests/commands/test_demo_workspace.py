"""Where `codespec demo` works: the example workspace shipped in the package, from whatever folder it is run."""

import pytest

from codespec.commands.demo import demo_workspace
from codespec.core.errors import CodespecError


def test_the_demo_finds_its_workspace_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the repository's root
    assert (demo_workspace(None) / "report.py").is_file()
    assert demo_workspace(tmp_path) == tmp_path
    with pytest.raises(CodespecError, match="not a directory"):
        demo_workspace(tmp_path / "missing")
