"""The kernels that make a verification forward cheaper on a CPU keep speculative decoding exact:
oneDNN linears on packed weights, grouped attention for several queries over a long cache, and the
KV cache layer that writes in place. Each against the stock computation, then greedy equivalence and
the K+1-rows-equal-one-token-rows property on a model large enough to take every new path."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from engine_harness import (
    ScriptedProposer,
    always_wrong,
    assert_greedy_equivalent,
    oracle,
    plain_greedy,
    right_then_wrong,
)

from bench.shapes import build_tokenizer, random_llama
from codespec.core.attention import block_runs, grouped_attention, grouped_pays
from codespec.core.linear import MIN_WORK, is_packed, pack_linears, stock_linears
from codespec.core.model import TargetModel

ONEDNN = pack_linears(torch.nn.Linear(1024, 1024)) == 1
needs_onednn = pytest.mark.skipif(not ONEDNN, reason="this torch has no oneDNN linear")


# -- packed linears ------------------------------------------------------------------------------
@needs_onednn
def test_packed_linear_matches_pytorch_and_stock_restores_it():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(896, 1024), torch.nn.Linear(1024, 896, bias=False))
    rows = torch.randn(1, 17, 896)
    with torch.no_grad():
        stock = model(rows)
    assert pack_linears(model) == 2 and all(is_packed(m) for m in model)
    with torch.inference_mode():
        packed = model(rows)
        with stock_linears(model):
            assert not any(is_packed(m) for m in model)
            assert torch.equal(model(rows), stock)
    assert all(is_packed(m) for m in model)
    torch.testing.assert_close(packed, stock, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_a_weight_written_in_place_is_packed_again_and_copies_pack_their_own():
    model = torch.nn.Linear(1024, 1024)
    pack_linears(model)
    rows = torch.randn(4, 1024)
    with torch.no_grad():
        model.weight.mul_(2.0)
        expected = F.linear(rows, model.weight, model.bias)
    with torch.inference_mode():
        torch.testing.assert_close(model(rows), expected, rtol=1e-5, atol=1e-4)
        twin = copy.deepcopy(model)
        torch.testing.assert_close(twin(rows), expected, rtol=1e-5, atol=1e-4)


@needs_onednn
def test_small_products_and_training_keep_pytorchs_linear():
    model = torch.nn.Linear(64, 64)
    pack_linears(model)
    assert 64 * 64 < MIN_WORK
    rows = torch.randn(3, 64, requires_grad=True)
    out = model(rows)  # autograd on: PyTorch's op, gradients flow to the weight
    out.sum().backward()
    assert model.weight.grad is not None


# -- grouped attention ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "queries,cached,heads,kv_heads,width", [(17, 1000, 14, 2, 64), (33, 400, 8, 2, 128), (5, 2000, 28, 4, 128)]
)
def test_grouped_attention_equals_sdpa_within_rounding(queries, cached, heads, kv_heads, width):
    torch.manual_seed(queries)
    keys = cached + queries
    query = torch.randn(1, queries, heads, width).transpose(1, 2)  # [1, Hq, T, D] as transformers passes it
    key, value = torch.randn(1, kv_heads, keys, width), torch.randn(1, kv_heads, keys, width)
    mask = torch.ones(queries, keys, dtype=torch.bool).tril(cached)[None, None]  # [1, 1, T, S]
    expected = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True).transpose(1, 2)
    assert grouped_pays(query, key, mask, 0.0, False)
    torch.testing.assert_close(grouped_attention(query, key, value, mask, None), expected, rtol=1e-5, atol=1e-5)


def test_fp32_takes_the_grouped_path_always_bf16_where_it_pays():
    key = torch.randn(1, 2, 100, 16)
    assert grouped_pays(torch.randn(1, 4, 1, 16), key, None, 0.0, False)  # fp32: exactness, any size
    assert grouped_pays(torch.randn(1, 4, 300, 16), key, None, 0.0, True)  # a causal prefill too
    small = torch.randn(1, 4, 8, 16, dtype=torch.bfloat16)
    assert not grouped_pays(small, key.bfloat16(), None, 0.0, False)  # bf16: too little work
    assert not grouped_pays(torch.randn(1, 4, 8, 16, dtype=torch.float64), key.double(), None, 0.0, False)


@needs_onednn
@pytest.mark.parametrize("heads,width,keys", [(2, 64, 256), (2, 64, 1024), (4, 128, 640), (1, 64, 384)])
def test_row_products_give_a_row_the_same_bits_whatever_the_other_rows(heads, width, keys):
    """What makes a position's attention independent of how many queries share the call (scores
    and mixing products, for every row count a grouped call can hold: G*T up to 7 x 128)."""
    from codespec.core.attention import row_products

    torch.manual_seed(heads * keys)
    rows, key = torch.randn(heads, 900, width), torch.randn(heads, keys, width)
    weights, value = torch.softmax(torch.randn(heads, 900, keys), -1), torch.randn(heads, keys, width)
    scores_all, mixed_all = row_products(rows, key, transposed=True), row_products(weights, value)
    for count in (1, 2, 3, 4, 5, 7, 11, 14, 17, 33, 64, 119, 256, 455):
        assert torch.equal(row_products(rows[:, :count], key, transposed=True), scores_all[:, :count]), count
        assert torch.equal(row_products(weights[:, :count], value), mixed_all[:, :count]), count
    for start in (1, 5, 100):  # and at any offset
        assert torch.equal(
            row_products(rows[:, start : start + 9], key, transposed=True), scores_all[:, start : start + 9]
        )


# -- the in-place cache layer --------------------------------------------------------------------
def test_growing_layer_gives_the_dynamic_layers_logits_bit_for_bit():
    from transformers import DynamicCache

    from codespec.core.cache_layer import GrowingLayer
    from codespec.core.model import KVCache

    model = random_llama((64, 2, 4, 2, 128), vocab_size=97, init_std=0.2)
    generator = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, 97, (300,), generator=generator).tolist()  # past the first capacity
    drafts = [torch.randint(0, 97, (k,), generator=generator).tolist() for k in (1, 5, 33, 300)]

    def run(cache) -> list[torch.Tensor]:
        with torch.inference_mode():
            out = [model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True).logits[0, -1]]
            for draft in drafts:
                out.append(
                    model(
                        input_ids=torch.tensor([draft]), cache=cache, use_cache=True, logits_to_keep=len(draft)
                    ).logits[0]
                )
                cache.crop(-(len(draft) - 1))  # keep one: the cache grows across steps
        return out

    ours = KVCache(model.config)
    assert all(isinstance(layer, GrowingLayer) for layer in ours.hf_cache.layers)
    stock = run(DynamicCache(config=model.config))
    grown = run(ours.hf_cache)
    assert all(torch.equal(a, b) for a, b in zip(stock, grown))
    assert ours.hf_cache.get_seq_length() == 300 + len(drafts)


# -- the engine on a model that takes every new path ---------------------------------------------
@pytest.fixture(scope="module")
def mid_target():
    """512 wide, 8 heads over 2 K/V heads, a 600-token prompt: packed linears and grouped attention
    both serve its verification forwards."""
    from engine_harness import stdlib_corpus

    tokenizer = build_tokenizer(stdlib_corpus(), vocab_size=1024)
    model = random_llama((512, 2, 8, 2, 1024), len(tokenizer), seed=5, init_std=0.1, max_context=2048)
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.delenv("CODESPEC_CPU_LINEAR", raising=False)  # packing is the default (codespec/model.py)
    try:
        return TargetModel(model, tokenizer, name="mid")
    finally:
        monkeypatch.undo()


@pytest.fixture(scope="module")
def mid_case(mid_target):
    generator = torch.Generator().manual_seed(11)
    prompt = torch.randint(0, mid_target.vocab_size, (600,), generator=generator).tolist()
    return prompt, plain_greedy(mid_target, prompt, 40)


def test_the_mid_model_takes_the_new_paths(mid_target, mid_case):
    prompt, _ = mid_case
    if ONEDNN:
        assert mid_target.packed_linears > 0
    query = torch.zeros(1, 8, 17, 64)
    assert grouped_pays(query, torch.zeros(1, 2, len(prompt) + 17, 64), None, 0.0, False)


@pytest.mark.parametrize("kind", ["oracle", "always_wrong", "right_then_wrong"])
@pytest.mark.parametrize("draft_len", [4, 16, 32])
def test_speculative_greedy_equals_plain_through_the_new_kernels(mid_target, mid_case, kind, draft_len):
    prompt, reference = mid_case
    full = [*prompt, *reference]
    script = {
        "oracle": lambda: oracle(full),
        "always_wrong": lambda: always_wrong(full, mid_target.vocab_size),
        "right_then_wrong": lambda: right_then_wrong(full, mid_target.vocab_size, right_steps=2),
    }[kind]()
    assert_greedy_equivalent(mid_target, prompt, ScriptedProposer(kind, script), reference, 40, draft_len)


def test_a_position_gets_the_same_logits_however_it_is_computed(mid_target, mid_case):
    """Row i of a (K+1)-position forward is bit for bit what a one-token forward gives at that
    position, also in the first forward (the prompt with the draft appended) and beside another
    sequence: greedy verification is exact by construction, and exact sampling's acceptance test
    sees the distribution plain decoding would."""
    prompt, reference = mid_case
    block = list(reference[:17])
    cache = mid_target.new_cache()
    mid_target.forward(prompt, cache)
    single = [mid_target.forward([token], cache)[0] for token in block]  # plain decoding's rows
    cache.rollback(len(prompt))
    verified = mid_target.forward(block, cache, keep_last=len(block))  # [17, V]
    assert all(torch.equal(verified[i], single[i]) for i in range(len(block)))
    cache.rollback(len(prompt))
    for chunk in (block[:5], block[5:6], block[6:]):  # drafts of other lengths
        rows = mid_target.forward(chunk, cache, keep_last=len(chunk))
        start = len(cache) - len(prompt) - len(chunk)
        assert all(torch.equal(rows[i], single[start + i]) for i in range(len(chunk)))
    first = mid_target.forward([*prompt, *block], mid_target.new_cache(), keep_last=len(block) + 1)
    assert all(torch.equal(first[i + 1], single[i]) for i in range(len(block) - 1))
    other = mid_target.new_cache()
    mid_target.forward(prompt[:200], other)
    cache.rollback(len(prompt))
    together = mid_target.forward_many([block, block[:3]], [cache, other], [len(block), 3])[0]
    assert all(torch.equal(together[i], single[i]) for i in range(len(block)))


def test_blocks_never_mix_rows_of_two_bucket_widths():
    draft = list(range(251, 268))  # 250 cached + 17: rows see 251..267 keys, across 256
    assert block_runs(draft, 128) == [(0, 6, 256), (6, 17, 267)]
    assert block_runs(list(range(1, 301)), 128) == [(0, 128, 128), (128, 256, 256), (256, 300, 300)]
    assert block_runs([600] * 10, 4) == [(0, 4, 600), (4, 8, 600), (8, 10, 600)]  # at most 4 a block


@pytest.fixture(scope="module")
def mha_target():
    """One query head per K/V head (deepseek-coder's layout): no groups, the grouped path all the same."""
    from engine_harness import stdlib_corpus

    tokenizer = build_tokenizer(stdlib_corpus(), vocab_size=1024)
    model = random_llama((256, 2, 4, 4, 512), len(tokenizer), seed=7, init_std=0.1, max_context=2048)
    return TargetModel(model, tokenizer, name="mha")


@pytest.mark.parametrize("cached", [630, 250])
@pytest.mark.parametrize("which", ["mid_target", "mha_target"])
def test_a_position_gets_the_same_logits_across_a_key_bucket_boundary(request, which, cached):
    """A draft whose rows straddle a key bucket (630 + 17 crosses 640; the products run over the keys
    rounded up to whole buckets): its early rows see a wider product than decoded alone, and a prefill
    that starts at an unaligned cached prefix sees another; every row keeps plain decoding's bits,
    with query groups and without."""
    target = request.getfixturevalue(which)
    generator = torch.Generator().manual_seed(cached)
    tokens = torch.randint(0, target.vocab_size, (cached + 17,), generator=generator).tolist()
    prompt, block = tokens[:cached], tokens[cached:]
    cache = target.new_cache()
    target.forward(prompt, cache)
    single = [target.forward([token], cache)[0] for token in block]  # plain decoding's rows
    cache.rollback(cached)
    verified = target.forward(block, cache, keep_last=len(block))
    assert all(torch.equal(verified[i], single[i]) for i in range(len(block)))
    split = target.new_cache()
    target.forward(prompt[: cached - 77], split)  # a cached prefix that ends inside a bucket
    rows = target.forward([*prompt[cached - 77 :], *block], split, keep_last=len(block) + 1)
    assert all(torch.equal(rows[i + 1], single[i]) for i in range(len(block)))


# -- bounded kernel shapes and released dense weights --------------------------------------------
def test_long_inputs_run_in_a_bounded_set_of_row_counts():
    from codespec.core.linear import BLOCK_ROWS, EXACT_ROWS, PAD_ROWS, row_blocks

    shapes = {padded for count in range(1, 3000) for _, _, padded in row_blocks(count)}
    assert len(shapes) <= EXACT_ROWS + BLOCK_ROWS // PAD_ROWS  # whatever the prompt lengths
    for count in (1, 64, 65, 300, 513, 2999):
        blocks = row_blocks(count)
        assert sum(size for _, size, _ in blocks) == count and blocks[0][0] == 0
        assert all(padded >= size for _, size, padded in blocks)


@needs_onednn
@pytest.mark.parametrize("rows", [1, 17, 64, 65, 300, 513])
def test_blocked_products_equal_pytorchs(rows):
    model = torch.nn.Linear(896, 1536)
    pack_linears(model)
    x = torch.randn(rows, 896)
    with torch.no_grad():
        expected = F.linear(x, model.weight, model.bias)
    with torch.inference_mode():
        torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-4)


