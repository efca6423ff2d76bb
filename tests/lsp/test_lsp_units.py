"""Plain functions of lsp/: positions, options, prompt windows, typed-along reuse, documents, auth."""

from __future__ import annotations

import asyncio
import os
import stat

import pytest
from hypothesis import given
from hypothesis import strategies as st

from codespec.lsp.documents import Debouncer, Document
from codespec.service.doors.auth import presented_token, refusal, resolve_token
from codespec.service.requests.inline import Suggestion, completion_context, trim_completion, typed_along, window_start
from codespec.service.requests.options import ServerOptions, parse_options
from codespec.service.requests.positions import (
    LineIndex,
    Position,
    PositionError,
    changed_span,
    position_at,
    range_offsets,
)


# ---- positions -------------------------------------------------------------------------------
def test_utf16_positions_around_an_emoji_and_line_breaks():
    text = "a😀b\r\nxy\rz\n"
    index = LineIndex(text)
    assert index.line_count == 4
    assert index.offset(0, 0) == 0
    assert index.offset(0, 3) == 2  # the emoji is two UTF-16 units, one code point
    assert index.offset(0, 4) == 3  # end of line 0 (before \r\n)
    assert index.offset(1, 2) == 7 and index.offset(2, 1) == 9 and index.offset(3, 0) == 10
    assert index.position(2) == position_at(text, 2)
    assert (index.position(2).line, index.position(2).character) == (0, 3)
    with pytest.raises(PositionError, match="surrogate pair"):
        index.offset(0, 2)
    with pytest.raises(PositionError, match="out of range"):
        index.offset(0, 5)
    assert index.offset(0, 99, clamp=True) == 3  # LSP: past the end of a line means its end
    with pytest.raises(PositionError, match="line 4"):
        index.offset(4, 0, clamp=True)
    with pytest.raises(PositionError):
        index.offset(-1, 0)
    with pytest.raises(PositionError):
        index.offset("1", 0)


def test_position_errors_number_lines_and_characters_as_the_protocol_does():
    index = LineIndex("ab\ncd\n")
    with pytest.raises(PositionError) as error:
        index.offset(3, 0)
    assert str(error.value) == "line 3 is out of range: the document's last line is 2 (lines count from 0)"
    with pytest.raises(PositionError) as error:
        index.offset(1, 3)
    assert str(error.value) == (
        "character 3 is out of range: line 1 ends at character 2 (2 UTF-16 code units; characters count from 0)"
    )
    one_based = LineIndex("ab\ncd\n", "utf-32", first=1)
    assert one_based.offset(2, 3) == 5 and one_based.position(5) == Position(2, 3)
    with pytest.raises(PositionError, match="they count from 1"):
        one_based.offset(0, 1)


def test_other_encodings():
    text = "é😀x"
    assert LineIndex(text, "utf-8").offset(0, 2) == 1
    assert LineIndex(text, "utf-8").offset(0, 6) == 2
    assert LineIndex(text, "utf-32").offset(0, 2) == 2
    with pytest.raises(PositionError):
        LineIndex(text, "utf-8").offset(0, 1)


@given(st.text(alphabet=st.sampled_from(["a", "\n", "\r", "😀", "é", " "]), max_size=30))
def test_position_round_trip(text):
    index = LineIndex(text)
    for offset in range(len(text) + 1):
        if 0 < offset < len(text) and text[offset - 1] == "\r" and text[offset] == "\n":
            continue  # between \r and \n is not a position of its own
        position = index.position(offset)
        assert index.offset(position.line, position.character) == offset


def test_range_offsets_and_changed_span():
    assert range_offsets("ab\ncd", (0, 1), (1, 1)) == (1, 4)
    with pytest.raises(PositionError):
        range_offsets("ab\ncd", (1, 1), (0, 1))
    assert changed_span("hello world", "hello brave world") == (6, 6, "brave ")
    assert changed_span("aaa", "aa") == (2, 3, "")


# ---- options ---------------------------------------------------------------------------------
def test_options_fall_back_with_messages():
    options, messages = parse_options(
        {"model": "/m", "limits": {"lineTokens": 7, "maxDraft": -1}, "index": {"enabled": "yes"}, "colour": "blue"}
    )
    assert options.engine.model == "/m" and options.completion.line_tokens == 7
    assert options.engine.max_draft == ServerOptions().engine.max_draft and options.index.enabled is True
    assert len(messages) == 3
    assert any("limits.maxDraft" in m for m in messages) and any("index.enabled" in m for m in messages)
    assert any("unknown option colour" in m for m in messages)
    assert parse_options(None)[0] == ServerOptions()
    assert parse_options([1])[1]


