"""proposers.assembly: the one place proposers are put together (server, bench, simulate, CLI)."""

from __future__ import annotations

import logging

import pytest

from codespec.core.draft import NoDraft
from codespec.core.errors import CodespecError
from codespec.proposers.assembly import ProposerAssembly, recorded_request
from codespec.proposers.setup import RequestContext


def test_model_proposers_serve_one_request_at_a_time(tiny_target):
    assembly = ProposerAssembly(tiny_target, shipped_draft=False)
    first = assembly.create("early-exit", RequestContext())
    assert first.name == "early-exit" and first in assembly.models()
    second = assembly.create("early-exit", RequestContext())  # the shared one is busy: a fresh one
    assert second is not first
    auto = assembly.create("auto", RequestContext())
    assert [sub.kind for sub in auto.subs] == ["lookup"]  # the long-lived models are still taken
    assembly.release(first)
    again = assembly.create("auto", RequestContext())
    assert [sub.proposer for sub in again.subs if sub.kind != "lookup"] == [first]
    assert assembly.create("early-exit", RequestContext()) is not first  # auto holds them now
    assembly.release(again)
    assert assembly.create("early-exit", RequestContext()) is first


def test_models_the_assembly_was_not_asked_for_are_not_built(tiny_target):
    assembly = ProposerAssembly(tiny_target, shipped_draft=False, models=())
    assert assembly.models() == []
    with pytest.raises(CodespecError, match="unavailable for this target"):
        assembly.create("early-exit", RequestContext())


def test_the_fallback_chain_degrades_and_says_so_once(tiny_target, caplog):
    assembly = ProposerAssembly(tiny_target, shipped_draft=False)
    with caplog.at_level(logging.WARNING, logger="codespec.proposers.assembly"):
        for _ in range(2):
            proposer = assembly.create_with_fallback(["reference", "context"], RequestContext())
            assert proposer.name == "context"  # the reference proposer needs a reference text
    assert sum("'reference' unavailable" in record.getMessage() for record in caplog.records) == 1
    assert isinstance(assembly.create_with_fallback(["no-such"], RequestContext()), NoDraft)


def test_a_recorded_request_gets_what_the_server_would_give_it():
    edit = recorded_request("auto", True, "x = 1\n", 2, "a.py", 4, None)
    assert (edit.reference, edit.reference_start, edit.uri, edit.cursor) == ("x = 1\n", 2, "a.py", 4)
    completion = recorded_request("auto", False, "def f():\n", 3, "a.py", 4, None)
    assert completion.reference is None and completion.reference_start == 0
    assert recorded_request("reference", False, "def f():\n", 3).reference == "def f():\n"
