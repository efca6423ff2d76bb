"""Where tests/editors/setup_vscode.sh puts the real VS Code (code-server), and packaging the
extension from the checkout's sources.

Used by the test and by the setup script (`python3 tests/editors/vscode_env.py package OUT.vsix`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CODE_SERVER_VERSION = "4.100.3"
REPO = Path(__file__).resolve().parents[2]
EXTENSION_SOURCE = REPO / "editors" / "vscode"
SETUP_HINT = "bash tests/editors/setup_vscode.sh"


def cache_dir() -> Path:
    configured = os.environ.get("CODESPEC_EDITORS_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "codespec-editors"


def code_server_entry() -> Path:
    return (
        cache_dir()
        / f"code-server-{CODE_SERVER_VERSION}"
        / "node_modules"
        / "code-server"
        / "out"
        / "node"
        / "entry.js"
    )


def vsce() -> Path:
    return cache_dir() / "bin" / "vsce"


def extension_node_modules() -> Path:
    return cache_dir() / "extension-deps" / "node_modules"


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def missing() -> list[str]:
    """What the editor test needs and does not find (empty: everything is there)."""
    problems = []
    if not code_server_entry().is_file():
        problems.append(f"code-server {CODE_SERVER_VERSION} (looked for {code_server_entry()})")
    if shutil.which("node") is None:
        problems.append("node")
    if chromium() is None:
        problems.append("chromium (Debian package)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        problems.append("the playwright Python package")
    if not vsce().exists():
        problems.append(f"@vscode/vsce (looked for {vsce()})")
    if not (extension_node_modules() / "vscode-languageclient").is_dir():
        problems.append(f"the extension's npm dependencies (looked in {extension_node_modules()})")
    if shutil.which("codespec") is None:
        problems.append("the codespec executable on PATH (pip install -e .)")
    return problems


def package_extension(out: Path) -> Path:
    """Package editors/vscode as it is in the checkout into OUT (a .vsix), with vsce.

    The sources are copied next to the dependencies setup_vscode.sh installed, so the checkout
    gets no node_modules and whatever extension.js says now is what VS Code runs.
    """
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="codespec-vsix-") as build:
        build_dir = Path(build) / "extension"
        shutil.copytree(EXTENSION_SOURCE, build_dir, ignore=shutil.ignore_patterns("node_modules", "*.vsix"))
        shutil.copytree(extension_node_modules(), build_dir / "node_modules", symlinks=True)
        packaged = subprocess.run(
            [str(vsce()), "package", "--out", str(out), "--skip-license", "--allow-missing-repository"],
            cwd=build_dir,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
        )
    if packaged.returncode != 0 or not out.is_file():
        raise RuntimeError(f"vsce package failed ({packaged.returncode}):\n{packaged.stdout}\n{packaged.stderr}")
    return out


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "package":
        print(package_extension(Path(sys.argv[2])))
    else:
        sys.exit("usage: vscode_env.py package OUT.vsix")
