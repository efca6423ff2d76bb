"""Fixtures for the language server tests: one tiny random model for the whole session.

Random weights are fine here: the servers must deliver exactly what the engine produces, whatever
the model says. A 2k-token context leaves room for the default prompt windows.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

STDLIB = Path(sysconfig.get_paths()["stdlib"])
LSP_CORPUS = ["json/encoder.py", "textwrap.py", "shlex.py"]


@pytest.fixture(scope="session")
def lsp_model_dir(tmp_path_factory) -> Path:
    from bench.shapes import save_random_model

    corpus = [(STDLIB / name).read_text(encoding="utf-8") for name in LSP_CORPUS]
    directory = tmp_path_factory.mktemp("lsp-tiny-llama")
    return save_random_model(
        directory, corpus, shape=(64, 2, 4, 2, 128), vocab_size=384, seed=3, init_std=0.25, max_context=2048
    )


@pytest.fixture(scope="session")
def lsp_target(lsp_model_dir):
    from codespec.model import TargetModel

    return TargetModel.load(str(lsp_model_dir), device="cpu")
