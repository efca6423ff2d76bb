"""`codespec complete FILE:LINE:COL`: the end-to-end demo command, on the tiny model."""

from __future__ import annotations

import json

import pytest

from codespec.commands.cli import main
from codespec.commands.complete import cursor_offset, parse_location
from codespec.core.errors import CodespecError

SOURCE = "def square(x):\n    return x * x\n\n\ndef cube(x):\n    return x * x * x\n\n\ndef quad(x):\n    \n"


def test_location_parsing():
    assert parse_location("a/b.py:3:7")[1:] == (3, 7)
    for bad in ("b.py:3", "b.py:0:1", "b.py:x:1"):
        with pytest.raises(CodespecError):
            parse_location(bad)
    assert cursor_offset("ab\ncd\n", 2, 2) == 4
    with pytest.raises(CodespecError, match="past the end"):
        cursor_offset("ab\n", 1, 5)


def test_a_position_error_counts_as_the_user_does():
    nineteen = "".join(f"line_{number} = {number}\n" for number in range(1, 20))
    with pytest.raises(CodespecError) as error:
        cursor_offset(nineteen, 99, 1)
    assert str(error.value) == (
        "99:1 is past the end of the file or of its line: line 99 is out of range: "
        "the document's last line is 20 (lines count from 1)"
    )
    assert cursor_offset(nineteen, 20, 1) == len(nineteen)  # the empty line after the last newline
    with pytest.raises(CodespecError, match=r"column 12 is out of range: line 1 ends at column 11 \(10 characters; "):
        cursor_offset(nineteen, 1, 12)
    with pytest.raises(CodespecError, match="line 1 ends at column 2 [(]1 character;"):
        cursor_offset("a\n", 1, 3)


def test_cursor_offset_reads_line_breaks_as_the_server_does():
    assert cursor_offset("ab\r\ncd", 2, 2) == 5
    assert cursor_offset("ab\rcd", 2, 1) == 3  # a lone "\r" ends a line too
    assert cursor_offset("a\U0001f600b\n", 1, 3) == 2  # columns count code points
    with pytest.raises(CodespecError, match="past the end"):
        cursor_offset("ab\r\ncd", 1, 4)  # would land between "\r" and "\n"
    with pytest.raises(CodespecError, match="past the end"):
        cursor_offset("ab\ncd", 3, 1)


def test_complete_reports_identical_output_and_speedup(tmp_path, capsys, server_model_dir):
    source = tmp_path / "shapes.py"
    source.write_text(SOURCE)
    code = main(
        [
            "complete",
            f"{source}:10:5",
            "--model",
            str(server_model_dir),
            "--device",
            "cpu",
            "--workspace",
            str(tmp_path),
            "--max-tokens",
            "12",
            "--repeats",
            "1",
            "--json",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["identical_output"] is True  # greedy speculative decoding is lossless
    assert report["speculative_tokens"] == report["plain_tokens"] > 0
    assert report["plain_tokens_per_forward"] == 1.0
    assert report["multiline"] is True and report["index_s"] is not None
    assert report["speedup_wall"] > 0
