"""codespec's vLLM plug-in (entry point group ``vllm.general_plugins``, which vLLM loads in every
process it starts: the API server, the engine core and each worker, before a proposer is built).

It does one thing: a ``speculative_config`` saved before codespec's packages moved under the
``codespec`` namespace names ``vllm_proposer.proposer.CodespecProposer`` (or a configured
``vllm_proposer.configured.CodespecProposer_<hex>``). No package of that name is installed any
more, so vLLM would fail with a bare "No module named 'vllm_proposer'". The plug-in puts a finder
at the *end* of ``sys.meta_path`` that answers only those names, and only when nothing else
provides them, with an ImportError that names the path to use instead; vLLM shows it in its
"Cannot import module ... for custom proposer" error. Nothing is aliased: a stale configuration
fails loudly at start, never runs under a name that could mean another package.

Importing this module imports nothing else of codespec (it runs in every vLLM process).
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence
from types import ModuleType

OLD_PACKAGE = "vllm_proposer"
NEW_PACKAGE = "codespec.vllm_proposer"


def moved_message(name: str) -> str:
    """What an import of the old package's module ``name`` says: the module to name instead."""
    new = NEW_PACKAGE + name[len(OLD_PACKAGE) :]
    return (
        f"{name!r} is codespec's old module path: codespec's vLLM proposer is now {new!r} (the class: "
        f"{NEW_PACKAGE}.proposer.CodespecProposer). Print a fresh speculative_config with `codespec vllm-config`."
    )


class MovedProposerFinder(importlib.abc.MetaPathFinder):
    """Answers imports of ``vllm_proposer`` and its submodules with an ImportError naming the new path."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None):
        if fullname == OLD_PACKAGE or fullname.startswith(OLD_PACKAGE + "."):
            raise ModuleNotFoundError(moved_message(fullname), name=fullname)
        return None


def register() -> None:
    """vLLM calls this once per process (``load_general_plugins``); calling it again adds nothing."""
    if not any(isinstance(finder, MovedProposerFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedProposerFinder())
