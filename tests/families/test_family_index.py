"""The workspace index and `codespec simulate` with the families' tokenizers, above all Qwen's
151,936 ids: ids past 16 bits (and ids whose trie character ``chr(id + 1)`` is a UTF-16 surrogate)
stored, persisted and looked up exactly; the pre-token fast path refused for Qwen2's regex, and the
path taken reported (``TokenizerAdapter.encoding``, a ``codespec.index`` log line, simulate's stderr)."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import random

import numpy as np
import pytest
from family_layouts import STDLIB

import codespec.index.tokens as index_tokens
from codespec.index import WorkspaceIndex
from codespec.index.pretokens import PretokenCache
from codespec.index.tokens import PRETOKEN_CACHE, TOKENIZER, TokenizerAdapter

DOCUMENTS = ["json/scanner.py", "json/tool.py", "textwrap.py", "shlex.py", "glob.py", "fnmatch.py"]
SURROGATE_IDS = range(0xD800 - 1, 0xE000 - 1)  # chr(id + 1) is a lone surrogate


@pytest.fixture(scope="module")
def qwen(family_checkpoints, loaded):
    return loaded(family_checkpoints("qwen2.5-coder").target).tokenizer


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    return {(STDLIB / name).as_uri(): (STDLIB / name).read_text(encoding="utf-8") for name in DOCUMENTS}


def brute_force(sequences: list[list[int]], context: list[int], max_ngram: int, min_ngram: int) -> int:
    best = 0
    for tokens in sequences:
        array = np.asarray(tokens, dtype=np.int64)
        for n in range(1, min(max_ngram, len(context)) + 1):
            window = np.lib.stride_tricks.sliding_window_view(array[:-1], n)  # each continuation needs a token
            if not (window == np.asarray(context[-n:])).all(axis=1).any():
                break
            best = max(best, n)
    return best if best >= min_ngram else 0


def test_a_wide_vocabulary_stores_ids_past_16_bits(qwen, sources):
    adapter = TokenizerAdapter(qwen)
    assert adapter.vocab_size == 151_936 and len(qwen) == 151_936
    assert adapter.dtype == np.int32 and adapter.sep == 2**31 - 1
    ids = np.concatenate(adapter.encode_batch(list(sources.values())))
    assert ids.dtype == np.int32
    assert (ids > 65_535).mean() > 0.3, "most real code tokens live above 16 bits in this vocabulary"
    assert np.isin(ids, np.arange(SURROGATE_IDS.start, SURROGATE_IDS.stop)).any()
    assert adapter.byte_lengths is not None  # byte-level: token starts by a cumulative sum
    text = next(iter(sources.values()))
    first = adapter.encode_array(text)
    offsets = [start for start, _ in adapter.encode_with_offsets(text)[1]]
    assert adapter.char_starts(text, first).tolist() == offsets


def test_the_pre_token_cache_is_refused_for_qwen2s_regex_and_the_path_is_said(qwen, caplog, monkeypatch):
    monkeypatch.setattr(index_tokens, "_REPORTED", set())
    with caplog.at_level(logging.INFO, logger="codespec.index"):
        adapter = TokenizerAdapter(qwen)
    assert adapter.pretokens is None and adapter.encoding == TOKENIZER
    assert "Qwen2's regex" in adapter.encoding_reason and "NFC" in adapter.encoding_reason
    assert any(
        "bulk encoding through the tokenizer's batch encode" in r.getMessage()
        and "int32 token arrays" in r.getMessage()
        for r in caplog.records
    )
    texts = ["def f(x):\n    return x.y(1)\n", "import os.path\n\nx=[];\n", "a = 'é中文'  # 12345\r\n"]
    for text, ids in zip(texts, adapter.encode_batch(texts)):
        assert ids.tolist() == qwen.encode(text, add_special_tokens=False)


def test_the_probe_check_alone_rejects_qwen2s_splits(qwen, monkeypatch):
    """Were its configuration taken for GPT-2's, the cache's own probe texts would still refuse it."""
    adapter = TokenizerAdapter(qwen)
    cache = PretokenCache(adapter._backend_ids, [], adapter.dtype, ("<|endoftext|>", 151_643))
    assert not cache.verify()
    monkeypatch.setattr(index_tokens, "pretoken_cache_mismatch", lambda backend: None)
    fooled = TokenizerAdapter(qwen)
    assert fooled.pretokens is None and fooled.encoding == TOKENIZER
    assert "disagrees with the tokenizer's own encode on probe texts" in fooled.encoding_reason


@pytest.mark.parametrize("name, path", [("starcoder2", PRETOKEN_CACHE), ("deepseek-coder", TOKENIZER)])
def test_the_other_families_take_the_path_their_tokenizer_allows(family_checkpoints, loaded, sources, name, path):
    """StarCoder2's tokenizer, as transformers 5 loads it (GPT2Tokenizer rebuilds a plain ByteLevel
    pipeline), is GPT-2's configuration and passes the probes; DeepSeek's Split sequence is not."""
    tokenizer = loaded(family_checkpoints(name).target).tokenizer
    adapter = TokenizerAdapter(tokenizer)
    assert adapter.encoding == path and adapter.dtype == np.uint16, adapter.encoding_reason
    texts = list(sources.values())
    for text, ids in zip(texts, adapter.encode_batch(texts)):
        assert ids.tolist() == tokenizer.encode(text, add_special_tokens=False)


# Fragments that stress the families' pre-tokenizers: punctuation before line breaks (one Qwen2
# pre-token: ">\n\n"), letters after punctuation, digits, whitespace of every kind, NFC-composable
# pairs, text outside every DeepSeek pattern next to a space, added tokens and pieces of them.
EDIT_FRAGMENTS = [
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
    "=",
    "=\n",
    "(",
    "):",
    ").",
    ".x",
    "'s",
    "'S",
    "'ll",
    "'",
    "x1",
    "42",
    "7",
    "#",
    "+=",
    "\\",
    '"""',
    "é",
    "e\u0301",
    "\u0301",
    "中文",
    "\u3000",
    "\xa0",
    "\x1c",
    "\x85",
    " 😀",
    "😀 \t",
    "<|fim_prefix|>",
    "<|endoftext|>",
    "<|f",
    "ix|>",
    "\n\n",
    ";\n",
    "{\n",
    "}\n\n",
    "]\r\n",
    ">",
]


