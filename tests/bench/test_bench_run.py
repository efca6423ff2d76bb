"""The bench end to end on a tiny random Llama: JSON contract, replay forcing, websocket load."""

import json

import pytest

from bench.shapes import build_tokenizer, random_llama
from codespec.core.config import GenerationLimits, SamplingParams

EDITS = [
    {
        "id": "e1",
        "instruction": "",
        "before": "def add(a, b):\n    return a + b\n\n\nprint(add(1, 2))\n",
        "after": 'def add(a, b):\n    """Sum."""\n    return a + b\n\n\nprint(add(1, 2))\n',
    },
    {"id": "e2", "before": "x = 1\ny = 2\nz = x + y\nprint(z)\n", "after": "x = 1\ny = 3\nz = x + y\nprint(z)\n"},
]
CORPUS = [record["before"] + record["after"] for record in EDITS] * 20


@pytest.fixture(scope="module")
def tiny_target():
    from codespec.core.model import TargetModel
    from codespec.core.prompts import SPECIAL_TOKENS

    tokenizer = build_tokenizer(CORPUS, vocab_size=300, extra_special=SPECIAL_TOKENS[1:])
    model = random_llama("tiny", len(tokenizer), seed=3, eos_token_id=tokenizer.eos_token_id)
    return TargetModel(model, tokenizer, name="tiny")


def test_bench_command_writes_every_metric_key(tmp_path, capsys):
    from bench.run import METRIC_KEYS
    from codespec.commands.cli import main

    workload = tmp_path / "edits.jsonl"
    workload.write_text("".join(json.dumps(record) + "\n" for record in EDITS))
    out, report = tmp_path / "bench.json", tmp_path / "bench.md"
    configs = "greedy,context,reference,index,early-exit,auto,hf-greedy,hf-pld,hf-early-exit"
    code = main(
        [
            "bench",
            "--workload",
            str(workload),
            "--mode",
            "replay",
            "--model-shape",
            "tiny",
            "--configs",
            configs,
            "--max-requests",
            "2",
            "--max-new-tokens",
            "24",
            "--draft-len",
            "8",
            "4",
            "--concurrency",
            "2",
            "--load-requests",
            "2",
            "--threads",
            "1",
            "--json",
            str(out),
            "--report",
            str(report),
            "--plots",
            str(tmp_path / "plots"),
        ]
    )
    assert code == 0
    data = json.loads(out.read_text())
    assert data["mode"] == "replay"
    assert set(data["configs"]) == set(configs.split(","))
    for name, row in data["configs"].items():
        missing = set(METRIC_KEYS) - set(row)
        assert not missing, f"{name} lacks {missing}"
        assert row["equivalence"] == 1.0, name  # replay forces the same text everywhere
        assert row["tokens_per_s"] > 0
    assert data["configs"]["greedy"]["speedup"] == 1.0
    assert data["configs"]["greedy"]["tokens_per_forward"] == 1.0
    assert data["configs"]["reference"]["tokens_per_forward"] > 1.0  # the copy pointer drafts the edit
    assert data["workloads"]["edits"]["records"] == 2
    assert data["replay_forced_rows"] > 0
    assert [point["value"] for point in data["sweeps"]] == [4]
    level = data["load"]["levels"][0]
    assert level["concurrency"] == 2 and level["requests"] == 2 and level["errors"] == 0
    text = report.read_text()
    assert "| greedy |" in text and "replay" in text and "offered load" in text


def _case(record):
    from bench.workload import case_from_record

    return case_from_record(record, "edits", "test")


@pytest.mark.parametrize("record", EDITS, ids=[r["id"] for r in EDITS])
def test_replay_forces_the_recorded_output_in_codespec_and_transformers(tiny_target, record):
    from bench.engine import CodespecConfig
    from bench.measure import MemoryProbe
    from bench.peers import HFConfig
    from bench.replay import ReplayTarget
    from bench.run import RunSettings, prepare

    target = ReplayTarget(tiny_target)
    case = _case(record)
    item = prepare(target, case, RunSettings("replay", 200, 8), target.eos_token_ids)
    recorded = tiny_target.encode(record["after"])
    assert list(item.recording.output_ids) == recorded
    probe = MemoryProbe()
    limits = GenerationLimits(item.max_new_tokens, (), None, 8)
    outputs = {}
    for name in ("greedy", "reference", "early-exit"):
        target.recordings.add(item.recording)
        try:
            result = CodespecConfig(name, tiny_target, None).run(
                target, case, item.prompt_ids, limits, SamplingParams(), probe
            )
        finally:
            target.recordings.remove(item.recording)
        outputs[name] = result.output_ids
    for name in ("hf-greedy", "hf-pld", "hf-early-exit"):
        config = HFConfig(name, tiny_target.model, sorted(target.eos_token_ids), exit_layer=1)
        outputs[name] = config.run(
            case, item.prompt_ids, item.max_new_tokens, SamplingParams(), probe, item.recording
        ).output_ids
    eos = tiny_target.tokenizer.eos_token_id
    for name, output in outputs.items():
        assert list(output) == recorded + [eos], name  # the recording, then the forced end
        assert tiny_target.decode(output) == record["after"], name


def test_without_a_recording_the_model_chooses(tiny_target):
    """Real mode is the same wrapper with nothing registered: it must not touch the logits."""
    import torch

    from bench.replay import ReplayTarget

    target = ReplayTarget(tiny_target)
    prompt = tiny_target.encode(EDITS[0]["before"])
    raw_logits = tiny_target.forward(prompt, tiny_target.new_cache())
    wrapped_logits = target.forward(prompt, tiny_target.new_cache())
    assert torch.equal(raw_logits, wrapped_logits)
    assert target.biased_rows == 0


def test_early_exit_drafts_are_not_biased(tiny_target):
    """A truncated layer stack is a draft: telling it the answer would fake its acceptance."""
    from bench.replay import Recording, ReplayTarget
    from codespec.core.model import truncated_layers

    target = ReplayTarget(tiny_target)
    prompt = tiny_target.encode(EDITS[0]["before"])
    forced = 5
    target.recordings.add(Recording(tuple(prompt), (forced,)))
    with truncated_layers(tiny_target.model, 1):
        draft_logits = target.forward(prompt, tiny_target.new_cache())
    full_logits = target.forward(prompt, tiny_target.new_cache())
    assert draft_logits.max() < 1000 and full_logits[0].argmax().item() == forced
