"""The user's edit repeated at the next site: the rules (proposers.edit_rules), the next-edit
proposer's drafting on real commits, and greedy identity with it on the shipped model."""

from __future__ import annotations

from pathlib import Path

import pytest

from codespec.proposers.edit_rules import Rule, apply_rules, predict, rules_from_edit
from codespec.proposers.next_edit import NextEditLookup

# Five httpx commits (twelve files) of the development workload, kept in the repository so a clone
# runs these tests alone (tests/data/README.md); the whole workload, where it is beside the clone,
# is checked as well.
SAMPLE = Path(__file__).resolve().parents[1] / "data" / "edits-httpx-sample.jsonl"
WORKLOADS = Path(__file__).resolve().parents[3] / "shared" / "workloads"
EDIT_FILES = {
    "sample": (SAMPLE, 20, 20),  # the file, and the least same-file and cross-file cases it yields
    "workload": (WORKLOADS / "edits-httpx.jsonl", 60, 30),
}


def edit_file(name: str) -> tuple[Path, int, int]:
    path, cases, cross_file = EDIT_FILES[name]
    if not path.is_file():
        pytest.skip(f"{path} absent (the development workloads are not part of the repository)")
    return path, cases, cross_file


def test_a_rename_renames_every_use_but_not_other_objects_attributes():
    rules = rules_from_edit("    x = fetch(url)\n", "    x = fetch_all(url)\n")
    assert rules == [Rule("rename", ("fetch",), ("fetch_all",))]
    assert predict("a = fetch(u)\nb = obj.fetch(v)\nfetcher = 1\n", [("x = fetch(url)\n", "x = fetch_all(url)\n")]) == (
        "a = fetch_all(u)\nb = obj.fetch(v)\nfetcher = 1\n"
    )


def test_an_attribute_rename_keeps_its_qualifier():
    edit = ("self._pool.open()\n", "self._transport.open()\n")
    assert predict("self._pool.close()\nother._pool = 1\n", [edit]) == "self._transport.close()\nother._pool = 1\n"
    # the qualifier renamed in the same edit: the longer rule goes first
    edit = ("class T(httpcore.SyncHTTPTransport):\n", "class T(httpx.BaseTransport):\n")
    assert predict("# see httpcore.SyncHTTPTransport\n", [edit]) == "# see httpx.BaseTransport\n"


def test_a_keyword_rename_leaves_the_value_alone():
    edit = ('    r = Request("POST", url, data=data)\n', '    r = Request("POST", url, content=data)\n')
    assert predict("    Request(url, data=data, headers=h)\n", [edit]) == "    Request(url, content=data, headers=h)\n"


def test_an_argument_added_at_one_call_is_added_at_the_others_once():
    edit = ("    send(a, b)\n", "    send(a, b, timeout=t)\n")
    assert rules_from_edit(*edit) == [Rule("call-end", ("send",), (",", " ", "timeout", "=", "t"))]
    text = "send(x, y)\nsend(z, f(q))\nsend(k, timeout=t)\nresend(x)\n"
    assert predict(text, [edit]) == "send(x, y, timeout=t)\nsend(z, f(q), timeout=t)\nsend(k, timeout=t)\nresend(x)\n"


def test_other_changes_apply_where_their_context_repeats_and_numbers_are_no_names():
    rules = rules_from_edit("x = 1 + 2\n", "x = 1 + 3\n")
    assert [rule.kind for rule in rules] == ["context"]
    assert apply_rules("y = 1 + 2\nz = 2\n", rules) == "y = 1 + 3\nz = 2\n"


def test_an_empty_calls_new_arguments_go_only_into_empty_calls():
    assert predict("f(1)\nf()\n", [("f()\n", "f(x)\n")]) == "f(1)\nf(x)\n"


def test_no_rule_without_context_that_is_code_and_no_runaway_growth():
    assert rules_from_edit(")", "x)") == []  # every ")" would change
    # rules from several edits feeding on each other's replacements: the prediction is abandoned
    growing = [("(", "((")] * 3
    text = "f(" * 50
    assert len(predict(text, growing)) <= 2 * len(text) + 1024


def test_no_rules_from_a_no_op_or_a_huge_edit():
    assert rules_from_edit("same\n", "same\n") == []
    assert rules_from_edit("a\n", "b" * 10_000) == []
    assert predict("text", []) == "text"


@pytest.fixture(scope="module")
def shipped():
    from codespec.core.default_model import target_path
    from codespec.core.model import TargetModel

    return TargetModel.load(str(target_path()), device="cpu")


@pytest.fixture(scope="module")
def next_edit_cases():
    from bench.next_edit_workload import load

    return load(SAMPLE)


