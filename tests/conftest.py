"""Shared fixtures: tiny random-initialised Llama models with real tokenizers, built on the fly.

Random weights are right for engine correctness: losslessness must hold for any target. A large
init scale keeps logits well separated, so argmax near-ties (where a batched K+1 forward and a
single-token forward may round differently) are rare; equivalence tests still report the gap.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import pytest
import torch
from engine_harness import stdlib_corpus

FULL_HINT = "python -m pytest --full"
SLOW = pytest.StashKey[int]()


def pytest_addoption(parser):
    parser.addoption(
        "--full",
        action="store_true",
        help="run the slow tests too (real editors, subprocess servers, statistical exactness); CI does",
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slow: the suite's minutes (real editors, subprocess servers and CLIs, statistical exactness): "
        f"left out of a plain `python -m pytest`, run by `{FULL_HINT}` and by CI",
    )


def pytest_collection_modifyitems(config, items):
    """A plain run leaves the slow tests out (the working loop, a few minutes on two cores);
    ``--full``, CI (CI=true), ``-m`` or naming the tests runs what was asked."""
    asked = config.getoption("--full") or os.environ.get("CI", "").lower() == "true" or config.option.markexpr
    named = any(not str(arg).rstrip("/").endswith("tests") for arg in config.args)
    if asked or named:
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]
        config.hook.pytest_deselected(items=slow)
        config.stash[SLOW] = len(slow)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    left_out = config.stash.get(SLOW, 0)
    if left_out:
        terminalreporter.write_line(f"{left_out} slow tests were left out: `{FULL_HINT}` runs them (CI does)")


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
    from codespec.core.model import TargetModel

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
    from codespec.core.model import TargetModel

    return TargetModel.load(str(server_model_dir), device="cpu")
