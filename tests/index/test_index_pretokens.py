"""The pre-token cache (index/pretokens.py) must encode exactly like the tokenizer itself."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from codespec.index.pretokens import PretokenCache
from codespec.index.tokens import TokenizerAdapter

# Fragments that stress GPT-2's pre-tokenizer: whitespace of every ASCII kind (including the
# \x1c-\x1f separators that str.isspace counts and Unicode White_Space does not), runs before
# words and at the end, contractions in both cases, digits, punctuation runs, CRLF, a special token,
# and non-ASCII text (stretches around it are encoded by the tokenizer whole).
FRAGMENTS = [
    "a",
    "bc",
    "Def",
    " ",
    "  ",
    "    ",
    "\n",
    "\n    ",
    "\t",
    "\r\n",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x1f",
    "x1",
    "42",
    "(",
    "):",
    ".",
    "'s",
    "'S",
    "'ll",
    "'",
    "''",
    "don",
    "#",
    "+=",
    "\\",
    '"""',
    "é",
    "中文",
    "\u3000",
    "\xa0",
    "\x85",
    "\u2028",
    "ü ",
    " 😀",
    "<|fim_prefix|>",
    "\x00",
    "~",
    "`",
]
texts = st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join)


def backend_ids(adapter: TokenizerAdapter, text: str) -> list[int]:
    return adapter._backend.encode(text, add_special_tokens=False).ids


@settings(max_examples=300, deadline=None)
@given(batch=st.lists(texts, min_size=1, max_size=6))
def test_cache_encodes_like_the_tokenizer(index_adapter, batch):
    assert index_adapter.pretokens is not None
    for text, ids in zip(batch, index_adapter.encode_batch(batch)):
        assert ids.tolist() == backend_ids(index_adapter, text), repr(text)


def test_cache_matches_on_real_source_with_the_default_tokenizer():
    from transformers import AutoTokenizer

    from codespec.core.default_model import target_path

    adapter = TokenizerAdapter(AutoTokenizer.from_pretrained(target_path()))
    assert adapter.pretokens is not None
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(stdlib.glob("*.py"))[:60] + [stdlib / "pydoc_data" / "topics.py", stdlib / "tokenize.py"]
    sources = [p.read_text(encoding="utf-8", errors="replace") for p in paths]
    assert sum(not s.isascii() for s in sources) >= 2
    for text, ids in zip(sources, adapter.encode_batch(sources)):
        assert ids.dtype == adapter.dtype
        assert ids.tolist() == backend_ids(adapter, text)
    assert len(adapter.pretokens.pieces) > 1000


def test_a_full_cache_is_emptied_and_stays_exact(index_adapter):
    cache = PretokenCache(index_adapter._backend_ids, [], index_adapter.dtype, max_entries=5)
    batch = ["alpha beta gamma\n", "delta epsilon  zeta\n\n", "alpha zeta 12 'll\n"]
    for _ in range(2):
        for text, ids in zip(batch, cache.encode_batch(batch, lambda _: [])):
            assert ids.tolist() == backend_ids(index_adapter, text)
    assert len(cache.pieces) <= 5 + 12


def test_other_tokenizer_configurations_do_not_use_the_cache(index_tokenizer):
    import copy

    from tokenizers import normalizers, pre_tokenizers

    lowered = copy.deepcopy(index_tokenizer)
    lowered.backend_tokenizer.normalizer = normalizers.Lowercase()
    assert TokenizerAdapter(lowered).pretokens is None
    prefixed = copy.deepcopy(index_tokenizer)
    prefixed.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    adapter = TokenizerAdapter(prefixed)
    assert adapter.pretokens is None
    text = "x = 1\n"
    assert adapter.encode_batch([text])[0].tolist() == backend_ids(adapter, text)
    assert isinstance(adapter.encode_batch([text])[0], np.ndarray)
