"""`codespec simulate`: the replay arithmetic, the hf-rule baseline, the ceiling, the CLI and its JSON."""

from __future__ import annotations

import json
import os
import random
import sysconfig
from pathlib import Path

import pytest

from bench.hf_rule import PromptLookupRule
from codespec.commands.cli import main
from codespec.core.draft import EMPTY_DRAFT, Draft, NoDraft, ProposeContext
from codespec.proposers.lookup_sim import ceiling_forwards, hindsight_forwards, replay

WORKLOADS = Path(__file__).resolve().parents[3] / "shared" / "workloads"
JSON_KEYS = {
    "coverage",
    "mean_accepted_length",
    "tokens_per_forward",
    "acceptance_by_depth",
    "proposal_ms_p50",
    "proposal_ms_p99",
}


class Oracle:
    """Drafts the true continuation (up to ``max_len``): every forward advances K + 1 tokens."""

    name = "oracle"

    def __init__(self, output):
        self.output = list(output)

    def begin(self, prompt_ids):
        self.prompt_len = len(prompt_ids)

    def propose(self, context: ProposeContext) -> Draft:
        done = len(context.token_ids) - self.prompt_len
        return Draft(tuple(self.output[done : done + context.max_len]), self.name)

    def observe(self, outcome):
        pass

    def end(self):
        pass


def test_replay_counts_forwards_like_the_engine():
    output = list(range(100, 170))  # 70 tokens
    assert len(replay(NoDraft(), [1, 2], output, 8).steps) == 70
    stats = replay(Oracle(output), [1, 2], output, 8)
    assert [step.emitted for step in stats.steps] == [9] * 7 + [7]  # the last draft is cut by the budget
    assert stats.summary()["tokens_per_forward"] == 70 / 8


def test_hf_rule_takes_the_leftmost_bigram_then_unigram_and_ten_tokens():
    rule = PromptLookupRule()
    rule.begin(())
    sequence = [5, 6, 1, 2, 3, 4, 1, 2, 9, 8, 7, 1, 2]
    draft = rule.propose(ProposeContext(sequence, 0, 32))
    assert draft.token_ids == (3, 4, 1, 2, 9, 8, 7, 1, 2)  # leftmost "1 2"; the sequence ends first
    sequence = [7] * 3 + list(range(20, 40)) + [99, 20]
    rule = PromptLookupRule()
    assert rule.propose(ProposeContext(sequence, 0, 32)).token_ids == tuple(range(21, 31))  # n=1, 10 tokens
    assert rule.propose(ProposeContext(sequence, 0, 4)).token_ids == (21, 22, 23, 24)
    assert PromptLookupRule().propose(ProposeContext([1, 2, 3], 0, 8)) is EMPTY_DRAFT


def test_ceiling_charges_blocks_by_draft_length_and_unaligned_tokens_one_each():
    reference = list(range(100))
    assert ceiling_forwards(reference, reference, 32) == 4  # ceil(100 / 33)
    output = reference[:50] + [500, 501] + reference[50:]
    assert ceiling_forwards(reference, output, 32) == 2 + 2 + 2  # two blocks of 50, two inserted tokens


def test_hindsight_bound_drafts_the_longest_available_stretch():
    prompt = list(range(10))
    assert hindsight_forwards(prompt, prompt, 32) == 1  # 9 drafted + 1 bonus
    assert hindsight_forwards([], list(range(5)), 32) == 5  # nothing to copy: one token per forward
    # The copy, then a novel token (the bonus of the same forward), then that token repeated.
    assert hindsight_forwards([1, 2, 3], [1, 2, 3, 9, 9, 9], 32) == 2
    assert hindsight_forwards(list(range(100)), list(range(100)), 32) == 4  # 33 per forward at most
    # The reference as tokenized on its own is a source too (the prompt may tokenize it otherwise).
    assert hindsight_forwards([7, 8], [1, 2, 3, 4], 32) == 4
    assert hindsight_forwards([7, 8], [1, 2, 3, 4], 32, [[1, 2, 3, 4]]) == 1
    assert hindsight_forwards([1, 2], [2, 7, 9], 32, [[7, 9]]) == 2  # no stretch across two texts
    assert hindsight_forwards([5, 1], [2, 6], 32, [[1, 2]]) == 1  # the output continues the prompt


def _fewest_forwards(prompt, output, max_draft, source=()):
    """Exhaustive: the fewest forwards of *any* drafting that only proposes stretches of the prompt,
    another source or the output so far, one path or a tree of them. Whatever was drafted, what a
    forward accepts is a prefix of the true continuation that occurs in that text, plus the
    target's own token."""

    def occurs(needle, haystack):
        return any(haystack[k : k + len(needle)] == needle for k in range(len(haystack) - len(needle) + 1))

    best = {0: 0}
    for position in range(len(output)):  # positions only grow: a forward pass in order is a BFS
        if position not in best:
            continue
        available = [*source, None, *prompt, *output[:position]]  # None: no stretch spans two texts
        for accepted in range(min(max_draft, len(output) - position - 1) + 1):
            if accepted and not occurs(list(output[position : position + accepted]), available):
                break
            reached = position + accepted + 1
            best[reached] = min(best.get(reached, reached), best[position] + 1)
    return best[len(output)]


