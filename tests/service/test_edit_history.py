"""The edit history (service.edit_history) and next-edit requests built from it (service.next_edit)."""

from __future__ import annotations

import random
import tracemalloc

from codespec.service.requests.edit_history import EditHistory
from codespec.service.requests.next_edit import choose_window, next_edit_request, suggestion

URI = "file:///w/m.py"


def type_text(history: EditHistory, text: str, at: int, typed: str, now: float = 0.0, uri: str = URI) -> str:
    """Type ``typed`` at ``at`` one keystroke at a time, as didChange reports it."""
    for offset, char in enumerate(typed):
        history.record(uri, text, at + offset, at + offset, char, now=now + offset * 0.05)
        text = text[: at + offset] + char + text[at + offset :]
    return text


def backspace(history: EditHistory, text: str, at: int, count: int, now: float) -> str:
    for step in range(count):
        end = at - step
        history.record(URI, text, end - 1, end, "", now=now + step * 0.05)
        text = text[: end - 1] + text[end:]
    return text


def test_keystrokes_merge_into_one_edit_with_its_lines():
    history = EditHistory()
    text = "x = fetch(url)\ny = 2\n"
    text = type_text(history, text, 9, "_all")
    [edit] = history.recent(URI)
    assert (edit.old, edit.new) == ("", "_all")
    assert (edit.before, edit.after) == ("x = fetch(url)", "x = fetch_all(url)")


def test_retyping_a_word_is_one_replacement_and_typing_it_back_removes_it():
    history = EditHistory()
    text = "data = read_file(p)\n"
    text = backspace(history, text, 16, 4, now=0.0)  # "read_" left
    text = type_text(history, text, 12, "text", now=0.3)
    [edit] = history.recent(URI)
    assert (edit.old, edit.new) == ("file", "text") and text == "data = read_text(p)\n"
    text = backspace(history, text, 16, 4, now=0.6)
    text = type_text(history, text, 12, "file", now=0.9)
    assert history.recent(URI) == [] and text == "data = read_file(p)\n"


def test_an_undo_removes_the_edit_it_undoes_even_after_a_pause():
    history = EditHistory()
    text = "a = 1\n"
    history.record(URI, text, 4, 5, "2", now=0.0)
    history.record(URI, "a = 2\n", 4, 5, "1", now=60.0)  # the editor's undo, a minute later
    assert history.recent(URI) == []


def test_edits_far_apart_or_after_a_pause_stay_separate_and_are_ordered_across_documents():
    history = EditHistory(merge_s=1.0)
    text = "one\ntwo\nthree\n"
    history.record(URI, text, 0, 3, "ONE", now=0.0)
    history.record(URI, "ONE\ntwo\nthree\n", 8, 13, "THREE", now=0.1)  # another place
    history.record("file:///other.py", "z\n", 0, 1, "Z", now=0.2)
    history.record(URI, "ONE\ntwo\nTHREE\n", 4, 7, "TWO", now=5.0)
    assert [edit.new for edit in history.recent(URI)] == ["ONE", "THREE", "TWO"]
    assert [edit.new for edit in history.recent()] == ["ONE", "THREE", "Z", "TWO"]


def test_memory_stays_bounded_whatever_arrives():
    history = EditHistory(max_edits=32, max_documents=16, max_chars=2048)
    rng = random.Random(3)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    text = "x" * 1000 + "\n"
    for step in range(10_000):
        uri = f"file:///doc{step % 50}.py"
        if step % 997 == 0:  # a huge paste, and binary junk
            new = "".join(chr(rng.randrange(0, 0x2FF)) for _ in range(200_000))
        else:
            new = rng.choice("abc\n\x00")
        at = rng.randrange(0, len(text))
        history.record(uri, text, at, at, new, now=step * 10.0)
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert len(history) <= 32 * 16
    assert used < 8 << 20, used
    huge = [edit for edit in history.recent(limit=10_000) if edit.truncated]
    assert all(len(edit.new) <= 2048 for edit in huge)


def test_the_window_moves_to_the_next_site_the_edit_applies_to():
    lines = ["def load(path):", "    data = read_text(path)", "    return data", *[""] * 20]
    lines += ["def save(path, data):", "    old = read_file(path)", "    return old"]
    text = "\n".join(lines) + "\n"
    cursor = text.index("read_text") + len("read_text")
    edits = [("    data = read_file(path)\n", "    data = read_text(path)\n")]
    start, end, moved = choose_window(text, cursor, edits)
    assert moved and "old = read_file(path)" in text[start:end]
    # nothing to repeat: the window stays at the cursor
    start, end, moved = choose_window(text, cursor, [("a\n", "b\n")])
    assert not moved and start == 0


def test_a_request_carries_the_window_as_reference_and_the_edits_and_its_answer_becomes_one_edit():
    history = EditHistory()
    text = "def f():\n    x = fetch(url)\n    y = fetch(other)\n"
    text = type_text(history, text, text.index("fetch") + 5, "_all")
    for prompt_format in ("rewrite", "zeta"):
        request, plan = next_edit_request(
            text,
            text.index("_all") + 4,
            history.recent(URI),
            uri=URI,
            version=7,
            prompt_format=prompt_format,
            budget=32,
        )
        assert request.edits == (("    x = fetch(url)", "    x = fetch_all(url)"),)
        assert plan.window in text and plan.version == 7
        assert "fetch_all" in (request.prompt if prompt_format == "zeta" else request.prompt.instruction)
        answer = plan.window.replace("fetch(other)", "fetch_all(other)")
        if prompt_format == "zeta":  # the model answers with the excerpt, markers included
            answer = f"```m.py\n<|editable_region_start|>\n{answer.removesuffix(chr(10))}\n<|editable_region_end|>\n```"
        found = suggestion(plan, answer)
        assert found is not None and found.text == "_all"
        assert text[: found.start] + found.text + text[found.end :] == text.replace("fetch(other)", "fetch_all(other)")
        assert (
            suggestion(
                plan, plan.window if prompt_format == "rewrite" else answer.replace("fetch_all(other)", "fetch(other)")
            )
            is None
        )
        # an answer cut short (its budget, a deadline) is no suggestion: it would delete the rest
        cut = answer[: len(answer) // 2]
        assert suggestion(plan, cut, "length") is None and suggestion(plan, cut, "deadline") is None


def test_a_huge_line_gets_no_window_and_a_long_window_shrinks_to_the_cursors_line():
    minified = "x=" + "a;" * 1_000_000 + "\n"
    assert choose_window(minified, 10, []) == (0, 0, False)
    text = "".join(f"line{i} = " + "v" * 900 + "\n" for i in range(20))
    cursor = text.index("line10")
    start, end, _ = choose_window(text, cursor, [])
    assert text[start:end].startswith("line10") and text[start:end].count("\n") == 1
