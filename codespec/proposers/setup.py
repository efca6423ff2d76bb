"""What a proposer is built from: the target, the request's inputs and its own settings, typed.

``RequestContext`` is what one request gives its lookups (the reference text, the index and the
place in it); ``ProposerConfig`` holds one settings dataclass per proposer. Flat option names (the
CLI's flags, bench configurations) become these values in ``ProposerSetup.from_options``, the one
place where names are parsed: an unknown name is an error there, not a silently ignored key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from codespec.core.errors import CodespecError
from codespec.proposers.policy import PolicyConfig

# The same default as transformers' ``assistant_confidence_threshold``: a model drafter stops once
# its top probability falls below it (0 = draft the full length).
DEFAULT_MIN_CONFIDENCE = 0.4


@dataclass(frozen=True)
class RequestContext:
    """One request's inputs to the lookups."""

    reference: str | None = None  # the text being rewritten, a prediction, a shown suggestion
    reference_start: int = 0  # character offset in ``reference`` where the output starts
    index: Any = None  # index.WorkspaceIndex (workspace and history lookup)
    uri: str | None = None  # the document, for the index's locality ranking
    cursor: int | None = None  # code point offset of the cursor in ``uri``
    # the user's recent edits, oldest first: (the lines an edit touched before it, after it)
    edits: tuple[tuple[str, str], ...] = ()
    # token ids of text the client sent beside the prompt to draft from (llama.vim's input_extra)
    material: tuple[tuple[int, ...], ...] = ()
    # token ids the reference lies in (a prompt carrying its code): the copy pointer reads its ids there
    reference_source: Sequence[int] | None = None
    outputs: Any = None  # proposers.outputs.RecentOutputs: the session's earlier outputs (auto drafts from them)


@dataclass(frozen=True)
class ContextConfig:
    max_ngram: int = 8
    min_ngram: int = 2
    draft_len: int | None = None  # None: as long as the engine allows


@dataclass(frozen=True)
class IndexConfig:
    max_candidates: int = 4
    # The shortest match in another document or the session history that drafts (the current
    # document and the request's own text draft from ``min_ngram``). None: 3 for the index proposer
    # alone; under auto every match, which auto prices by its length. docs/index.md "Which matches draft".
    min_other_match: int | None = None

    def other_match(self, under_auto: bool) -> int:
        """The shortest other-document match that drafts, for the index proposer alone or under auto."""
        if self.min_other_match is not None:
            return self.min_other_match
        return 1 if under_auto else 3


@dataclass(frozen=True)
class DraftConfig:
    path: str | None = None  # None: the shipped draft model
    min_confidence: float = DEFAULT_MIN_CONFIDENCE


@dataclass(frozen=True)
class EarlyExitConfig:
    exit_layer: int | None = None  # None: a quarter of the depth
    min_confidence: float = DEFAULT_MIN_CONFIDENCE


@dataclass(frozen=True)
class AutoConfig:
    candidates: tuple[str, ...] | None = None  # None: every proposer that can be built
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    shared_state: bool = True  # start from the statistics earlier requests measured


@dataclass(frozen=True)
class ProposerConfig:
    context: ContextConfig = field(default_factory=ContextConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    early_exit: EarlyExitConfig = field(default_factory=EarlyExitConfig)
    auto: AutoConfig = field(default_factory=AutoConfig)


@dataclass(frozen=True)
class ProposerSetup:
    """Everything ``from_setup`` may read."""

    target: Any = None  # codespec.model.TargetModel (or a tokenizer-only stand-in for model-free replay)
    request: RequestContext = field(default_factory=RequestContext)
    config: ProposerConfig = field(default_factory=ProposerConfig)

    def for_request(self, request: RequestContext) -> ProposerSetup:
        return dataclasses.replace(self, request=request)

    @classmethod
    def from_options(cls, target: Any, options: Mapping[str, Any] | None = None) -> ProposerSetup:
        """Flat option names -> typed values (see ``OPTION_NAMES``); an unknown name is an error."""
        return cls(target, *_parse(dict(options or {})))


# flat name -> (group, field); group "request" is RequestContext, the others ProposerConfig fields
OPTION_NAMES: dict[str, tuple[str, str]] = {
    "reference": ("request", "reference"),
    "reference_start": ("request", "reference_start"),
    "index": ("request", "index"),
    "uri": ("request", "uri"),
    "cursor": ("request", "cursor"),
    "edits": ("request", "edits"),
    "material": ("request", "material"),
    "outputs": ("request", "outputs"),
    "max_ngram": ("context", "max_ngram"),
    "min_ngram": ("context", "min_ngram"),
    "draft_len": ("context", "draft_len"),
    "max_candidates": ("index", "max_candidates"),
    "min_other_match": ("index", "min_other_match"),
    "draft_model": ("draft", "path"),
    "exit_layer": ("early_exit", "exit_layer"),
    "auto_candidates": ("auto", "candidates"),
    "policy": ("auto", "policy"),
    "auto_state": ("auto", "shared_state"),
}


def _parse(options: dict[str, Any]) -> tuple[RequestContext, ProposerConfig]:
    unknown = sorted(set(options) - set(OPTION_NAMES) - {"draft_min_confidence"})
    if unknown:
        raise CodespecError(
            f"unknown proposer option(s) {', '.join(unknown)}; known: "
            f"{', '.join(sorted([*OPTION_NAMES, 'draft_min_confidence']))}"
        )
    groups: dict[str, dict[str, Any]] = {}
    for name, value in options.items():
        if name == "draft_min_confidence":  # both model drafters
            groups.setdefault("draft", {})["min_confidence"] = float(value)
            groups.setdefault("early_exit", {})["min_confidence"] = float(value)
            continue
        group, attribute = OPTION_NAMES[name]
        groups.setdefault(group, {})[attribute] = _value(name, value)
    request = RequestContext(**groups.pop("request", {}))
    config = ProposerConfig(**{group: _GROUPS[group](**values) for group, values in groups.items()})
    return request, config


_GROUPS = {
    "context": ContextConfig,
    "index": IndexConfig,
    "draft": DraftConfig,
    "early_exit": EarlyExitConfig,
    "auto": AutoConfig,
}


def _value(name: str, value: Any) -> Any:
    if name == "auto_candidates" and value is not None:
        names = value.split(",") if isinstance(value, str) else list(value)
        return tuple(item.strip() for item in names if item.strip())
    if name == "policy":
        if isinstance(value, PolicyConfig):
            return value
        try:
            return PolicyConfig(**dict(value))
        except TypeError as error:
            raise CodespecError(
                f"bad auto policy options {value!r}: {error}; known options: "
                f"{', '.join(PolicyConfig.__dataclass_fields__)}"
            ) from error
    if name == "auto_state":
        if value not in ("shared", "fresh", True, False):
            raise CodespecError(f"auto_state must be 'shared' or 'fresh', got {value!r}")
        return value in ("shared", True)
    if name in ("max_ngram", "min_ngram", "max_candidates", "min_other_match", "reference_start"):
        return int(value)
    if name == "edits":
        return tuple((str(before), str(after)) for before, after in value)
    if name == "material":
        return tuple(tuple(int(token) for token in chunk) for chunk in value)
    if name == "draft_model":
        return None if value is None else str(value)
    return value
