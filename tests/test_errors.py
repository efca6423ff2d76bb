"""Bad input gets a clear error, and nothing reaches for the network."""

from __future__ import annotations

import socket

import pytest

from codespec.core.config import GenerationLimits, SamplingParams
from codespec.core.decode import generate_all
from codespec.core.errors import InvalidRequestError, ModelNotFoundError
from codespec.core.model import TargetModel


def test_empty_prompt(tiny_target):
    with pytest.raises(InvalidRequestError, match="empty"):
        generate_all(tiny_target, [])


def test_prompt_longer_than_context(tiny_target):
    with pytest.raises(InvalidRequestError, match="context is 512"):
        generate_all(tiny_target, [5] * 600)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -3}, "top_k"),
    ],
)
def test_invalid_sampling_values(kwargs, message):
    with pytest.raises(InvalidRequestError, match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"stop": ("",)}, "stop"),
        ({"deadline_s": 0}, "deadline"),
        ({"max_draft_len": -1}, "draft length"),
    ],
)
def test_invalid_limits(kwargs, message):
    with pytest.raises(InvalidRequestError, match=message):
        GenerationLimits(**kwargs)


@pytest.fixture
def no_network(monkeypatch):
    attempts = []

    def refuse(self, address, *args, **kwargs):
        attempts.append(address)
        raise OSError("network disabled by test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    return attempts


@pytest.mark.parametrize("name", ["/no/such/model/dir", "someone/not-cached-model-xyz"])
def test_unknown_model_is_a_clear_error_without_network(name, no_network, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="not found") as error:
        TargetModel.load(name)
    assert "never downloads" in str(error.value)
    assert no_network == []


def test_directory_without_config_is_rejected(tmp_path):
    with pytest.raises(ModelNotFoundError, match="config.json"):
        TargetModel.load(str(tmp_path))
