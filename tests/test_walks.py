"""The walk of one request through the product, measured on a real request (the shipped model):
an inline completion from the LSP handler, and an OpenAI chat with a ``prediction`` from the HTTP
handler, each to the engine and back to the door's answer (docs/architecture.md, "One inline
completion, end to end").

What a walk counts. Every Python call in a file under ``codespec/`` is recorded, on every thread
(the door's event loop, the preparing lanes, the engine thread, the door's worker threads), from
the handler's first call until the door has answered. The walk is the list of those files in the
order the request first enters them (a file entered again is not a new step: a newcomer reads it
once), each in its room:

- the door's package (``codespec.lsp``, ``codespec.http_api``), ``codespec.service.doors``,
  ``codespec.service.requests``, ``codespec.service.engine``: counted, one step per file;
- ``codespec.core``, ``codespec.proposers`` and ``codespec.index`` are the engine's tools (the
  prompt's rendering, the decoding steps, the model's forward, the drafters): listed apart, not
  counted;
- the transport, which carries every message to its handler and its answer to the client (the
  LSP's framing and JSON-RPC envelope, the ASGI server and its guard: :data:`TRANSPORT`), is not
  part of a request's walk, and neither is what runs before the handler.

The way in is every file first entered before the engine first delivers to the request's job
(``Job.deliver``: a text delta or the result); the way back, every file first entered after.
Neither may return to a room it left: a file first entered in a room the walk was in before, and
left, is a return (the way back starts afresh: it goes back out through the rooms the way in
entered). Each walk is at most :data:`MOST_FILES` files.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = str(ROOT / "codespec") + "/"
MOST_FILES = 12
ROOMS = (  # path prefix (under codespec/) -> room
    ("service/doors/", "service.doors"),
    ("service/requests/", "service.requests"),
    ("service/engine/", "service.engine"),
    ("lsp/", "lsp"),
    ("http_api/", "http_api"),
    ("websocket_api/", "websocket_api"),
)
TOOLS = ("core/", "proposers/", "index/")  # the engine's tools: listed apart, not counted
TRANSPORT = {
    "lsp/framing.py",
    "lsp/held.py",
    "lsp/rpc.py",
    "lsp/sources.py",
    "lsp/tcp.py",
    "http_api/server.py",  # the ASGI app's guard and the uvicorn server
    "http_api/uvicorn_adapter.py",
}
LOGGING = str(Path(logging.__file__).parent) + "/"  # the standard library's logging package
DELIVERED = ("service/engine/jobs.py", "deliver")  # the engine hands the job a delta or its result


def room_of(path: str) -> str:
    """``service/engine/jobs.py`` -> ``service.engine`` (a path under ``codespec/``)."""
    for prefix, room in ROOMS:
        if path.startswith(prefix):
            return room
    return path.split("/")[0]


@dataclass(frozen=True)
class Step:
    path: str  # under codespec/
    room: str
    thread: str


@dataclass
class Walk:
    way_in: list[Step] = field(default_factory=list)
    way_back: list[Step] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)  # files of core, proposers, index, first entries
    threads: list[str] = field(default_factory=list)  # the threads it ran on, in order of their first call

    @property
    def files(self) -> int:
        return len(self.way_in) + len(self.way_back)

    def show(self, title: str) -> str:
        lines = [f"{title}: {self.files} files"]
        for leg, steps in (("in", self.way_in), ("back", self.way_back)):
            lines += [f"  {leg:4} {step.room:17} codespec/{step.path}  [{step.thread}]" for step in steps]
        lines.append(f"  threads: {', '.join(self.threads)}")
        lines.append(f"  the engine's tools (not counted): {len(self.tools)} files: {', '.join(self.tools)}")
        return "\n".join(lines)


def walk_of(events: list[tuple[str, str, str]], handler: tuple[str, str]) -> Walk:
    """The walk of the (thread, path, function) calls recorded in time order, from ``handler``'s
    first call (a (path, function) pair)."""
    start = next(number for number, (_, path, function) in enumerate(events) if (path, function) == handler)
    walk, seen, back = Walk(), set(), False
    for thread, path, function in events[start:]:
        back = back or (path, function) == DELIVERED
        if thread not in walk.threads:
            walk.threads.append(thread)
        if path in seen or path in TRANSPORT:
            continue
        seen.add(path)
        if path.startswith(TOOLS):
            walk.tools.append(path)
        else:
            (walk.way_back if back else walk.way_in).append(Step(path, room_of(path), thread))
    return walk


def returns(steps: list[Step]) -> list[str]:
    """The steps that enter a room the walk was in and left."""
    found, left, room = [], set(), None
    for step in steps:
        if step.room != room:
            if step.room in left:
                found.append(f"codespec/{step.path} goes back to {step.room}")
            if room is not None:
                left.add(room)
            room = step.room
    return found


class Recorder:
    """Every call into a file under ``codespec/`` while ``on``: on this thread and on every thread
    started while the recorder is installed (``threading.setprofile``). Code that Python's logging
    calls (a formatter a door installed for the process, e.g. ``logsafe``'s) is the process's log
    plumbing, run for whatever logs, not a step of the request: not recorded."""

    def __init__(self) -> None:
        self.on = False
        self.events: list[tuple[str, str, str]] = []
        self._order = itertools.count()
        self._stamped: list[tuple[int, str, str, str]] = []
        self._logging = threading.local()  # frames Python's logging called on this thread (a formatter)

    def _profile(self, frame, event, arg) -> None:
        if not self.on:
            return
        if event == "call" and frame.f_back is not None and frame.f_back.f_code.co_filename.startswith(LOGGING):
            self._logging.frames = getattr(self._logging, "frames", set()) | {frame}
        elif event == "return" and frame in getattr(self._logging, "frames", ()):
            self._logging.frames.discard(frame)
            return
        if event == "call" and not getattr(self._logging, "frames", None):
            path = frame.f_code.co_filename
            if path.startswith(PRODUCT):
                name = threading.current_thread().name
                self._stamped.append((next(self._order), name, path[len(PRODUCT) :], frame.f_code.co_name))

    def __enter__(self) -> Recorder:
        threading.setprofile(self._profile)
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]

    def record(self) -> Recorder:
        self._stamped.clear()
        self.on = True
        return self

    def stop(self) -> list[tuple[str, str, str]]:
        self.on = False
        self.events = [(thread, path, function) for _, thread, path, function in sorted(self._stamped)]
        return self.events


def check(walk: Walk, title: str) -> None:
    print("\n" + walk.show(title))
    assert walk.way_in and walk.way_in[0].room in ("lsp", "http_api"), "the walk starts at the door's handler"
    assert any(step.room == "service.engine" for step in walk.way_in), "the request reaches the engine"
    assert not returns(walk.way_in), returns(walk.way_in)
    assert not returns(walk.way_back), returns(walk.way_back)
    assert walk.files <= MOST_FILES, f"{walk.files} files: at most {MOST_FILES}"


# ---- the analysis, on made-up calls ------------------------------------------------------------
def test_a_walk_that_goes_back_to_a_room_it_left_is_found():
    events = [
        ("loop", "lsp/server.py", "inline_completion"),
        ("loop", "service/requests/inline.py", "completion_windows"),
        ("loop", "lsp/workspace.py", "cancel_warm"),  # back in the door: a return
        ("loop", "service/requests/schema.py", "request_of"),  # back in requests: a return
        ("loop", "core/prompts.py", "render"),  # a tool: not counted
        ("engine", "service/engine/service.py", "_start"),
        ("engine", "service/requests/schema.py", "interactive"),  # entered before: not a step
        ("engine", "service/engine/jobs.py", "deliver"),
        ("loop", "service/doors/answers.py", "answer"),
        ("loop", "lsp/completions.py", "complete_at"),
        ("loop", "lsp/rpc.py", "send"),  # transport: not counted
    ]
    walk = walk_of([("test", "tests/x.py", "before"), *events], ("lsp/server.py", "inline_completion"))
    assert [step.path for step in walk.way_in] == [
        "lsp/server.py",
        "service/requests/inline.py",
        "lsp/workspace.py",
        "service/requests/schema.py",
        "service/engine/service.py",
    ]
    assert [step.path for step in walk.way_back] == [
        "service/engine/jobs.py",
        "service/doors/answers.py",
        "lsp/completions.py",
    ]
    assert walk.tools == ["core/prompts.py"] and walk.files == 8
    assert returns(walk.way_in) == [
        "codespec/lsp/workspace.py goes back to lsp",
        "codespec/service/requests/schema.py goes back to service.requests",
    ]
    assert not returns(walk.way_back)
    with pytest.raises(AssertionError, match="goes back to lsp"):
        check(walk, "made up")


# ---- the real walks -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shipped_target():
    import torch

    from codespec.core.default_model import target_path
    from codespec.core.model import TargetModel

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield TargetModel.load(str(target_path()), device="cpu")
    torch.set_num_threads(before)


def test_the_walk_of_an_inline_completion_from_the_lsp_handler(shipped_target):
    from lsprotocol import types

    from codespec.lsp.server import CodespecServer, inline_completion
    from codespec.service.engine.service import EngineService
    from codespec.service.requests.options import CompletionOptions, ServerOptions

    uri = "file:///walk.py"
    text = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return "
    params = types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri),
        position=types.Position(5, 11),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
    )
    with Recorder() as recorder:  # before the service starts, so its threads are recorded too
        server = CodespecServer()
        server.options = ServerOptions(completion=CompletionOptions(deadline_ms=600_000))
        server.service = EngineService(shipped_target, proposer="auto")
        try:
            server.documents.open(uri, text, 1)

            async def twice():
                await inline_completion(server, params)  # the first builds what every later one reuses
                recorder.record()
                items = await inline_completion(server, params)
                recorder.stop()
                return items

            items = asyncio.run(twice())
        finally:
            server.service.close()
    assert items and items[0].insert_text
    check(walk_of(recorder.events, ("lsp/server.py", "inline_completion")), "LSP inline completion")


def test_the_walk_of_a_chat_with_a_prediction_from_the_http_handler(shipped_target):
    sys.path.insert(0, str(ROOT / "tests" / "http_api"))
    try:
        from hosted import Hosted, post
    finally:
        sys.path.remove(str(ROOT / "tests" / "http_api"))
    from codespec.service.engine.service import EngineService

    body = {
        "model": "codespec",
        "messages": [{"role": "user", "content": "Rename x to y\n```\nx = 1\nprint(x)\n```"}],
        "prediction": {"type": "content", "content": "y = 1\nprint(y)\n"},
    }
    with Recorder() as recorder:
        service = EngineService(shipped_target, proposer="auto", max_draft=32)
        hosted = Hosted(service)
        try:
            assert post(hosted, "/v1/chat/completions", body).status_code == 200
            recorder.record()
            response = post(hosted, "/v1/chat/completions", body)
            recorder.stop()
        finally:
            hosted.close()
            service.close()
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] >= 0
    check(walk_of(recorder.events, ("http_api/routes.py", "chat_completions")), "HTTP chat with a prediction")