# ---- completion context ----------------------------------------------------------------------
def test_single_and_multi_line():
    text = "def f(x):\n    return x\n\n"
    middle = completion_context(text, text.index("x\n\n"), 5, 9, 1000, 100)
    assert not middle.multiline and middle.stop[0] == "\n" and middle.max_tokens == 5
    blank = completion_context(text, len(text) - 1, 5, 9, 1000, 100)
    assert blank.multiline and blank.max_tokens == 9
    assert blank.prefix == text[:-1] and blank.suffix == "\n"
    # at the start of a line that holds code: whole lines, ending with a newline
    before_code = completion_context(text, text.index("    return"), 5, 9, 1000, 100)
    assert before_code.multiline and before_code.before_code
    assert trim_completion("    x = 1\n\n", before_code) == "    x = 1\n"
    assert trim_completion("  \n", before_code) == ""
    assert completion_context(text, text.index("    return"), 5, 9, 1000, 100, mode="line").stop[0] == "\n"
    # after the indentation of such a line: the code after the block keeps its indentation
    indented = completion_context(text, text.index("return"), 5, 9, 1000, 100)
    assert indented.before_code and trim_completion("y = 2\n    z = 3\n\n", indented) == "y = 2\n    z = 3\n    "


def test_prompt_window_start_stays_put_while_typing():
    text = "".join(f"line {i:04d} of the file\n" for i in range(400))
    starts = {window_start(cursor, text, 2000, chunk=512) for cursor in range(5000, 5400)}
    assert len(starts) <= 2  # moves only when the cursor crosses a chunk boundary
    for cursor in (5000, 5399):
        start = window_start(cursor, text, 2000, chunk=512)
        assert start == 0 or text[start - 1] == "\n"
        assert cursor - start <= 2000
    assert window_start(100, text, 2000) == 0


def test_typed_along_reuses_the_rest_of_a_suggestion():
    shown = Suggestion("x = ", "compute(a, b)")
    assert typed_along(shown, "x = comp", len("x = comp")) == "ute(a, b)"
    assert typed_along(shown, "x = cox", len("x = cox")) is None  # diverged
    assert typed_along(shown, "y = comp", len("y = comp")) is None  # text before changed
    assert typed_along(shown, "x = compute(a, b)", len("x = compute(a, b)")) is None  # all typed
    assert typed_along(None, "x", 1) is None


# ---- documents and debounce --------------------------------------------------------------------
def test_document_changes_and_pending_index_change():
    document = Document("file:///a.py", "a😀b\ncd\n", 1)
    document.indexed_text = document.text
    document.apply_change((0, 3), (0, 4), "BB", 2)  # replace "b" after the emoji
    document.apply_change((1, 0), (1, 0), "x", 3)
    assert document.text == "a😀BB\nxcd\n" and document.version == 3
    start, end, new_text = document.pending_index_change()
    assert "a😀b\ncd\n"[:start] + new_text + "a😀b\ncd\n"[end:] == document.text
    document.apply_change(None, None, "new", 4)
    assert document.text == "new"


async def test_debouncer_fires_once_per_burst_and_flushes():
    fired: list[str] = []
    done = asyncio.Event()

    def callback(key: str) -> None:
        fired.append(key)
        done.set()

    debouncer = Debouncer(0.01, callback)
    for _ in range(5):
        debouncer.touch("a")
    await asyncio.wait_for(done.wait(), 10)
    assert fired == ["a"] and not debouncer.pending
    debouncer.touch("b")
    debouncer.flush("b")
    assert fired == ["a", "b"]
    debouncer.flush("b")  # nothing pending: no second call
    assert fired == ["a", "b"]


# ---- auth ------------------------------------------------------------------------------------
def test_token_sources(tmp_path):
    assert resolve_token("cli", environ={"CODESPEC_TOKEN": "env"}).token == "cli"
    assert resolve_token(None, environ={"CODESPEC_TOKEN": "env"}).token == "env"
    path = tmp_path / "sub" / "token"
    generated = resolve_token(None, path, environ={})
    assert generated.file == path and generated.generated and len(generated.token) >= 32
    assert not path.exists()  # written only once the server listens
    generated.keep()
    assert path.read_text().strip() == generated.token
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    # every later serve reuses it; a new one only on request
    reused = resolve_token(None, path, environ={})
    assert (reused.token, reused.generated, reused.describe()) == (generated.token, False, f"read from {path}")
    reused.keep()
    assert path.read_text().strip() == generated.token
    renewed = resolve_token(None, path, environ={}, new=True)
    assert renewed.token != generated.token and path.read_text().strip() == generated.token
    renewed.keep()
    assert path.read_text().strip() == renewed.token


def test_a_token_file_others_could_read_is_not_reused(tmp_path):
    path = tmp_path / "token"
    path.write_text("a-token-others-may-have-read-0123456789\n")
    path.chmod(0o644)
    source = resolve_token(None, path, environ={})
    assert source.generated and source.token != "a-token-others-may-have-read-0123456789"
    source.keep()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and path.read_text().strip() == source.token


