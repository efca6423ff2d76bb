"""Benchmark and simulator cases rendered in the target's prompt format (bench/workload.py,
bench/sim_run.py), not always the default model's."""

from __future__ import annotations

import pytest

from bench.sim_run import case_prompt, prompt_renderer
from bench.sim_workload import case_from_record as sim_case
from bench.workload import case_from_record, render_cases
from codespec.core.prompts import PromptRenderer

EDIT = {"id": "e", "instruction": "rename x", "before": "x = 1\nprint(x)\n", "after": "y = 1\nprint(y)\n"}
COMPLETION = {"id": "c", "prefix": "def f(x):\n    ", "suffix": "\n", "target": "return x\n"}
HEADS = {  # (completion prompt start, edit prompt start)
    "qwen2.5-coder": ("<|fim_prefix|>def f", "<|file_sep|>original.py\n"),
    "starcoder2": ("<fim_prefix>def f", "<file_sep>original.py\n"),
    "deepseek-coder": ("<｜begin▁of▁sentence｜><｜fim▁begin｜>def f", "<｜begin▁of▁sentence｜># Original:\n"),
    "qwen2.5-coder-instruct": ("<|fim_prefix|>def f", "<|im_start|>system\n"),
}


@pytest.mark.parametrize("name", list(HEADS))
def test_bench_cases_render_in_the_target_format(family_checkpoints, loaded, name):
    target = loaded(family_checkpoints(name).target)
    renderer = PromptRenderer(target.tokenizer, target.prompt_format)
    fim_head, edit_head = HEADS[name]
    edit = case_from_record(EDIT, "w", "test", renderer=renderer)
    completion = case_from_record(COMPLETION, "w", "test", renderer=renderer)
    assert edit.prompt.startswith(edit_head) and completion.prompt.startswith(fim_head)
    default = [case_from_record(EDIT, "w", "test"), case_from_record(COMPLETION, "w", "test")]
    assert default[0].prompt.startswith("<|file_sep|>original.py\n")  # no renderer: the default model's
    assert [case.prompt for case in render_cases(default, renderer)] == [edit.prompt, completion.prompt]
    # the simulator renders an edit for the replay tokenizer; a completion replays after its prefix
    prompts = prompt_renderer(target.tokenizer)
    assert case_prompt(sim_case(EDIT, "test"), prompts) == renderer.render(edit.request).text
    assert case_prompt(sim_case(COMPLETION, "test"), prompts) == COMPLETION["prefix"]


def test_codespec_bench_renders_the_checkpoint_format(family_checkpoints, loaded, tmp_path):
    """`codespec bench --model DIR` tokenizes each case as the server would prompt that family."""
    import json

    from codespec.commands.cli import main

    family = family_checkpoints("starcoder2")
    workload = tmp_path / "completions.jsonl"
    workload.write_text(json.dumps(COMPLETION) + "\n")
    out = tmp_path / "bench.json"
    argv = ["bench", "--workload", str(workload), "--mode", "replay", "--model", str(family.target)]
    argv += ["--configs", "greedy,context", "--max-new-tokens", "4", "--threads", "1", "--json", str(out)]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    target = loaded(family.target)
    expected = target.encode(
        PromptRenderer(target.tokenizer, target.prompt_format)
        .render(case_from_record(COMPLETION, "w", "t").request)
        .text
    )
    assert data["setup"]["prompt_format"] == target.prompt_format.name == "starcoder2"
    assert data["workloads"]["completions"]["prompt_tokens"] == [len(expected)]
    assert expected[0] == target.tokenizer.convert_tokens_to_ids("<fim_prefix>")
