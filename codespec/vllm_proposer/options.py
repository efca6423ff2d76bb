"""What codespec's proposer inside vLLM is configured with, and how it gets there.

vLLM's ``speculative_config`` forbids fields it does not know, and a custom proposer is named by
a dotted import path only. So the options travel *in the class name*: ``vllm-config`` names
``codespec.vllm_proposer.configured.CodespecProposer_<hex of the options' JSON>``, and that module makes the
class on first access (a module ``__getattr__``). The configuration is then one JSON value that
reaches every vLLM worker, on every node, with nothing else to set (docs/vllm.md, "Configuration").
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from codespec.core.errors import CodespecError

PROPOSERS = ("auto", "context", "reference", "index")  # lookups: vLLM runs the model, codespec no model
CLASS_PATH = "codespec.vllm_proposer.proposer.CodespecProposer"
CONFIGURED_MODULE = "codespec.vllm_proposer.configured"
CONFIGURED_PREFIX = "CodespecProposer_"
DEFAULT_K = 16  # vLLM's most draft tokens per step; auto drafts fewer when they would not pay


@dataclass(frozen=True)
class DrafterOptions:
    proposer: str = "auto"  # which of PROPOSERS drafts each sequence
    workspace: tuple[str, ...] = ()  # folders indexed at start (workspace lookup)
    index: str | None = None  # the codespec index store (SQLite); None: <first folder>/.codespec/index.db
    index_max_tokens: int | None = None  # resident index tokens before the least recently used documents go

    def __post_init__(self) -> None:
        if self.proposer not in PROPOSERS:
            raise CodespecError(f"unknown proposer {self.proposer!r} for vLLM; use one of {', '.join(PROPOSERS)}")
        if self.index is not None and not self.workspace:
            raise CodespecError("an index store needs the workspace folders it holds (--workspace DIR)")
        if self.index_max_tokens is not None and self.index_max_tokens < 1:
            raise CodespecError(f"index_max_tokens must be >= 1, got {self.index_max_tokens}")

    def changed(self) -> dict:
        """The options that differ from the defaults (what a configured class name carries)."""
        default = DrafterOptions()
        return {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if getattr(self, field.name) != getattr(default, field.name)
        }

    def class_path(self) -> str:
        """The dotted path vLLM imports: the plain class, or one carrying these options."""
        changed = self.changed()
        if not changed:
            return CLASS_PATH
        blob = json.dumps(changed, sort_keys=True, separators=(",", ":")).encode()
        return f"{CONFIGURED_MODULE}.{CONFIGURED_PREFIX}{blob.hex()}"

    @classmethod
    def from_class_name(cls, name: str) -> DrafterOptions:
        if not name.startswith(CONFIGURED_PREFIX):
            raise AttributeError(name)
        try:
            values = json.loads(bytes.fromhex(name[len(CONFIGURED_PREFIX) :]))
        except ValueError as error:
            raise AttributeError(f"{name}: not a configured codespec proposer ({error})") from None
        if "workspace" in values:
            values["workspace"] = tuple(values["workspace"])
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise CodespecError(f"unknown codespec proposer option(s) {', '.join(unknown)} (another codespec version?)")
        return cls(**values)


def speculative_config(options: DrafterOptions, k: int = DEFAULT_K) -> dict:
    """The value of vLLM's ``speculative_config`` (``--speculative-config`` or ``LLM(...)``)."""
    if k < 1:
        raise CodespecError(f"the draft length must be >= 1, got {k}")
    return {"method": "custom_class", "model": options.class_path(), "num_speculative_tokens": k}