def test_refusal_rules():
    def headers(**values):
        return {key.replace("_", "-"): value for key, value in values.items()}

    assert presented_token("/?token=abc", None) == "abc"
    assert presented_token("/", "Bearer  xyz ") == "xyz"
    assert refusal("/", headers(Authorization="Bearer t"), "t", ()) is None
    assert refusal("/", headers(), "t", ())[0] == 401
    assert refusal("/?token=t", headers(Origin="http://localhost:3000"), "t", ())[0] == 403
    assert refusal("/?token=t", headers(Origin="http://ok"), "t", ("http://ok",)) is None


async def test_client_errors_blame_the_client_only_for_client_mistakes():
    from pygls.exceptions import JsonRpcInvalidParams

    from codespec.lsp.documents import DocumentStore
    from codespec.lsp.server import client_errors

    @client_errors
    async def unopened():
        return DocumentStore().get("file:///nowhere.py")

    @client_errors
    async def server_bug():
        return {}["missing"]  # a KeyError of our own making is an internal error, not InvalidParams

    with pytest.raises(JsonRpcInvalidParams, match="not open"):
        await unopened()
    with pytest.raises(KeyError):
        await server_bug()


def test_a_documents_background_prefill_waits_until_the_user_stays_on_it(monkeypatch):
    """didOpen schedules the prefill WARM_DELAY_S later; a completion (or closing the file) first
    cancels it, so flipping through files or asking at once costs no prefill."""
    from codespec.lsp import server as server_module
    from codespec.lsp import workspace

    async def scenario():
        ls = server_module.CodespecServer()
        warmed = asyncio.Event()
        calls: list[str] = []

        def spy(ls_, document):
            calls.append(document.uri)
            warmed.set()

        monkeypatch.setattr(workspace, "warm_document", spy)
        flipped = ls.documents.open("file:///flipped.py", "x = 1\n", 1)
        workspace.schedule_warm(ls, flipped)
        ls.documents.close(flipped.uri)
        workspace.cancel_warm(ls, flipped.uri)  # what didClose does
        asked = ls.documents.open("file:///asked.py", "y = 2\n", 1)
        workspace.schedule_warm(ls, asked)
        workspace.cancel_warm(ls, asked.uri)  # what a completion request does
        stayed = ls.documents.open("file:///stayed.py", "z = 3\n", 1)
        workspace.schedule_warm(ls, stayed)
        assert calls == []  # nothing before the delay
        await asyncio.wait_for(warmed.wait(), 30)
        return calls, ls.warm_timers

    calls, timers = asyncio.run(scenario())
    assert calls == ["file:///stayed.py"] and timers == {}


def test_prompt_windows_default_by_device_and_user_sizes_win():
    from codespec.service.requests.inline import CPU_WINDOWS, GPU_WINDOWS, resolve_windows

    assert ServerOptions().completion.prefix_chars is None and ServerOptions().completion.suffix_chars is None
    assert resolve_windows(None, None, "cpu", 32768, 160) == CPU_WINDOWS  # a model of unknown size
    assert resolve_windows(None, None, "cpu", 32768, 160, parameters=494_032_768) == (800, 64)  # 0.5B
    assert resolve_windows(None, None, "cpu", 32768, 160, parameters=5_000_000) == (800, 200)  # a toy
    middle = resolve_windows(None, None, "cpu", 32768, 160, parameters=300_000_000)[1]
    assert 64 < middle < 200  # the suffix (re-prefilled every keystroke) shrinks as the model grows
    assert resolve_windows(None, None, "cuda", 32768, 160, parameters=494_032_768) == GPU_WINDOWS
    assert resolve_windows(None, None, "cuda", 32768, 160) == GPU_WINDOWS
    assert resolve_windows(2000, 0, "cpu", 32768, 160) == (2000, 0)  # an explicit 0 suffix stays 0
    prefix, suffix = resolve_windows(None, None, "cuda", 1024, 160)  # fitted to a small context
    assert prefix + suffix < sum(GPU_WINDOWS)
    assert parse_options({"limits": {"prefixChars": 2500}})[0].completion.prefix_chars == 2500


def test_options_come_in_groups_and_replace_by_group_and_field():
    from codespec.service.requests.options import GROUPS

    options = ServerOptions().replace(engine_model="/m", index_max_tokens=5, completion_completion_fallback=False)
    assert options.engine.model == "/m" and options.index.max_tokens == 5
    assert options.completion.completion_fallback is False
    assert options.engine.device == ServerOptions().engine.device  # the rest untouched
    with pytest.raises(TypeError, match="unknown option 'engine_colour'"):
        options.replace(engine_colour="blue")
    with pytest.raises(TypeError, match="unknown option 'model'"):
        options.replace(model="/m")
    assert [group for group in GROUPS if hasattr(options, group)] == list(GROUPS)