@pytest.mark.parametrize(
    "name, rule", [("qwen2.5-coder", "letters-digits"), ("deepseek-coder", "line-breaks"), ("starcoder2", "gpt2")]
)
def test_incremental_retokenization_equals_a_full_encode(family_checkpoints, loaded, name, rule):
    """Random edit sequences: splicing a re-encoded window gives exactly a full encode's tokens and
    starts. Before the split anchors were per pre-tokenizer, Qwen2's regex failed here (">" then
    "\n\n" re-encoded apart, where the full encode has the one token ">\n\n")."""
    from codespec.index.retokenize import full_encode, splice

    adapter = TokenizerAdapter(loaded(family_checkpoints(name).target).tokenizer)
    assert adapter.split_rule == rule
    rng = random.Random(0)
    for _ in range(120):
        text = "".join(rng.choice(EDIT_FRAGMENTS) for _ in range(rng.randrange(0, 40)))
        ids, starts = full_encode(adapter, text)
        for _ in range(5):
            start = rng.randrange(0, len(text) + 1)
            end = rng.randrange(start, min(len(text), start + 6) + 1)
            inserted = "".join(rng.choice(EDIT_FRAGMENTS) for _ in range(rng.randrange(0, 4)))
            spliced = splice(adapter, text, ids, starts, start, end, inserted)
            text, ids, starts = spliced.text, spliced.token_ids, spliced.starts
            want_ids, want_starts = full_encode(adapter, text)
            assert ids.tolist() == want_ids.tolist() and starts.tolist() == want_starts.tolist(), (text, start, end)


