"""The llama.cpp backend: a GGUF written here from the shipped model, loaded through
llama-cpp-python, against PyTorch and against llama.cpp's own greedy decoding."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

llama_cpp = pytest.importorskip("llama_cpp", reason="the llama.cpp backend needs: pip install 'codespec[gguf]'")
pytest.importorskip("gguf", reason="export needs gguf-py: pip install 'codespec[gguf]'")

from codespec.core.backends import load_target  # noqa: E402
from codespec.core.config import GenerationLimits, SamplingParams  # noqa: E402
from codespec.core.decode import generate_all  # noqa: E402
from codespec.core.default_model import target_path  # noqa: E402
from codespec.core.errors import InvalidRequestError  # noqa: E402
from codespec.core.gguf_export import export_gguf  # noqa: E402
from codespec.core.llama_cpp_target import LlamaCppTarget  # noqa: E402
from codespec.core.prompts import Fim, PromptRenderer, Rewrite  # noqa: E402
from codespec.proposers.registry import ProposerSetup, create_proposer  # noqa: E402

WORKLOADS = Path(__file__).resolve().parents[2] / "shared" / "workloads"
MAX_NEW = 48


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("gguf")
    for kind in ("f32", "q8_0"):
        export_gguf(target_path(), directory / f"default-{kind}.gguf", kind)
    return directory


@pytest.fixture(scope="module")
def target(gguf_dir) -> LlamaCppTarget:
    return LlamaCppTarget(gguf_dir / "default-q8_0.gguf", threads=1)


def edit_prompts(target, count: int = 6) -> list[tuple[list[int], str]]:
    """Rewrite prompts of real httpx files: the development workload's, else the repository's
    sample of it (tests/data), so a clone alone runs them too."""
    renderer = PromptRenderer(target.tokenizer, target.prompt_format)
    workload = WORKLOADS / "edits-httpx.jsonl"
    if not workload.is_file():
        workload = Path(__file__).resolve().parent / "data" / "edits-httpx-sample.jsonl"
    with workload.open(encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle][:count]
    originals = [row["before"][:1200] for row in rows]
    return [(target.encode(renderer.render(Rewrite(text)).text), text) for text in originals]


def llama_cpp_greedy(path: Path, prompt_ids: list[int], max_new: int, stop_ids: frozenset[int]) -> list[int]:
    """llama-cpp-python's own greedy decoding (temperature 0) of ``path``."""
    model = llama_cpp.Llama(str(path), n_ctx=4096, n_threads=1, verbose=False)
    output: list[int] = []
    for token in model.generate(prompt_ids, temp=0.0, reset=True):
        output.append(int(token))
        if len(output) >= max_new or token in stop_ids:
            break
    model.close()
    return output


def test_exported_gguf_scores_like_the_checkpoint(gguf_dir):
    """f32 GGUF on llama.cpp vs the same weights on PyTorch: the rotary permutation, names and
    hyperparameters are right when the logits agree to float rounding."""
    from codespec.core.model import TargetModel

    gguf_target = LlamaCppTarget(gguf_dir / "default-f32.gguf", threads=1)
    torch_target = TargetModel.load(str(target_path()))
    text = "<|fim_prefix|>def add(a, b):\n    return <|fim_suffix|>\n\nprint(add(1, 2))\n<|fim_middle|>"
    ids = gguf_target.encode(text)
    assert ids == torch_target.encode(text)
    ours = gguf_target.forward(ids, gguf_target.new_cache(), keep_last=len(ids))
    theirs = torch_target.forward(ids, torch_target.new_cache(), keep_last=len(ids))
    assert ours.shape == theirs.shape == (len(ids), torch_target.vocab_size)
    assert float((ours - theirs).abs().max()) < 0.05
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_the_contract_members(target):
    assert target.vocab_size == 4096
    assert target.prompt_format.name == "qwen2.5-coder"  # detected from the GGUF's token names
    assert 0 in target.eos_token_ids  # <|endoftext|>
    assert target.tokenizer_agrees
    text = "def área(x):\n    return x  # 日本\n"
    assert target.decode(target.encode(text)) == text
    assert target.encode("<|fim_prefix|>x")[0] == 1  # a special token written in a prompt is one token
    assert target.decode([1, *target.encode("x")]) == "x"  # and decodes to nothing


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_rollback_then_forward_equals_a_fresh_prefill(gguf_dir, kind):
    """In f32 within rounding (0 on an AVX2 machine of this class; cells left over from the dropped
    tail would move it far more). Q8_0 quantizes each matmul's activations to 8 bits, so where the
    cache's cells lie (which forwards ran on the context before) moves its logits by up to ~0.07
    on that machine; its argmax holds."""
    target = LlamaCppTarget(gguf_dir / f"default-{kind}.gguf", threads=1)
    ids = target.encode("import os\nimport sys\n\ndef main():\n    print(sys.argv)\n")
    cache = target.new_cache()
    target.forward(ids[:-5] + target.encode(" x y z w v u")[:5], cache)  # a tail that is then dropped
    cache.rollback(len(ids) - 5)
    assert len(cache) == len(ids) - 5
    again = target.forward(ids[-5:], cache, keep_last=5)
    fresh = target.forward(ids, target.new_cache(), keep_last=5)
    assert torch.equal(again.argmax(-1), fresh.argmax(-1))
    assert float((again - fresh).abs().max()) < (1e-4 if kind == "f32" else 0.2)
    assert cache.token_ids == ids


