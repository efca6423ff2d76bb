"""`codespec vllm-config` and the options its class names carry."""

import importlib
import json

import pytest

from codespec.commands.cli import main
from codespec.core.errors import CodespecError
from codespec.vllm_proposer.options import CLASS_PATH, DrafterOptions, speculative_config


def load(path: str):
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def test_the_default_config_names_the_plain_class(capsys):
    assert main(["vllm-config"]) == 0
    config = json.loads(capsys.readouterr().out)
    assert config == {"method": "custom_class", "model": CLASS_PATH, "num_speculative_tokens": 16}
    assert load(config["model"]).options == DrafterOptions()


def test_options_travel_in_the_class_name(capsys, tmp_path):
    assert main(["vllm-config", "--k", "8", "--proposer", "context", "--workspace", str(tmp_path)]) == 0
    config = json.loads(capsys.readouterr().out)
    assert config["num_speculative_tokens"] == 8
    # vLLM's check of a custom proposer path: dotted identifiers
    assert all(part.isidentifier() for part in config["model"].split("."))
    proposer_class = load(config["model"])
    assert proposer_class.options == DrafterOptions(proposer="context", workspace=(str(tmp_path.resolve()),))
    assert load(config["model"]) is proposer_class  # made once


def test_bad_options_are_refused():
    with pytest.raises(CodespecError, match="unknown proposer"):
        DrafterOptions(proposer="draft")
    with pytest.raises(CodespecError, match="workspace"):
        DrafterOptions(index="/tmp/index.db")
    with pytest.raises(CodespecError, match=">= 1"):
        speculative_config(DrafterOptions(), 0)
    with pytest.raises(AttributeError):
        load("codespec.vllm_proposer.configured.CodespecProposer_zz")
    with pytest.raises(AttributeError):
        load("codespec.vllm_proposer.configured.Other")
