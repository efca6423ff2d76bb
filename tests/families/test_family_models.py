"""What the families' architectures ask of the engine: early exit through each family's final norm
and (tied) head, qkv bias, the draft model's vocabulary check, and KV caches of sliding-window
layers that roll back exactly (codespec/model.py KVCache keeps every position for them)."""

from __future__ import annotations

import pytest
import torch
from family_layouts import ALL_FAMILIES, corpus, deepseek_config

from codespec.core.draft import ProposeContext
from codespec.core.errors import CodespecError
from codespec.core.model import TargetModel
from codespec.proposers.draft_model import DraftModelProposer, check_vocab_compatible
from codespec.proposers.early_exit import EarlyExitProposer
from codespec.proposers.registry import ProposerSetup, create_proposer


def prompt_ids(target, chars: int = 500) -> list[int]:
    return target.encode(corpus()[2][3000 : 3000 + chars])


@pytest.mark.parametrize("name", ["qwen2.5-coder", "starcoder2"])
def test_tied_heads_stay_tied_and_biases_load(family_checkpoints, loaded, name):
    target = loaded(family_checkpoints(name).target)
    model = target.model
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    attention = model.model.layers[0].self_attn
    for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
        assert projection.bias is not None and projection.bias.abs().sum() > 0  # qkv bias, random


def exit_chain(target, sequence: list[int], exit_layer: int, steps: int) -> list[int]:
    """Greedy early-exit tokens computed by hand: hidden state after layer E, the final norm, then
    the embedding matrix itself when the head is tied to it (else the head module: a loaded model's
    untied head may hold its weight only packed, codespec/linear.py)."""
    model = target.model
    embedding = model.model.embed_tokens.weight  # [V, H]
    tied = model.config.tie_word_embeddings
    tokens = []
    with torch.inference_mode():
        for _ in range(steps):
            hidden = model(input_ids=torch.tensor([sequence + tokens]), output_hidden_states=True).hidden_states
            normed = model.model.norm(hidden[exit_layer][0, -1])  # [H]
            logits = normed @ embedding.T if tied else model.lm_head(normed)  # [V]
            tokens.append(int(logits.argmax()))
    return tokens


@pytest.mark.parametrize("name", ALL_FAMILIES)
def test_early_exit_drafts_through_the_family_norm_and_head(family_checkpoints, loaded, name):
    family = family_checkpoints(name)
    target = loaded(family.target)
    layers = target.model.model.layers
    for exit_layer in (1, family.layers - 1):
        proposer = EarlyExitProposer(target, exit_layer=exit_layer, min_confidence=0.0)
        sequence = prompt_ids(target)
        proposer.begin(sequence)
        draft = proposer.propose(ProposeContext(sequence, len(sequence), 4))
        assert list(draft.token_ids) == exit_chain(target, sequence, exit_layer, 4)
        assert target.model.model.layers is layers and len(layers) == family.layers  # restored


def test_the_default_exit_layer_and_auto_see_every_family(family_checkpoints, loaded):
    from codespec.proposers.models import supports_early_exit

    for name in ALL_FAMILIES:
        target = loaded(family_checkpoints(name).target)
        assert supports_early_exit(target)
        assert create_proposer("early-exit", ProposerSetup.from_options(target, {})).exit_layer == 1


@pytest.mark.parametrize("name", ALL_FAMILIES)
def test_each_family_draft_passes_the_vocabulary_check(family_checkpoints, loaded, name):
    family = family_checkpoints(name)
    target = loaded(family.target)
    proposer = create_proposer("draft", ProposerSetup.from_options(target, {"draft_model": str(family.draft)}))
    assert isinstance(proposer, DraftModelProposer) and proposer.vocab_size == target.vocab_size
    draft_rows = proposer.input_vocab_size
    assert draft_rows >= len(target.tokenizer)
    if draft_rows < target.vocab_size:  # deepseek: 32,022 draft rows, 32,256 target rows
        sequence = prompt_ids(target)
        proposer.begin(sequence)
        drafted = proposer.propose(ProposeContext(sequence, len(sequence), 4))
        assert drafted.token_ids and max(drafted.token_ids) < draft_rows  # padded ids are never drafted
        assert not proposer.propose(ProposeContext([*sequence, draft_rows + 5], len(sequence), 4)).token_ids


def test_a_draft_of_another_family_or_too_narrow_is_refused(family_checkpoints, loaded):
    qwen = loaded(family_checkpoints("qwen2.5-coder").target)
    starcoder = loaded(family_checkpoints("starcoder2").draft)
    with pytest.raises(CodespecError, match="does not share the target's tokenizer"):
        check_vocab_compatible(qwen, starcoder)
    deepseek = loaded(family_checkpoints("deepseek-coder").target)
    from transformers import AutoModelForCausalLM

    narrow = TargetModel(
        AutoModelForCausalLM.from_config(deepseek_config(1, rows=32_000)), deepseek.tokenizer, "narrow"
    )
    with pytest.raises(CodespecError, match="embeds only 32000 token ids"):
        check_vocab_compatible(deepseek, narrow)


@pytest.mark.parametrize("name", ["qwen2.5-coder-sliding", "starcoder2"])
def test_sliding_window_caches_roll_back_exactly(family_checkpoints, loaded, name):
    """A window of 24 (Qwen2, layers past the first) or 40 (Starcoder2) tokens, prompts past it:
    rolling back (past the window, and to a short prefix) leaves what a fresh prefill gives, and
    decoding through the cache matches transformers' own sliding-window cache."""
    from transformers import DynamicCache

    target = loaded(family_checkpoints(name).target)
    window = target.model.config.sliding_window
    sequence = prompt_ids(target, 900)
    assert len(sequence) > 2 * window + 12
    cache = target.new_cache()
    assert not any(layer.is_sliding for layer in cache.hf_cache.layers)  # every position kept
    target.forward(sequence[: 2 * window], cache)
    target.forward(sequence[2 * window : 2 * window + 8], cache, keep_last=8)  # a verification forward
    for keep in (2 * window + 3, 10):
        cache.rollback(keep)
        got = target.forward(sequence[keep : keep + 6], cache, keep_last=6)
        fresh = target.forward(sequence[: keep + 6], target.new_cache(), keep_last=6)
        torch.testing.assert_close(got, fresh, atol=1e-5, rtol=0)
        cache.rollback(keep + 6)
    stock = DynamicCache(config=target.model.config)  # transformers' own, sliding layers and all
    assert any(layer.is_sliding for layer in stock.layers)
    with torch.inference_mode():
        ours = target.new_cache()
        for start in range(0, len(sequence), 16):  # chunked, past the window several times over
            chunk = sequence[start : start + 16]
            mine = target.forward(chunk, ours, keep_last=len(chunk))
            theirs = target.model(input_ids=torch.tensor([chunk]), cache=stock, use_cache=True).logits[0].float()
            torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=0)
