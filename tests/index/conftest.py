"""Fixtures for the index tests: one small real byte-level BPE, trained once on stdlib source."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

STDLIB = Path(sysconfig.get_paths()["stdlib"])
TRAINING_FILES = ["json/encoder.py", "json/decoder.py", "textwrap.py", "shlex.py"]


@pytest.fixture(scope="session")
def index_tokenizer():
    from bench.shapes import build_tokenizer

    corpus = [(STDLIB / name).read_text(encoding="utf-8") for name in TRAINING_FILES]
    return build_tokenizer(corpus, vocab_size=512)


@pytest.fixture(scope="session")
def index_adapter(index_tokenizer):
    from codespec.index.tokens import TokenizerAdapter

    return TokenizerAdapter(index_tokenizer)
