"""The codespec VS Code extension inside a real VS Code (code-server 4.100.3 = VS Code 1.100.3),
driven like a person would through headless Chromium (playwright): open a workspace, type, trigger
an inline suggestion, see the ghost text, accept it with Tab, rewrite a selection from the command
palette. The extension is packaged from the checkout with vsce and installed with
`code-server --install-extension`; it starts `codespec serve` on the shipped default model.

What reached the server is read from the extension's own LSP trace (`codespec.trace.server`,
JSON format, written by vscode-languageclient to the "codespec" output channel, which VS Code
keeps in <user-data-dir>/logs/*/exthost1/codespec.codespec/codespec.log), and from the server
itself: its `codespec/stats` reply (run through "codespec: Show Statistics") lists the accepted
text in its session history. Document contents are checked on disk after Ctrl+S.

Install what this needs with `bash tests/editors/setup_vscode.sh`. Screenshots, VS Code's logs
and the trace stay in a temporary folder when a test fails (its path is printed at the end).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import vscode_env

from vllm_proposer.launch import free_port

pytestmark = [pytest.mark.slow, pytest.mark.editors]  # slow: `python -m pytest --full` runs it

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

SHAPES = """def area_of_square(side):
    return side * side


def area_of_rectangle(width, height):
    return width * height


def perimeter_of_square(side):
    return 4 * side


def perimeter_of_rectangle(width, height):
    return 2 * (width + height)


def describe_square(side):
    print("area", area_of_square(side))
    print("perimeter", perimeter_of_square(side))


def describe_rectangle(width, height):
    print("area", area_of_rectangle(width, height))
"""
TYPED = 'print("perimeter", '  # typed on a new line after line 23 (auto-indented by 4 spaces)

REPORT = """import math


def circle_area(radius):
    result = math.pi * radius * radius
    return result


def circle_perimeter(radius):
    result = 2 * math.pi * radius
    return result