def test_hindsight_bound_is_the_optimum_of_every_lookup_drafting():
    """Why the bound binds every copying proposer: drafting the longest available stretch each step
    is optimal (the reach i + L(i) + 1 never decreases, as a suffix of an occurring stretch occurs)."""
    rng = random.Random(4)
    for _ in range(300):
        alphabet = rng.randint(2, 6)
        prompt = [rng.randrange(alphabet) for _ in range(rng.randint(0, 25))]
        output = [rng.randrange(alphabet) for _ in range(rng.randint(1, 30))]
        source = [rng.randrange(alphabet) for _ in range(rng.randint(0, 8))]
        max_draft = rng.randint(1, 8)
        assert hindsight_forwards(prompt, output, max_draft) == _fewest_forwards(prompt, output, max_draft)
        assert hindsight_forwards(prompt, output, max_draft, [source]) == _fewest_forwards(
            prompt, output, max_draft, source
        )


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from bench.shapes import build_tokenizer

    stdlib = sysconfig.get_paths()["stdlib"]
    corpus = [open(os.path.join(stdlib, name), encoding="utf-8").read() for name in ("textwrap.py", "difflib.py")]
    directory = tmp_path_factory.mktemp("tok")
    build_tokenizer(corpus, 1024).save_pretrained(directory)
    return directory


def _edit(record_id: str, before: str, after: str) -> dict:
    return {"source": "test", "id": record_id, "lang": "python", "instruction": "fix", "before": before, "after": after}


