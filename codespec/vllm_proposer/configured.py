"""Configured codespec proposers: ``CodespecProposer_<hex>`` classes made on first access from the
options their name carries (``vllm_proposer.options``, which explains why)."""

from __future__ import annotations

from codespec.vllm_proposer.options import DrafterOptions
from codespec.vllm_proposer.proposer import CodespecProposer

_made: dict[str, type[CodespecProposer]] = {}


def __getattr__(name: str) -> type[CodespecProposer]:
    if name not in _made:
        options = DrafterOptions.from_class_name(name)  # AttributeError for any other name
        _made[name] = type(name, (CodespecProposer,), {"options": options, "__module__": __name__})
    return _made[name]
