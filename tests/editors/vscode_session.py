"""One real VS Code (code-server) with the codespec extension installed, driven through headless
Chromium (playwright), and the LSP trace its client writes: shared by the editor test modules
(test_vscode.py, test_vscode_next_edit.py). Install what it needs with
`bash tests/editors/setup_vscode.sh`."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import vscode_env

from codespec.vllm_proposer.launch import free_port

# Flags that work as root in a container without a GPU; nothing may reach the network.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
GHOST = ".monaco-editor .ghost-text-decoration, .monaco-editor .ghost-text-decoration-preview"
STARTUP_S = 120  # code-server + workbench + extension host + `codespec serve` loading its model
GHOST_S = 120  # first completion (2 shared cores: be patient)
STEP_S = 60  # anything else


class Trace:
    """The LSP messages vscode-languageclient logged (codespec.trace.server, JSON format)."""

    def __init__(self, logs: Path):
        self.logs = logs

    def files(self) -> list[Path]:
        return sorted(self.logs.glob("*/exthost*/codespec.codespec/*.log"))

    def messages(self) -> list[dict]:
        found = []
        for path in self.files():
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                start = line.find('{"isLSPMessage"')
                if start < 0:
                    continue
                try:
                    found.append(json.loads(line[start:]))
                except json.JSONDecodeError:  # a line still being written
                    continue
        return found

    def requests(self, method: str, after: int = 0) -> list[dict]:
        return [
            m["message"]
            for m in self.messages()[after:]
            if m["type"] == "send-request" and m["message"].get("method") == method
        ]

    def response(self, request: dict) -> dict | None:
        for m in self.messages():
            if m["type"] == "receive-response" and m["message"].get("id") == request["id"]:
                return m["message"]
        return None

    def inline_items(self, after: int = 0) -> dict[str, tuple[dict, dict]]:
        """insertText -> (request, item) of every inline completion item received."""
        offered = {}
        for request in self.requests("textDocument/inlineCompletion", after=after):
            response = self.response(request)
            result = response.get("result") if response else None
            if result:
                for item in result["items"] if isinstance(result, dict) else result:
                    offered[item["insertText"]] = (request, item)
        return offered

    def notifications(self, method: str, after: int = 0) -> list[dict]:
        return [
            m["message"]
            for m in self.messages()[after:]
            if m["type"] in ("receive-notification", "send-notification") and m["message"].get("method") == method
        ]


class VSCode:
    """One code-server with the extension installed, one browser page on it."""

    def __init__(self, root: Path, files: Mapping[str, str], model: str | None = None, settings: Mapping = {}):
        self.root = root
        self.files = dict(files)  # the workspace: name -> text
        self.settings = dict(settings)  # user settings on top of the ones every test needs
        self.model = model  # codespec.model: None for the shipped model, else a path (a GGUF file)
        self.workspace = root / "workspace"
        self.user_data = root / "user-data"
        self.extensions = root / "extensions"
        self.screenshots = root / "screenshots"
        self.trace = Trace(self.user_data / "logs")
        self.process: subprocess.Popen | None = None
        self.playwright: Any = None
        self.browser: Any = None
        self.page: Any = None
        self.shots = 0

    # --- setup ----------------------------------------------------------------------------------
    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VSCODE_")}
        for name, sub in (
            ("XDG_CONFIG_HOME", "xdg/config"),
            ("XDG_DATA_HOME", "xdg/data"),
            ("XDG_CACHE_HOME", "xdg/cache"),
            ("TMPDIR", "tmp"),
        ):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
            env[name] = str(self.root / sub)
        return env

    def code_server(self, *args: str) -> list[str]:
        return [
            "node",
            str(vscode_env.code_server_entry()),
            "--user-data-dir",
            str(self.user_data),
            "--extensions-dir",
            str(self.extensions),
            *args,
        ]

    def prepare(self) -> None:
        self.workspace.mkdir()
        for name, text in self.files.items():
            (self.workspace / name).write_text(text)
        settings = {
            "codespec.command": shutil.which("codespec"),
            "codespec.device": "cpu",
            **({"codespec.core.model": self.model} if self.model else {}),
            # vscode-languageclient logs every JSON-RPC message (needs the channel at trace level:
            # code-server runs with --log trace)
            "codespec.trace.server": {"verbosity": "verbose", "format": "json"},
            "files.autoSave": "off",
            "workbench.startupEditor": "none",
            "workbench.tips.enabled": False,
            "security.workspace.trust.enabled": False,
            "telemetry.telemetryLevel": "off",
            "update.mode": "none",
            "extensions.autoCheckUpdates": False,
            "extensions.autoUpdate": False,
            "git.enabled": False,
            "editor.minimap.enabled": False,
            # keep the suggest widget out of the way of Tab (inline suggestions stay on, the default)
            "editor.quickSuggestions": {"other": "off", "comments": "off", "strings": "off"},
            "editor.suggestOnTriggerCharacters": False,
            **self.settings,
        }
        (self.user_data / "User").mkdir(parents=True)
        (self.user_data / "User" / "settings.json").write_text(json.dumps(settings, indent=2))

        vsix = vscode_env.package_extension(self.root / "codespec.vsix")
        installed = subprocess.run(
            self.code_server("--install-extension", str(vsix)),
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=STEP_S,
        )
        (self.root / "install-extension.log").write_text(installed.stdout + installed.stderr)
        assert installed.returncode == 0 and "successfully installed" in installed.stdout, (
            f"code-server --install-extension failed:\n{installed.stdout}\n{installed.stderr}"
        )

    def start(self) -> None:
        port = free_port()
        log = open(self.root / "code-server.log", "wb")
        # its own session (process group): the extension host, `codespec serve` and the file
        # watcher all go when the group is stopped
        self.process = subprocess.Popen(
            self.code_server(
                "--log",
                "trace",
                "--auth",
                "none",
                "--bind-addr",
                f"127.0.0.1:{port}",
                "--disable-telemetry",
                "--disable-update-check",
                "--disable-workspace-trust",
                "--disable-getting-started-override",
                "--ignore-last-opened",
                str(self.workspace),
            ),
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + STARTUP_S
        while True:
            assert self.process.poll() is None, (
                f"code-server exited ({self.process.returncode}): {self.root / 'code-server.log'}"
            )
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=5):
                    break
            except (urllib.error.URLError, OSError):
                assert time.monotonic() < deadline, f"code-server did not answer on {url}"
                time.sleep(0.2)

        from playwright.sync_api import sync_playwright

        self.playwright = sync_playwright().start()
        self.browser = self.playwright.chromium.launch(
            executable_path=vscode_env.chromium(), headless=True, args=CHROMIUM_FLAGS, env=self.env()
        )  # its crash folder, too
        self.page = self.browser.new_page(viewport={"width": 1400, "height": 900})
        self.page.set_default_timeout(STEP_S * 1000)
        self.page.goto(f"{url}/?folder={self.workspace}")
        self.page.wait_for_selector(".monaco-workbench", timeout=STARTUP_S * 1000)
        self.page.wait_for_selector(".explorer-folders-view", timeout=STARTUP_S * 1000)
        self.shot("workbench")

    def stop(self) -> None:
        if self.browser is not None:
            try:
                self.browser.close()
            except Exception:
                pass
        if self.playwright is not None:
            self.playwright.stop()
        if self.process is not None and self.process.poll() is None:
            group = self.process.pid  # the session leader's pid is the group id
            os.killpg(group, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and group_alive(group):
                time.sleep(0.2)
            if group_alive(group):
                os.killpg(group, signal.SIGKILL)
            self.process.wait(timeout=15)

    # --- driving the page -----------------------------------------------------------------------
    def shot(self, name: str) -> Path:
        self.shots += 1
        self.screenshots.mkdir(exist_ok=True)
        path = self.screenshots / f"{self.shots:02d}-{name}.png"
        try:
            self.page.screenshot(path=str(path))
        except Exception:
            pass
        return path

    def wait(self, what: str, check, timeout: float = STEP_S, every=None, every_s: float = 20.0):
        """Poll `check()` until it returns something truthy (and return that) or fail after
        `timeout` s with a screenshot; `every()` runs each `every_s` seconds while waiting.
        A `codespec serve` that exited fails the wait at once."""
        deadline = time.monotonic() + timeout
        nudge = time.monotonic() + every_s
        while True:
            value = check()
            if value:
                return value
            exited = self.server_exited()
            if exited or time.monotonic() > deadline:
                shot = self.shot("timeout")
                reason = f"`codespec serve` exited ({exited})" if exited else f"not seen within {timeout:.0f} s"
                pytest.fail(f"{what}: {reason} (screenshot {shot}; artifacts in {self.root})\n{self.diagnostics()}")
            if every is not None and time.monotonic() > nudge:
                every()
                nudge = time.monotonic() + every_s
            self.page.wait_for_timeout(200)

    def channel(self) -> list[str]:
        """The "codespec" output channel without the LSP trace: the server's stderr, client errors."""
        lines = []
        for path in self.trace.files():
            lines += [
                line
                for line in path.read_text(encoding="utf-8", errors="replace").splitlines()
                if '{"isLSPMessage"' not in line
            ]
        return lines

    def server_exited(self) -> str | None:
        for line in self.channel():
            if "Server process exited with code" in line:
                return line.split("] ", 1)[-1]
        return None

    def diagnostics(self) -> str:
        """What a failure report needs: is code-server up, what did the server say (its stderr and
        the client's errors land in the "codespec" output channel)."""
        lines = []
        if self.process is not None:
            code = self.process.poll()
            lines.append("code-server: running" if code is None else f"code-server: exited with {code}")
        channel = self.channel()
        lines.append(f"codespec output channel ({len(channel)} lines besides the LSP trace), last 40:")
        lines += ["  " + line[:300] for line in channel[-40:]]
        return "\n".join(lines)

    def palette(self, text: str, label: str | None = None) -> None:
        """Run a command through the command palette (F1), as a person would."""
        page = self.page
        page.keyboard.press("F1")
        box = page.locator(".quick-input-widget .quick-input-box input")
        box.wait_for(state="visible")
        page.keyboard.type(text)
        page.locator(".quick-input-widget .monaco-list-row.focused", has_text=label or text).wait_for()
        page.keyboard.press("Enter")

    def open_file(self, name: str) -> None:
        page = self.page
        page.keyboard.press("Control+P")
        page.locator(".quick-input-widget .quick-input-box input").wait_for(state="visible")
        page.keyboard.type(name)
        page.locator(".quick-input-widget .monaco-list-row.focused", has_text=name).wait_for()
        page.keyboard.press("Enter")
        page.locator(f'.tabs-container .tab.active[aria-label*="{name}"]').wait_for()
        page.locator(".editor-group-container.active .monaco-editor.focused").wait_for()
        uri = (self.workspace / name).as_uri()
        self.wait(
            f"textDocument/didOpen of {name} in the LSP trace",
            lambda: [
                n for n in self.trace.notifications("textDocument/didOpen") if n["params"]["textDocument"]["uri"] == uri
            ],
        )

    def go_to(self, position: str) -> None:
        self.page.keyboard.press("Control+G")
        self.page.locator(".quick-input-widget .quick-input-box input").wait_for(state="visible")
        self.page.keyboard.type(position)
        self.page.keyboard.press("Enter")
        self.page.locator(".quick-input-widget").wait_for(state="hidden")

    def save(self, name: str) -> str:
        self.page.keyboard.press("Control+S")
        self.page.locator(f'.tabs-container .tab.active[aria-label*="{name}"]').wait_for()
        self.wait(f"{name} saved", lambda: self.page.locator(".tabs-container .tab.active.dirty").count() == 0)
        return (self.workspace / name).read_text()

    def ghost_text(self) -> str:
        spans = self.page.locator(GHOST)
        return "".join(spans.nth(i).text_content() or "" for i in range(spans.count()))


