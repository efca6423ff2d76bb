"""Shared fixtures: tiny random-initialised Llama models with real tokenizers, built on the fly.

Random weights are right for engine correctness: losslessness must hold for any target. A large
init scale keeps logits well separated, so argmax near-ties (where a batched K+1 forward and a
single-token forward may round differently) are rare; equivalence tests still report the gap.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest
import torch
from engine_harness import stdlib_corpus

# Tiny models gain nothing from threads, and on a shared 2-core machine spin-waiting threads cost
# a lot: one thread keeps the suite's run time stable.
torch.set_num_threads(1)

STDLIB = Path(sysconfig.get_paths()["stdlib"])
SERVER_CORPUS = ["json/encoder.py", "textwrap.py", "shlex.py"]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from bench.shapes import save_random_model

    directory = tmp_path_factory.mktemp("tiny-llama")
    return save_random_model(
        directory, stdlib_corpus(), shape=(64, 2, 4, 2, 128), vocab_size=384, seed=1, init_std=0.25, max_context=512
    )


@pytest.fixture(scope="session")
def tiny_target(tiny_model_dir):
    from codespec.model import TargetModel

    return TargetModel.load(str(tiny_model_dir), device="cpu")


@pytest.fixture(scope="session")
def server_model_dir(tmp_path_factory) -> Path:
    """The model behind every door's tests (service, LSP, websocket, HTTP, commands): random weights
    are fine there, the doors must deliver exactly what the engine produces; a 2k-token context
    leaves room for the default prompt windows."""
    from bench.shapes import save_random_model

    corpus = [(STDLIB / name).read_text(encoding="utf-8") for name in SERVER_CORPUS]
    directory = tmp_path_factory.mktemp("server-tiny-llama")
    return save_random_model(
        directory, corpus, shape=(64, 2, 4, 2, 128), vocab_size=384, seed=3, init_std=0.25, max_context=2048
    )


@pytest.fixture(scope="session")
def server_target(server_model_dir):
    from codespec.model import TargetModel

    return TargetModel.load(str(server_model_dir), device="cpu")