def test_forward_many_equals_forwards_alone(target):
    texts = ["def f(x):\n    return x + 1\n", "class A:\n    pass\n", "for i in range(10):\n"]
    prompts = [target.encode(t) for t in texts]
    alone = [target.forward(p, target.new_cache(), keep_last=2) for p in prompts]
    caches = [target.new_cache() for _ in prompts]
    together = target.forward_many(prompts, caches, [2, 2, 2])
    for one, many, cache, prompt in zip(alone, together, caches, prompts):
        assert many.shape == (2, target.vocab_size)
        assert torch.equal(one.argmax(-1), many.argmax(-1))
        assert cache.token_ids == prompt


def test_plain_decoding_is_llama_cpp_greedy_and_every_proposer_keeps_it(target, gguf_dir):
    """Greedy through codespec (plain, context, reference, auto) is token-identical to llama.cpp's own
    greedy decoding of the same file."""
    stop = target.eos_token_ids
    limits = GenerationLimits(max_new_tokens=MAX_NEW, max_draft_len=16)
    for prompt_ids, original in edit_prompts(target):
        own = llama_cpp_greedy(gguf_dir / "default-q8_0.gguf", prompt_ids, MAX_NEW, stop)
        for name in ("none", "context", "reference", "auto"):
            proposer = None
            if name != "none":
                proposer = create_proposer(name, ProposerSetup.from_options(target, {"reference": original}))
            got = list(generate_all(target, prompt_ids, proposer, SamplingParams(), limits).token_ids)
            assert got == own[: len(got)], f"{name}: differs from llama.cpp's greedy"
            assert len(got) == len(own) or got[-1:] and len(got) < MAX_NEW  # stopped early only at an end


def test_a_gguf_draft_model_drafts_for_a_gguf_target(target, gguf_dir):
    setup = ProposerSetup.from_options(target, {"draft_model": str(gguf_dir / "default-f32.gguf")})
    proposer = create_proposer("draft", setup)
    prompt_ids, _ = edit_prompts(target, 1)[0]
    limits = GenerationLimits(max_new_tokens=24, max_draft_len=4)
    plain = generate_all(target, prompt_ids, None, SamplingParams(), limits)
    drafted = generate_all(target, prompt_ids, proposer, SamplingParams(), limits)
    assert drafted.token_ids == plain.token_ids
    assert drafted.stats.summary()["tokens_per_forward"] > 1.0  # near-identical weights: drafts are accepted


def test_memory_is_bounded_idle_sequences_are_emptied(gguf_dir, target):
    small = LlamaCppTarget(gguf_dir / "default-q8_0.gguf", threads=1, kv_tokens=4096)
    ids = small.encode("x = 1\n" * 400)[:1500]
    first, second, third = small.new_cache(), small.new_cache(), small.new_cache()
    small.forward(ids, first)
    small.forward(ids, second)
    small.forward(ids, third)  # 4,500 > 4,096 cells: the least recently used sequence is emptied
    assert len(first) == 0 and len(second) == len(ids) and len(third) == len(ids)
    again = small.forward(ids, first, keep_last=3)  # an emptied cache is a cache like any other
    fresh = target.forward(ids, target.new_cache(), keep_last=3)
    assert torch.equal(again.argmax(-1), fresh.argmax(-1))
    assert len(first) == len(ids) and len(second) == 0  # second was the oldest then
    with pytest.raises(InvalidRequestError, match="KV memory"):
        small.forward(small.encode("y = 2\n" * 2500)[:4200], small.new_cache())


def test_dropped_caches_give_their_sequences_back(gguf_dir):
    import gc

    small = LlamaCppTarget(gguf_dir / "default-q8_0.gguf", threads=1)
    for _ in range(200):  # more than the context's sequences: each dropped cache frees its seq_id
        cache = small.new_cache()
        small.forward([5, 6, 7], cache)
        del cache
        gc.collect()


def test_fim_prompt_through_the_renderer(target):
    renderer = PromptRenderer(target.tokenizer, target.prompt_format)
    ids = target.encode(renderer.render(Fim("def add(a, b):\n    return ", "\n")).text)
    logits = target.forward(ids, target.new_cache())
    assert logits.shape == (1, target.vocab_size)
    assert np.isfinite(logits.numpy()).all()


def test_load_target_picks_llama_cpp_for_a_gguf(gguf_dir):
    loaded = load_target(str(gguf_dir / "default-q8_0.gguf"), threads=1)
    assert isinstance(loaded, LlamaCppTarget)
