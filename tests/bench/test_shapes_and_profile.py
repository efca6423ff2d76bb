"""Published model shapes (exact configurations), the real-mode vocabulary limit for them, and the
verification-cost profiler (bench/profile_verify.py) at a tiny shape."""

from __future__ import annotations

import json

import pytest
import torch

from bench.shapes import PUBLISHED, SHAPE_NAMES, config_of

# Parameter counts the model cards publish (Qwen2.5-Coder 0.49B / 1.54B / 7.61B, StarCoder2 3.03B,
# DeepSeek-Coder 1.35B), to the parameter.
PARAMETERS = {
    "qwen2.5-coder-0.5b": 494_032_768,
    "qwen2.5-coder-1.5b": 1_543_714_304,
    "qwen2.5-coder-7b": 7_615_616_512,
    "starcoder2-3b": 3_030_371_328,
    "deepseek-coder-1.3b": 1_346_471_936,
}


@pytest.mark.parametrize("shape", sorted(PUBLISHED))
def test_published_shapes_have_the_published_parameter_count(shape):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):  # no memory, no initialisation
        model = AutoModelForCausalLM.from_config(config_of(shape, eos_token_id=0))
    assert sum(p.numel() for p in model.parameters()) == PARAMETERS[shape]
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert tied == PUBLISHED[shape].config["tie_word_embeddings"]
    assert model.get_output_embeddings().weight.shape[0] == PUBLISHED[shape].vocab_size


def test_the_qwen_shapes_carry_qkv_bias_and_rope_theta():
    from transformers import AutoModelForCausalLM

    config = config_of("qwen2.5-coder-0.5b")
    assert (
        config.hidden_size,
        config.num_hidden_layers,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.intermediate_size,
        config.vocab_size,
    ) == (896, 24, 14, 2, 4864, 151936)
    assert config.rope_parameters["rope_theta"] == 1_000_000.0
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    attention = model.model.layers[0].self_attn
    assert attention.q_proj.bias is not None and attention.o_proj.bias is None
    assert config_of("deepseek-coder-1.3b").rope_parameters["rope_type"] == "linear"


def test_the_bench_command_offers_every_shape():
    from bench.cli import PROFILES

    assert set(PUBLISHED) <= set(SHAPE_NAMES)
    assert PROFILES["cpu-real"]["model_shape"] == "qwen2.5-coder-0.5b"
    assert "model_shape" not in PROFILES["quick"]  # the quick profile keeps its 30m (commands pass it)


def test_real_mode_masks_ids_the_tokenizer_cannot_spell():
    from bench.replay import ReplayTarget, VocabularyLimit

    class Wide:  # a stand-in target: a 10-id head, a 4-id tokenizer
        model = None
        eos_token_ids = frozenset()

        def forward(self, ids, cache, keep_last=1):
            return torch.arange(10.0).repeat(keep_last, 1)

    target = ReplayTarget(Wide(), vocab_limit=4)
    target._full_depth = lambda: True
    logits = target.forward([1], None, keep_last=2)
    assert logits.argmax(-1).tolist() == [3, 3] and torch.isinf(logits[:, 4:]).all()
    assert VocabularyLimit(4)(None, torch.arange(10.0)[None]).argmax().item() == 3


def test_profile_verify_reports_cost_parts_and_bound(tmp_path):
    from bench.profile_verify import PARTS, bound_ms, forward_work, main

    out = tmp_path / "profile.json"
    assert (
        main(
            [
                "--shape",
                "tiny",
                "--context",
                "64",
                "--ks",
                "0",
                "2",
                "8",
                "--repeats",
                "2",
                "--prefill",
                "32",
                "--kernels",
                "gqa",
                "codespec",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert set(report["variants"]) == {"gqa", "codespec"}
    rows = report["variants"]["codespec"]
    assert set(rows) == {"0", "2", "8"} and rows["0"]["x_plain"] == 1.0
    for row in rows.values():
        assert set(PARTS) <= set(row) and row["total"] > 0
        assert sum(row[part] for part in PARTS) == pytest.approx(row["total"], abs=0.05)
    assert report["prefill"]["codespec"]["ms_per_token"] > 0
    assert report["rates"]["read_GBps"] > 0 and report["bound"]["8"]["bound_ms"] >= report["bound"]["0"]["bound_ms"]
    work = {"weight_bytes": 2e9, "flops": 1e10}
    bound = bound_ms(work, {"read_GBps": 40.0, "gemm_GFLOPs_packed": 200.0})
    assert bound["traffic_ms"] == 50.0 and bound["arithmetic_ms"] == 50.0 and bound["no_overlap_ms"] == 100.0
    from bench.shapes import random_llama

    model = random_llama("tiny", vocab_size=100)
    small, large = forward_work(model, 100, 0), forward_work(model, 100, 16)
    assert large["flops"] > 16 * small["flops"] * 0.9 and large["weight_bytes"] == small["weight_bytes"]


def test_kernel_memory_reports_resident_memory_over_prompt_lengths(tmp_path, capsys):
    import json

    from bench.kernel_memory import main
    from bench.shapes import save_shape

    model = save_shape("tiny", tmp_path / "tiny")
    assert main(["--model", str(model), "--lengths", "6"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert sorted(report["after_lengths"], key=int) == ["1", "2", "4", "6"]
    for point in [report["after_load"], *report["after_lengths"].values()]:
        assert point["VmRSS"] >= point["RssAnon"] > 0