def test_lookups_persistence_and_edits_with_ids_past_16_bits(qwen, sources, tmp_path):
    root = tmp_path / "workspace"
    root.mkdir()
    for uri, text in sources.items():
        (root / uri.rsplit("/", 1)[-1]).write_text(text, encoding="utf-8")
    db = tmp_path / "index.db"
    index = WorkspaceIndex(qwen, db_path=db)
    assert index.index_workspace([root]).tokenized == len(sources)
    uris = index.documents()
    first = uris[0]
    index.update_document(first, 0, 0, "# edited: ünïcode → 中文\n", 2)  # an incremental re-tokenization
    history = "return self._x.attr(value) + 123456\n"
    index.add_history("accepted", history, first)
    index.check_integrity(deep=True)
    for uri in uris:
        assert list(index.document_tokens(uri)) == qwen.encode(index.document_text(uri), add_special_tokens=False)
    sequences = [list(index.document_tokens(u)) for u in uris] + [qwen.encode(history, add_special_tokens=False)]

    rng = random.Random(0)
    contexts = []
    while len(contexts) < 40:  # contexts from the documents (hits), half of them ending in a surrogate-range id
        tokens = list(index.document_tokens(rng.choice(uris)))
        wanted = len(contexts) % 2 == 0
        ends = [i for i in range(8, len(tokens) - 1) if (tokens[i - 1] in SURROGATE_IDS) == wanted]
        end = rng.choice(ends)
        contexts.append(tokens[end - 8 : end])
    contexts.append([151_000, 70_000, 65_536, 65_535])  # no match anywhere
    before = []
    for context in contexts:
        found = index.lookup(context, 16)
        length = found[0].match_len if found else 0
        assert length == brute_force(sequences, context, index.max_ngram, index.min_ngram), context
        before.append([(c.source, c.token_ids) for c in found])
    continuations = [t for row in before for _, ids in row for t in ids]
    assert max(continuations) > 65_535 and max(continuations) < 151_936
    index.close()

    reopened = WorkspaceIndex(qwen, db_path=db)  # a restart: the stored tokens and table are reused
    report = reopened.index_workspace([root])
    assert report.reused >= len(sources) - 1 and report.tokenized + report.reused == len(sources)  # stored tokens
    reopened.update_document(first, 0, 0, "# edited: ünïcode → 中文\n", 2)
    reopened.check_integrity(deep=True)
    assert reopened.history_entries("accepted")[-1].token_ids == tuple(sequences[-1])
    for context, row in zip(contexts, before):
        assert [(c.source, c.token_ids) for c in reopened.lookup(context, 16)] == row, context
    reopened.close()


def test_simulate_with_the_wide_tokenizer_renders_its_format_and_says_the_path(
    family_checkpoints, qwen, sources, tmp_path
):
    from codespec.commands.cli import main

    family = family_checkpoints("qwen2.5-coder")
    text = sources[next(iter(sources))]
    before = text[:1200]
    after = before.replace("def ", "def  ", 2)
    cut = text.index("\n", 2000) + 1
    workload = tmp_path / "work.jsonl"
    workload.write_text(
        json.dumps({"id": "e1", "instruction": "spacing", "before": before, "after": after})
        + "\n"
        + json.dumps(
            {
                "id": "c1",
                "path": "copy.py",
                "prefix": text[2000 - 600 : cut],
                "suffix": "",
                "target": text[cut : cut + 300],
            }
        )
        + "\n"
    )
    workspace = tmp_path / "workspace.jsonl"
    workspace.write_text(json.dumps({"path": "file:///ws/copy.py", "text": text}) + "\n")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(
            [
                "simulate",
                "--workload",
                str(workload),
                "--workspace",
                str(workspace),
                "--tokenizer",
                str(family.target),
                "--proposer",
                "index",
                "--proposer",
                "reference",
                "--json",
                str(tmp_path / "report.json"),
            ]
        )
    assert code == 0
    assert "bulk encoding: tokenizer" in err.getvalue() and "Qwen2's regex" in err.getvalue()
    assert "int32 token arrays" in err.getvalue()
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["records"] == 2
    assert report["proposers"]["index"]["coverage"] > 0.3 and report["proposers"]["reference"]["coverage"] > 0.3

    from bench.sim_run import case_prompt, prompt_renderer
    from bench.sim_workload import load_cases

    edit = load_cases(workload)[0]
    rendered = case_prompt(edit, prompt_renderer(qwen))
    assert rendered.startswith("<|file_sep|>original.py\n") and rendered.endswith("<|file_sep|>edited.py\n")
