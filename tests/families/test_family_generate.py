"""`codespec generate --model DIR` on each family's checkpoint, with every proposer: greedy output
token-identical to plain decoding (`--proposer none`), and the drafters really drafting."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from engine_harness import TIE_GAP, logit_gap
from family_layouts import ALL_FAMILIES, corpus

from codespec.commands.cli import main

pytestmark = pytest.mark.slow  # subprocess CLIs per family: `python -m pytest --full` runs it

MAX_NEW = 32
DRAFTERS = ("context", "reference", "index", "draft", "early-exit", "auto")


def generate(args: list[str]) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["generate", "--device", "cpu", "--json", "--max-new-tokens", str(MAX_NEW), *args]) == 0
    return json.loads(out.getvalue().strip().splitlines()[-1])


@pytest.fixture(scope="module")
def run_family(family_checkpoints, loaded, tmp_path_factory):
    """name -> (family, runner, plain result); the runner is `codespec generate` in this process
    with ``TargetModel.load`` answered from the session's loaded models (each directory is loaded
    once, the first time, by the real ``TargetModel.load``)."""
    from codespec.core.model import TargetModel

    made = {}

    def get(name: str):
        if name in made:
            return made[name]
        family = family_checkpoints(name)
        work = tmp_path_factory.mktemp(f"generate-{name}")
        prompt_file = work / "prompt.py"
        prompt_file.write_text(corpus()[3][1500:2100], encoding="utf-8")

        def run(proposer: str, *extra: str) -> dict:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(TargetModel, "load", classmethod(lambda cls, path, **kw: loaded(path)))
                return generate(
                    ["--model", str(family.target), "--prompt-file", str(prompt_file), "--proposer", proposer, *extra]
                )

        plain = run("none")
        # A reference and a workspace file that repeat the output with a change in the middle: the
        # copy pointer and the index draft long runs, accepted up to the change, rejected there.
        text = plain["text"]
        half = len(text) // 2
        (work / "reference.txt").write_text(text[:half] + " changed " + text[half:], encoding="utf-8")
        workspace = work / "workspace"
        workspace.mkdir()
        (workspace / "copy.py").write_text(
            prompt_file.read_text() + text[:half] + "\n# changed\n" + text[half:], encoding="utf-8"
        )
        options = {
            "reference": ["--reference-file", str(work / "reference.txt")],
            "index": ["--workspace", str(workspace)],
            "draft": ["--draft-model", str(family.draft), "--draft-min-confidence", "0"],
            "early-exit": ["--draft-min-confidence", "0"],
            "auto": [
                "--draft-model",
                str(family.draft),
                "--reference-file",
                str(work / "reference.txt"),
                "--workspace",
                str(workspace),
            ],
        }
        made[name] = (family, run, plain, options, prompt_file)
        return made[name]

    return get


@pytest.mark.parametrize("name", ALL_FAMILIES)
def test_plain_decoding_through_the_cli(run_family, loaded, name):
    family, _, plain, _, prompt_file = run_family(name)
    target = loaded(family.target)
    assert len(plain["token_ids"]) == MAX_NEW and plain["stats"]["tokens_per_forward"] == 1.0
    assert target.prompt_format.name == family.prompt_format
    if family.prompt_format == "qwen2.5-coder":  # ids past 16 bits, in the prompt and in the output
        assert max(target.encode(prompt_file.read_text())) > 65_535 and max(plain["token_ids"]) > 65_535


@pytest.mark.parametrize("proposer", DRAFTERS)
@pytest.mark.parametrize("name", ALL_FAMILIES)
def test_every_proposer_is_token_identical_to_plain_decoding(run_family, loaded, name, proposer):
    family, run, plain, options, prompt_file = run_family(name)
    got = run(proposer, "--draft-len", "6", *options.get(proposer, []))
    reference = plain["token_ids"]
    if got["token_ids"] != reference:
        position = next(i for i, (a, b) in enumerate(zip(got["token_ids"], reference)) if a != b)
        target = loaded(family.target)
        prefix = [*target.encode(prompt_file.read_text()), *reference[:position]]
        gap = logit_gap(target, prefix, got["token_ids"][position], reference[position])
        assert gap < TIE_GAP, f"{proposer} differs from plain decoding at {position} (logit gap {gap:.3g})"
    stats = got["stats"]
    if proposer not in ("context", "auto"):  # each of these drafts here, and some of it is accepted
        assert stats["tokens_per_forward"] > 1.0, stats
