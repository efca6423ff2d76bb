"""Fixtures for the proposer tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models on shared cores: one intra-op thread is several times faster than two (and a
    server test elsewhere in the run may have raised the count)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