def test_cli_writes_exactly_the_agreed_json(tokenizer_dir, tmp_path, capsys):
    body = "".join(f"def handler_{n}(request):\n    return respond(request, {n})\n\n\n" for n in range(12))
    records = [
        _edit("a", body, body.replace("respond(request, 7)", "respond(request, 7, retry=True)")),
        _edit("b", body, body.replace("def handler_3", "def handler_three")),
    ]
    workload = tmp_path / "edits-small.jsonl"
    workload.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "report.json"
    code = main(
        [
            "simulate",
            "--workload",
            str(workload),
            "--tokenizer",
            str(tokenizer_dir),
            "--proposer",
            "reference",
            "context",
            "--max-draft",
            "32",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    assert set(report) == {"workload", "records", "max_draft", "ceiling", "proposers"}
    assert (report["workload"], report["records"], report["max_draft"]) == ("edits-small", 2, 32)
    assert set(report["proposers"]) == {"reference", "context", "hf-rule"}
    for row in report["proposers"].values():
        assert set(row) == JSON_KEYS
    reference = report["proposers"]["reference"]["tokens_per_forward"]
    assert reference > 2.5 * report["proposers"]["hf-rule"]["tokens_per_forward"]
    assert set(report["ceiling"]) == {"tokens_per_forward"}
    assert report["ceiling"]["tokens_per_forward"] > 10
    printed = capsys.readouterr().out
    assert "hf-rule" in printed
    bound = float(printed.split("hindsight bound")[1].split("):")[1].split()[0])
    assert bound >= reference


def test_cli_names_the_bad_line(tokenizer_dir, tmp_path, capsys):
    workload = tmp_path / "broken.jsonl"
    workload.write_text(json.dumps(_edit("a", "x = 1\n", "x = 2\n")) + "\n{not json\n")
    assert main(["simulate", "--workload", str(workload), "--tokenizer", str(tokenizer_dir)]) == 2
    assert "broken.jsonl:2" in capsys.readouterr().err
    assert main(["simulate", "--workload", str(tmp_path / "missing.jsonl"), "--tokenizer", str(tokenizer_dir)]) == 2
    assert (
        main(["simulate", "--workload", str(workload), "--tokenizer", str(tokenizer_dir), "--proposer", "draft"]) == 2
    )
    assert "needs a model" in capsys.readouterr().err


def test_real_edits_reference_beats_the_baseline(tokenizer_dir, tmp_path):
    source = WORKLOADS / "humanevalfix-python.jsonl"
    if not source.is_file():
        pytest.skip(f"{source} absent (the shared workloads are not part of the repository)")
    out = tmp_path / "hef.json"
    assert (
        main(
            [
                "simulate",
                "--workload",
                str(source),
                "--tokenizer",
                str(tokenizer_dir),
                "--max-records",
                "12",
                "--proposer",
                "reference",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    rows = report["proposers"]
    assert report["records"] == 12
    assert rows["reference"]["tokens_per_forward"] > 1.5 * rows["hf-rule"]["tokens_per_forward"]
    assert rows["reference"]["tokens_per_forward"] > 0.9 * report["ceiling"]["tokens_per_forward"]


def test_cli_bad_workload_bytes_name_the_file_and_line(tmp_path):
    """Through the installed entry point: exit code 2, one line naming file:line, no traceback."""
    import subprocess
    import sys

    good = json.dumps(_edit("a", "x = 1\n", "x = 2\n")) + "\n"
    workload = tmp_path / "latin1.jsonl"
    workload.write_bytes(
        good.encode() + b"\n" + json.dumps(_edit("b", "x", "y")).replace('"y"', '"caf\u00e9"').encode("latin-1") + b"\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "codespec.commands.cli",
            "simulate",
            "--workload",
            str(workload),
            "--tokenizer",
            str(tmp_path / "unused"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert f"{workload}:3: not UTF-8" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "content, expected",
    [
        (b'{"id": "a", "before": "x = 1\\n"}\n', "broken.jsonl:1: field 'after' must be a string, got NoneType"),
        (b'\n\n{"id": "a", "before": 1, "after": "x"}\n', "broken.jsonl:3: field 'before' must be a string, got int"),
        (b'{"id": "a", "prefix": "x = "}\n', "broken.jsonl:1: field 'target' must be a string"),
        (b'{"id": "a", "text": "x"}\n', "broken.jsonl:1: neither an edit record"),
        (b"[1, 2]\n", "broken.jsonl:1: expected a JSON object per line"),
        (b'{"id": "a", "before": "\\ud800", "after": "x"}\n', "broken.jsonl:1: field 'before' is not valid Unicode"),
        (b'\xff\xfe{"id": 1}\n', "broken.jsonl:1: not UTF-8 text (byte 1 of the line: b'\\xff')"),
        (b"\n  \n", "holds no records"),
    ],
)
def test_cli_bad_records_are_clear_errors(tokenizer_dir, tmp_path, capsys, content, expected):
    workload = tmp_path / "broken.jsonl"
    workload.write_bytes(content)
    assert main(["simulate", "--workload", str(workload), "--tokenizer", str(tokenizer_dir)]) == 2
    assert expected in capsys.readouterr().err


def test_cli_bad_workspace_and_output_paths(tokenizer_dir, tmp_path, capsys):
    workload = tmp_path / "edits.jsonl"
    workload.write_text(json.dumps(_edit("a", "x = 1\n", "x = 2\n")) + "\n")
    workspace = tmp_path / "workspace.jsonl"
    workspace.write_bytes(b'{"path": "a.py", "text": "ok"}\n{"path": "b.py", "text": "caf\xe9"}\n')
    assert (
        main(
            ["simulate", "--workload", str(workload), "--tokenizer", str(tokenizer_dir), "--workspace", str(workspace)]
        )
        == 2
    )
    assert f"{workspace}:2: not UTF-8" in capsys.readouterr().err
    assert (
        main(["simulate", "--workload", str(workload), "--tokenizer", str(tokenizer_dir), "--workspace", str(tmp_path)])
        == 2
    )
    assert f"workspace file {tmp_path} is not a file" in capsys.readouterr().err
    out = tmp_path / "no-such-dir" / "report.json"
    assert main(["simulate", "--workload", str(workload), "--tokenizer", str(tokenizer_dir), "--json", str(out)]) == 2
    assert "--json" in capsys.readouterr().err
    assert main(["simulate", "--workload", str(workload), "--tokenizer", str(tokenizer_dir), "--max-records", "0"]) == 2
    assert "--max-records" in capsys.readouterr().err
    bom = tmp_path / "bom.jsonl"  # a byte-order mark at the start is accepted
    bom.write_bytes(b"\xef\xbb\xbf" + workload.read_bytes())
    assert main(["simulate", "--workload", str(bom), "--tokenizer", str(tokenizer_dir), "--proposer", "context"]) == 0


def test_hindsight_bound_holds_where_the_prompt_tokenizes_the_reference_otherwise(tokenizer_dir):
    """The prompt's header ends in a line break that merges with the reference's indentation, so
    the reference's own tokens (what the copy pointer drafts) are not all among the prompt's."""
    from transformers import AutoTokenizer

    from bench.sim_run import simulate_workload
    from bench.sim_workload import SimCase, edit_prompt

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    reference = "    value = compute(alpha, beta)\n    return value\n"
    prompt = edit_prompt(reference, None)
    assert tokenizer.encode(reference)[0] not in tokenizer.encode(prompt)
    case = SimCase("c", "edit", prompt, reference, reference, 0, "mem://x.py", reference, 0)
    bounds: dict = {}
    report = simulate_workload([case], ["reference"], tokenizer, 8, bounds=bounds)
    tokens = len(tokenizer.encode(reference))
    copied = report["proposers"]["reference"]["tokens_per_forward"]
    assert copied == tokens / -(-tokens // 9)  # a copy: 8 drafted + 1 per forward
    assert bounds["hindsight_tokens_per_forward"] >= copied
