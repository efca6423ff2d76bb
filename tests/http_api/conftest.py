"""The HTTP door's servers: the tiny random model where only the plumbing matters, the shipped
default model where the real copying behaviour matters (one per test module)."""

from __future__ import annotations

import pytest
from hosted import Hosted

from codespec.service.engine.service import EngineService


@pytest.fixture(scope="module")
def one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as the server runs (service.runtime): small forwards on loaded cores
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(server_target, one_thread):
    service = EngineService(server_target, proposer="auto", max_draft=8)
    hosted = Hosted(service)
    yield hosted
    hosted.close()
    service.close()


@pytest.fixture(scope="module")
def shipped(one_thread):
    from codespec.core.default_model import target_path
    from codespec.core.model import TargetModel

    service = EngineService(TargetModel.load(str(target_path()), device="cpu"), proposer="auto", max_draft=32)
    hosted = Hosted(service)
    yield hosted
    hosted.close()
    service.close()