def group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def gguf_model(tmp_path_factory) -> str:
    """The shipped model as a Q8_0 GGUF file (the llama.cpp backend)."""
    pytest.importorskip("llama_cpp", reason="the llama.cpp backend needs: pip install 'codespec[gguf]'")
    pytest.importorskip("gguf", reason="export needs gguf-py: pip install 'codespec[gguf]'")
    from codespec.core.default_model import target_path
    from codespec.core.gguf_export import export_gguf

    return str(export_gguf(target_path(), tmp_path_factory.mktemp("gguf") / "default-q8_0.gguf", "q8_0"))


@contextlib.contextmanager
def running(label: str, files: Mapping[str, str], editors_outcome, model: str | None = None, settings: Mapping = {}):
    """A started VS Code on a workspace of ``files`` whose codespec server has initialized;
    stopped afterwards, its artifacts kept when an editors test failed."""
    root = Path(tempfile.mkdtemp(prefix=f"codespec-vscode-{label}-"))
    session = VSCode(root, files, model, settings)
    ready = False
    try:
        session.prepare()
        session.start()
        session.wait(
            "the codespec server initialized (initialize response in the LSP trace)",
            lambda: any(
                m["type"] == "receive-response" and m["message"].get("id") == 0 and "result" in m["message"]
                for m in session.trace.messages()
            ),
            timeout=STARTUP_S,
        )
        ready = True
        yield session
    finally:
        session.stop()
        if not ready or editors_outcome.failed() or os.environ.get("CODESPEC_KEEP_EDITOR_ARTIFACTS"):
            editors_outcome.keep(root)
            print(f"\neditor test artifacts kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
