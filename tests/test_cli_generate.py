"""`codespec generate`: the contract other checks rely on."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from codespec.commands.cli import main

pytestmark = pytest.mark.slow  # subprocess CLIs: `python -m pytest --full` runs it

STATS_KEYS = {
    "tokens",
    "target_forwards",
    "tokens_per_forward",
    "mean_accepted_length",
    "coverage",
    "acceptance_by_depth",
    "proposal_ms_p50",
    "verify_ms_p50",
    "ttft_ms",
    "tokens_per_s",
}
PROMPT = "def area(width, height):\n    return width * height\n\n\ndef area(width, height):\n"


def codespec(*args, env_extra=None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "codespec.commands.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_json_output_and_baseline(tiny_model_dir):
    runs = {}
    for proposer in ("none", "context"):
        result = codespec(
            "generate",
            "--model",
            str(tiny_model_dir),
            "--prompt",
            PROMPT,
            "--max-new-tokens",
            "24",
            "--proposer",
            proposer,
            "--draft-len",
            "4",
            "--json",
        )
        assert result.returncode == 0, result.stderr
        runs[proposer] = json.loads(result.stdout)
    for run in runs.values():
        assert {"text", "token_ids", "stats"} <= set(run)
        assert STATS_KEYS <= set(run["stats"])
        assert run["stats"]["tokens"] == len(run["token_ids"]) == 24
    assert runs["none"]["stats"]["tokens_per_forward"] == 1.0
    assert runs["context"]["token_ids"] == runs["none"]["token_ids"]


def test_streams_text_and_reports_stats(tiny_model_dir):
    result = codespec("generate", "--model", str(tiny_model_dir), "--prompt", PROMPT, "--max-new-tokens", "8")
    assert result.returncode == 0, result.stderr
    assert "tokens/forward" in result.stderr


def test_prompt_file_and_sampling(tiny_model_dir, tmp_path):
    prompt_file = tmp_path / "prompt.py"
    prompt_file.write_text(PROMPT, encoding="utf-8")
    args = (
        "generate",
        "--model",
        str(tiny_model_dir),
        "--prompt-file",
        str(prompt_file),
        "--max-new-tokens",
        "10",
        "--temperature",
        "0.8",
        "--top-p",
        "0.9",
        "--top-k",
        "50",
        "--seed",
        "3",
        "--json",
    )
    first, second = codespec(*args), codespec(*args)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["token_ids"] == json.loads(second.stdout)["token_ids"]


def test_bad_values_and_missing_model_exit_with_a_message(tiny_model_dir):
    bad = codespec("generate", "--model", str(tiny_model_dir), "--prompt", "x", "--temperature", "-2")
    assert bad.returncode == 2 and "temperature" in bad.stderr
    missing = codespec("generate", "--model", "/nonexistent/model", "--prompt", "x")
    assert missing.returncode == 2 and "not found" in missing.stderr
    unknown = codespec("generate", "--model", str(tiny_model_dir), "--prompt", "x", "--proposer", "nope")
    assert unknown.returncode == 2 and "unknown proposer" in unknown.stderr


def test_reference_file_drives_the_copy_pointer(tiny_model_dir, tmp_path):
    baseline = codespec(
        "generate",
        "--model",
        str(tiny_model_dir),
        "--prompt",
        PROMPT,
        "--max-new-tokens",
        "20",
        "--proposer",
        "none",
        "--json",
    )
    expected = json.loads(baseline.stdout)["text"]
    reference = tmp_path / "reference.txt"
    reference.write_text(expected, encoding="utf-8")  # a perfect prediction of the output
    result = codespec(
        "generate",
        "--model",
        str(tiny_model_dir),
        "--prompt",
        PROMPT,
        "--max-new-tokens",
        "20",
        "--proposer",
        "reference",
        "--reference-file",
        str(reference),
        "--json",
    )
    assert result.returncode == 0, result.stderr
    run = json.loads(result.stdout)
    assert run["token_ids"] == json.loads(baseline.stdout)["token_ids"]
    assert run["stats"]["tokens_per_forward"] > 1.0


def test_index_and_auto_draft_from_a_workspace_and_keep_greedy_output(tmp_path, capsys):
    """On the shipped model (a random one emits bytes no file holds): the workspace file holds the
    function the model writes, so the index drafts it; auto adds an edited copy as reference."""
    # Ends inside the body's indentation: a prompt ending in a bare newline splits the "\n    " token
    # the model always saw, and the shipped model may answer EOS there.
    prompt = 'import os\n\n\ndef read_lines(path):\n    """Return the lines of a file."""\n    '
    argv = ["generate", "--prompt", prompt, "--max-new-tokens", "32", "--json"]
    assert main([*argv, "--proposer", "none"]) == 0
    baseline = json.loads(capsys.readouterr().out)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "ranges.py").write_text(f"{prompt}{baseline['text']}\n", encoding="utf-8")
    reference = tmp_path / "reference.txt"
    reference.write_text(baseline["text"][:12] + "  # edited" + baseline["text"][12:], encoding="utf-8")
    for extra in (
        ["--proposer", "index", "--workspace", str(workspace)],
        ["--proposer", "auto", "--workspace", str(workspace), "--reference-file", str(reference)],
    ):
        assert main([*argv, *extra]) == 0
        captured = capsys.readouterr()
        run = json.loads(captured.out)
        assert run["token_ids"] == baseline["token_ids"], extra
        assert run["stats"]["tokens_per_forward"] > 3.0, (extra, run["stats"])
        assert "[index] 1 files" in captured.err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--proposer", "index"], "pass --workspace"),
        (["--proposer", "reference"], "pass --reference-file"),
        (["--workspace", "/nonexistent/workspace"], "not a directory"),
        (["--dtype", "bogus"], "unknown dtype"),
        (["--device", "nodevice"], "unknown device"),
        (["--prompt-file", "/nonexistent/prompt.txt"], "--prompt-file"),
        (["--prompt", "x", "--reference-file", "/nonexistent/reference.txt"], "--reference-file"),
    ],
)
def test_bad_options_are_an_error_message_not_a_traceback(tiny_model_dir, capsys, extra, message):
    argv = ["generate", "--model", str(tiny_model_dir), *extra]
    if "--prompt-file" not in extra and "--prompt" not in extra:
        argv += ["--prompt", "x"]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