@pytest.mark.parametrize("name", list(EDIT_FILES))
def test_the_workload_pairs_hunks_that_repeat_one_change(name):
    from bench.next_edit_workload import load

    path, least, _ = edit_file(name)
    next_edit_cases = load(path)
    assert len(next_edit_cases) >= least
    kinds = {case.kind for case in next_edit_cases}
    assert {"rename", "signature"} <= kinds
    for case in next_edit_cases:
        before_window = case.window
        assert case.output != before_window  # the second site really changes
        # the first hunk is applied in the document: its new lines are there, where the cursor is
        assert case.document[: case.cursor].endswith(case.edit_after)
        assert case.window_start <= case.window_end <= len(case.document)


@pytest.mark.parametrize("name", list(EDIT_FILES))
def test_cross_file_cases_pair_hunks_of_two_files_of_one_commit(name):
    import json

    from bench.next_edit_workload import cross_file_cases, word_changes

    path, _, least = edit_file(name)
    with open(path, encoding="utf-8") as handle:
        records = {record["id"]: record for record in map(json.loads, handle)}
    cases = cross_file_cases(list(records.values()))
    assert len(cases) >= least and {"rename", "other"} <= {case.kind for case in cases}
    for case in cases:
        site, _, edited = case.id.rpartition("/")[0].partition("/from:")
        commit = site.split(":", 1)[0]
        assert edited == case.edit_path and site != f"{commit}:{edited}"  # two files
        record = records[site]
        assert case.document == record["before"]  # the other file as it was before the commit
        window = case.document[case.window_start : case.window_end]
        assert window in record["before"] and case.output != window
        # the user's edit is a hunk of the other file of that commit
        edited_record = records[f"{commit}:{edited}"]
        assert case.edit_before in edited_record["before"] and case.edit_after in edited_record["after"]
        assert word_changes(case.edit_before, case.edit_after)


def test_next_edit_drafting_beats_the_copy_pointer_on_renames(shipped, next_edit_cases):
    """Model-free replay of the true next edit (proposers.lookup_sim): the pointer over the
    predicted window needs fewer forwards than the pointer over the window itself."""
    from codespec.proposers.lookup_sim import replay
    from codespec.proposers.reference import ReferenceLookup

    renames = [case for case in next_edit_cases if case.kind == "rename"][:30]
    forwards = {"reference": 0, "next-edit": 0}
    tokens = 0
    for case in renames:
        prompt = shipped.encode(case.window)
        output = shipped.encode(case.output)
        tokens += len(output)
        for name, proposer in (
            ("reference", ReferenceLookup(case.window, shipped.tokenizer)),
            ("next-edit", NextEditLookup(case.window, case.edits, shipped.tokenizer)),
        ):
            forwards[name] += len(replay(proposer, prompt, output, max_draft=64).steps)
    assert forwards["next-edit"] * 1.3 <= forwards["reference"], forwards
    assert tokens / forwards["next-edit"] >= 6


def test_greedy_is_plain_decoding_with_next_edit_drafting_on_the_shipped_model(shipped, next_edit_cases):
    from codespec.core.config import GenerationLimits, SamplingParams
    from codespec.core.decode import generate_all
    from codespec.core.draft import NoDraft
    from codespec.core.next_edit_prompts import EditEvent, edits_instruction
    from codespec.core.prompts import PromptRenderer, Rewrite
    from codespec.proposers.registry import ProposerSetup, create_proposer

    renderer = PromptRenderer(shipped.tokenizer, shipped.prompt_format)
    drafted = 0
    for case in next_edit_cases[:6]:
        assert NextEditLookup(case.window, case.edits, shipped.tokenizer).changes or case.kind == "other"
        prompt = renderer.render(
            Rewrite(case.window, edits_instruction([EditEvent("f.py", case.edit_before, case.edit_after)]))
        )
        prompt_ids = shipped.encode(prompt.text)
        limits = GenerationLimits(len(shipped.encode(case.window)) + 16, (), max_draft_len=0)
        plain = generate_all(shipped, prompt_ids, NoDraft(), SamplingParams(), limits)
        for name in ("next-edit", "auto"):
            setup = ProposerSetup.from_options(shipped, {"reference": case.window, "edits": case.edits})
            got = generate_all(
                shipped,
                prompt_ids,
                create_proposer(name, setup),
                SamplingParams(),
                GenerationLimits(limits.max_new_tokens, (), max_draft_len=64),
            )
            assert got.token_ids == plain.token_ids, (case.id, name)
            drafted += sum(step.accepted for step in got.stats.steps)
    assert drafted > 0
