"""Editor end-to-end tests: the `editors` marker, the install check, and keeping artifacts on failure.

The tests need what `bash tests/editors/setup_vscode.sh` installs. Without it they are skipped,
except under CI (CI=true), where a missing install is a failure: CI must not pass by skipping.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import vscode_env

FAILED = pytest.StashKey[bool]()
ARTIFACTS = pytest.StashKey[list]()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "editors: end-to-end tests inside a real editor (VS Code via code-server; "
        "install with bash tests/editors/setup_vscode.sh)",
    )
    config.stash[ARTIFACTS] = []


@pytest.fixture(scope="session")
def vscode_installed() -> None:
    """Fail (CI) or skip (elsewhere) when the real VS Code and its browser are not installed."""
    problems = vscode_env.missing()
    if not problems:
        return
    message = f"VS Code end-to-end test needs: {'; '.join(problems)}. Install them with `{vscode_env.SETUP_HINT}`"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and the editor test cannot run: {message}", pytrace=False)
    pytest.skip(message)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and item.get_closest_marker("editors") is not None:
        item.config.stash[FAILED] = True


@pytest.fixture(scope="session")
def editors_outcome(request):
    """`.failed()`: has an editors test failed so far; `.keep(path)`: list path in the summary."""
    config = request.config
    return SimpleNamespace(
        failed=lambda: config.stash.get(FAILED, False), keep=lambda path: config.stash[ARTIFACTS].append(str(path))
    )


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    kept = config.stash.get(ARTIFACTS, [])
    if kept:
        terminalreporter.section("editor test artifacts")
        for path in kept:
            terminalreporter.write_line(f"kept (screenshots, VS Code logs, LSP trace): {path}")