@needs_onednn
def test_released_dense_weights_live_only_packed_and_come_back_where_needed(tmp_path, monkeypatch):
    import pickle

    from transformers import PreTrainedTokenizerFast

    from bench.shapes import SPECIAL_TOKENS, byte_level_bpe

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=byte_level_bpe(["def f(x):\n    return x\n"] * 50, 300, SPECIAL_TOKENS),
        eos_token=SPECIAL_TOKENS[0],
    )
    model = random_llama((1024, 1, 8, 2, 2048), len(tokenizer), seed=2, init_std=0.1)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    ids = list(range(5, 60))
    monkeypatch.setenv("CODESPEC_CPU_LINEAR", "stock")
    stock = TargetModel.load(str(tmp_path), device="cpu")
    assert stock.packed_linears == 0
    reference = stock.forward(ids, stock.new_cache(), keep_last=5)
    monkeypatch.delenv("CODESPEC_CPU_LINEAR")  # packed by default
    packed = TargetModel.load(str(tmp_path), device="cpu")
    assert packed.packed_linears > 0 and packed.parameter_count == stock.parameter_count
    big = packed.model.model.layers[0].mlp.up_proj  # 2048 x 1024 elements: released
    assert big.weight.numel() == 0 and packed.vocab_size == stock.vocab_size
    torch.testing.assert_close(packed.forward(ids, packed.new_cache(), keep_last=5), reference, rtol=1e-4, atol=1e-4)
    with stock_linears(packed.model):  # transformers' own linear: the dense weight is rebuilt for the while
        assert big.weight.shape == (2048, 1024)
        with torch.inference_mode():
            torch.testing.assert_close(
                packed.model(torch.tensor([ids])).logits[0, -5:], reference, rtol=1e-4, atol=1e-4
            )
    assert big.weight.numel() == 0
    twin = copy.deepcopy(big)
    rows = torch.randn(3, 1024)
    with torch.inference_mode():
        torch.testing.assert_close(twin(rows), big(rows))
    with pytest.raises(TypeError, match="released"):
        pickle.dumps(big)