"""
REWRITE_LINES = (4, 6)  # 1-based, inclusive: circle_area, signature and body
INSTRUCTION = "return the expression directly"


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

    def __init__(self, root: Path, model: str | None = None):
        self.root = root
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
        (self.workspace / "shapes.py").write_text(SHAPES)
        (self.workspace / "report.py").write_text(REPORT)
        settings = {
            "codespec.command": shutil.which("codespec"),
            "codespec.device": "cpu",
            **({"codespec.model": self.model} if self.model else {}),
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
    from codespec.default_model import target_path
    from codespec.gguf_export import export_gguf

    return str(export_gguf(target_path(), tmp_path_factory.mktemp("gguf") / "default-q8_0.gguf", "q8_0"))


# Each test runs in one VS Code whose server uses the shipped model as it ships (PyTorch), then in
# one whose server runs it as a GGUF file on llama.cpp (the codespec.model setting).
@pytest.fixture(scope="module", params=["pytorch", "llama.cpp"])
def vscode(request, vscode_installed, editors_outcome, tmp_path_factory):
    model = gguf_model(tmp_path_factory) if request.param == "llama.cpp" else None
    root = Path(tempfile.mkdtemp(prefix=f"codespec-vscode-{request.param.replace('.', '')}-"))
    session = VSCode(root, model)
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


def test_inline_suggestion_shows_as_ghost_text_and_tab_accepts_it(vscode):
    page = vscode.page
    vscode.open_file("shapes.py")
    uri = (vscode.workspace / "shapes.py").as_uri()
    vscode.go_to("23")
    page.keyboard.press("End")
    page.keyboard.press("Enter")
    page.keyboard.type(TYPED, delay=25)
    mark = trigger_mark = len(vscode.trace.messages())
    # trigger explicitly (editor.action.inlineSuggest.trigger), as well as typing did
    vscode.palette("Trigger Inline Suggestion")

    def retrigger():
        page.keyboard.press("Alt+Backslash")  # the same command's default keybinding

    ghost = vscode.wait(
        "ghost text in the editor", lambda: vscode.ghost_text().strip(), timeout=GHOST_S, every=retrigger
    )
    vscode.shot("ghost-text")

    # the items VS Code got for this spot, from the server (trace)
    offered = vscode.trace.inline_items(after=mark)
    assert offered, "ghost text shown but no inline completion items in the LSP trace"
    invoked = [request for request, _ in offered.values() if request["params"]["context"]["triggerKind"] == 1]
    assert invoked, "no explicitly invoked (triggerKind 1) inline completion request answered with items"
    shown = [text for text in offered if is_subsequence(ghost.replace("\u00a0", " "), text)]
    assert shown, f"ghost text {ghost!r} is none of the items offered: {list(offered)}"
    for _, item in offered.values():
        assert item["insertText"].strip()
        assert item["command"]["command"] == "codespec.accepted"

    mark = len(vscode.trace.messages())
    page.keyboard.press("Tab")
    accepted = vscode.wait(
        "workspace/executeCommand codespec.accepted in the LSP trace",
        lambda: [
            r
            for r in vscode.trace.requests("workspace/executeCommand", after=mark)
            if r["params"]["command"] == "codespec.accepted"
        ],
    )[0]
    answer = vscode.wait("the server's reply to codespec.accepted", lambda: vscode.trace.response(accepted))
    assert "error" not in answer, answer
    accepted_uri, accepted_text = accepted["params"]["arguments"]
    offered = vscode.trace.inline_items(after=trigger_mark)  # and any newer reply shown before Tab
    assert accepted_uri == uri and accepted_text in offered, (accepted_text, list(offered))
    vscode.shot("accepted")

    saved = vscode.save("shapes.py")
    from_line_24 = "\n".join(saved.splitlines()[23:])
    assert from_line_24.startswith("    " + TYPED + accepted_text), (from_line_24, accepted_text)

    # the server itself: its session history has the accepted text
    mark = len(vscode.trace.messages())
    vscode.palette("codespec: Show Statistics")
    stats_request = vscode.wait("codespec/stats request", lambda: vscode.trace.requests("codespec/stats", after=mark))[
        0
    ]
    stats = vscode.wait("codespec/stats reply", lambda: vscode.trace.response(stats_request))["result"]
    assert {"kind": "accepted", "uri": uri, "text": accepted_text} in stats["history"], stats["history"]
    page.locator('.tabs-container .tab.active[aria-label*="Untitled"]').wait_for()
    vscode.wait(
        "the statistics JSON in an editor",
        lambda: (
            '"history_entries"'
            in (page.locator(".editor-group-container.active .view-lines").first.text_content() or "").replace(
                "\u00a0", " "
            )
        ),
    )
    vscode.shot("statistics")


def test_rewrite_selection_applies_the_servers_edit(vscode):
    page = vscode.page
    vscode.open_file("report.py")
    before = (vscode.workspace / "report.py").read_text()
    first, last = REWRITE_LINES
    vscode.go_to(f"{first}:1")
    for _ in range(last - first + 1):
        page.keyboard.press("Shift+ArrowDown")
    vscode.shot("selection")

    mark = len(vscode.trace.messages())
    vscode.palette("codespec: Rewrite Selection", "codespec: Rewrite Selection")
    page.locator(".quick-input-widget .quick-input-message", has_text="Instruction").wait_for()
    page.keyboard.type(INSTRUCTION, delay=10)
    vscode.shot("instruction")
    page.keyboard.press("Enter")

    request = vscode.wait("codespec/edit request", lambda: vscode.trace.requests("codespec/edit", after=mark))[0]
    params = request["params"]
    assert params["instruction"] == INSTRUCTION
    assert params["range"] == {"start": {"line": first - 1, "character": 0}, "end": {"line": last, "character": 0}}, (
        params["range"]
    )
    response = vscode.wait("the server's codespec/edit reply", lambda: vscode.trace.response(request), timeout=GHOST_S)
    assert "error" not in response, response
    result = response["result"]
    (edit,) = result["edits"]
    deltas = [
        n["params"]["text"]
        for n in vscode.trace.notifications("codespec/editDelta", after=mark)
        if n["params"]["editId"] == params["editId"]
    ]
    assert "".join(deltas) == edit["newText"]  # what streamed in adds up to the final edit
    # the extension's status bar line, shown once the edit is applied
    vscode.wait(
        "the rewrite's status bar message",
        lambda: page.locator(".statusbar", has_text="copied from the original").count() > 0,
    )
    vscode.shot("rewritten")

    after = vscode.save("report.py")
    assert after == apply_edit(before, edit), (after, edit)


def is_subsequence(needle: str, haystack: str) -> bool:
    """Every character of `needle` appears in `haystack` in order (ghost text is `insertText`,
    shown in pieces around what is already on the line)."""
    rest = iter(haystack)
    return all(any(c == h for h in rest) for c in needle if not c.isspace())


def offset(text: str, position: dict) -> int:
    lines = text.splitlines(keepends=True)
    return sum(len(line) for line in lines[: position["line"]]) + position["character"]


def slice_range(text: str, lsp_range: dict) -> str:
    return text[offset(text, lsp_range["start"]) : offset(text, lsp_range["end"])]


def apply_edit(text: str, edit: dict) -> str:
    """One LSP TextEdit on ASCII text (UTF-16 columns are characters here)."""
    return text[: offset(text, edit["range"]["start"])] + edit["newText"] + text[offset(text, edit["range"]["end"]) :]


def test_next_edit_is_asked_for_the_documents_version_and_applied_with_tab(vscode):
    """After a rename, "codespec: Suggest Next Edit": the request names the document's version and
    the cursor; the server's answer is shown and applied with Tab (or reported as none)."""
    page = vscode.page
    vscode.open_file("shapes.py")
    vscode.go_to("2:12")  # "    return side * side": the first "side" after "return "
    page.keyboard.press("Control+Shift+ArrowRight")
    page.keyboard.type("length", delay=25)
    before = vscode.save("shapes.py")
    assert before.splitlines()[1] == "    return length * side"

    mark = len(vscode.trace.messages())
    vscode.palette("codespec: Suggest Next Edit", "codespec: Suggest Next Edit")
    request = vscode.wait(
        "textDocument/copilotInlineEdit request",
        lambda: vscode.trace.requests("textDocument/copilotInlineEdit", after=mark),
    )[0]
    params = request["params"]
    assert isinstance(params["textDocument"]["version"], int) and params["position"]["line"] == 1
    response = vscode.wait("the next-edit reply", lambda: vscode.trace.response(request), timeout=GHOST_S)
    assert "error" not in response, response
    edits = response["result"]["edits"]
    if not edits:  # the model saw nothing to repeat: the user is told so
        vscode.wait("'no next edit'", lambda: page.locator(".statusbar", has_text="no next edit").count() > 0)
        return
    (edit,) = edits
    assert edit["textDocument"]["version"] == params["textDocument"]["version"]
    vscode.wait("the next edit's status", lambda: page.locator(".statusbar", has_text="Tab applies").count() > 0)
    vscode.shot("next-edit")
    page.keyboard.press("Tab")
    vscode.wait("the applied edit", lambda: page.locator(".statusbar", has_text="Tab applies").count() == 0)
    after = vscode.save("shapes.py")
    assert after == apply_edit(before, {"range": edit["range"], "newText": edit["text"]}), (after, edit)
