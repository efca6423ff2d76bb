"""Session fixtures: each family's checkpoints saved once (family_layouts.py), loaded the product's way.

``family_checkpoints(name)`` writes a family's target and draft directories the first time it is
asked for; ``loaded(path)`` is ``TargetModel.load`` of a saved directory, once per session, for the
tests that drive the engine directly (the CLI and server tests load through the product).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from family_layouts import Family, build_family


@pytest.fixture(scope="session")
def family_checkpoints(tmp_path_factory):
    built: dict[str, Family] = {}

    def get(name: str) -> Family:
        if name not in built:
            built[name] = build_family(name, tmp_path_factory.mktemp(name))
        return built[name]

    return get


@pytest.fixture(scope="session")
def loaded():
    from codespec.core.model import TargetModel

    models: dict[str, TargetModel] = {}
    load = TargetModel.load  # the real one, even while a test stands in for it

    def get(path: Path) -> TargetModel:
        if str(path) not in models:
            models[str(path)] = load(str(path), device="cpu")
        return models[str(path)]

    return get


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models on shared cores: one intra-op thread (a server test may have raised the count)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
