"""What a request may ask, checked once for every door (docs/protocol.md, docs/http.md), and the
request every door hands the engine.

A door reads its wire format (LSP params, a websocket message, an OpenAI body) and hands the raw JSON
values of the shared fields to these checks; a bad value raises :class:`FieldError`, which the door
turns into its own error shape (a JSON-RPC error, a websocket ``error``, an OpenAI error body). The
limits are one set (:data:`LIMITS`), so a request valid at one door is valid at every door.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from codespec.core.config import SamplingParams
from codespec.core.prompts import Prompt
from codespec.proposers.registry import available_proposers
from codespec.service.requests.jsondecode import lone_surrogate, may_hold_surrogates


class RequestKind(enum.StrEnum):
    """What the engine is asked to do; each kind's rules are stated here, once."""

    COMPLETE = "complete"  # ghost text at a cursor: ends on a repeating loop as well as on stops
    EDIT = "edit"  # a rewrite of a region: its budget comes on top of the region's length
    NEXT_EDIT = "next-edit"  # a window rewritten as the user's last edits imply: an edit's budget
    CHAT = "chat"  # a prompt the client rendered (OpenAI chat or a rewrite with its whole budget)
    WARM = "warm"  # a short generation at start-up: never user history
    PREFILL = "prefill"  # fill a document's KV cache with its prompt, in chunks; no decoding

    @property
    def decodes(self) -> bool:
        return self is not RequestKind.PREFILL

    @property
    def is_history(self) -> bool:
        """Its output is what the user saw: it goes into the session history the index drafts from."""
        return self not in (RequestKind.WARM, RequestKind.PREFILL)

    @property
    def budget_adds_reference(self) -> bool:
        return self in (RequestKind.EDIT, RequestKind.NEXT_EDIT)

    @property
    def interactive(self) -> bool:
        """What a user waits on as they type (ghost text, a next-edit suggestion): it is admitted
        first, and beside it the other requests mostly sit out (``service.scheduler``)."""
        return self in (RequestKind.COMPLETE, RequestKind.NEXT_EDIT)

    @property
    def stops_on_repeats(self) -> bool:
        """A small model's loop is noise as ghost text; a rewrite copies repetitive code whole."""
        return self is RequestKind.COMPLETE


@dataclass(frozen=True)
class RequestLimits:
    max_tokens: int = 1 << 20  # a larger budget is clipped to the model's context anyway
    max_stop_strings: int = 64  # Zed sends 14 FIM end markers, Continue often more than OpenAI's 4
    max_stop_chars: int = 512
    max_temperature: float = 2.0
    seeds: tuple[int, int] = (-(1 << 63), (1 << 64) - 1)  # what a torch generator takes


LIMITS = RequestLimits()


class FieldError(ValueError):
    """A request field with a bad value; ``code`` is ``invalid_value`` or ``invalid_type``."""

    def __init__(self, field: str, message: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.field = field
        self.message = message
        self.code = code


_SURROGATE = re.compile("[\ud800-\udfff]")


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def check_unicode(field: str, value: str) -> str:
    """Refuse text no encoder accepts (JSON can spell a lone surrogate, UTF-8 cannot)."""
    if not value.isascii():
        match = _SURROGATE.search(value)
        if match is not None:
            raise FieldError(
                field,
                f"{field} is not valid Unicode: a lone surrogate (U+{ord(match.group()):04X}) at character {match.start()}",
            )
    return value


def refuse_lone_surrogates(value: Any, raw: bytes | str) -> None:
    """A request decoded from ``raw`` (``service.jsondecode.loads``) with a lone surrogate in any
    string, a key or a field no door reads included, is a FieldError naming where."""
    if not may_hold_surrogates(raw):
        return
    found = lone_surrogate(value)
    if found is not None:
        path, surrogate, index = found
        raise FieldError(
            path, f"{path} is not valid Unicode: a lone surrogate (U+{ord(surrogate):04X}) at character {index}"
        )


def integer(value: Any, field: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(field, f"{field} must be an integer, got {type(value).__name__}", "invalid_type")
    return value


def max_tokens(value: Any, field: str = "max_tokens", limits: RequestLimits = LIMITS) -> int | None:
    count = integer(value, field)
    if count is not None and not 1 <= count <= limits.max_tokens:
        raise FieldError(field, f"{field} must be in [1, {limits.max_tokens}], got {count}")
    return count


def _number(value: Any, field: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    if value is None:
        return default
    if not _is_number(value):
        if isinstance(value, float):  # NaN or infinity: only Python's own decoder lets them through
            raise FieldError(field, f"{field} must be a finite number, got {value!r}")
        raise FieldError(field, f"{field} must be a number, got {type(value).__name__}", "invalid_type")
    if value > high or value < low or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise FieldError(field, f"{field} must be in {bracket}{low:g}, {high:g}], got {value!r}")
    return float(value)


def temperature(value: Any, limits: RequestLimits = LIMITS) -> float:
    """0 (the default) is greedy decoding."""
    return _number(value, "temperature", 0.0, 0.0, limits.max_temperature)


def top_p(value: Any) -> float:
    return _number(value, "top_p", 1.0, 0.0, 1.0, low_open=True)


def seed(value: Any, limits: RequestLimits = LIMITS) -> int | None:
    number = integer(value, "seed")
    low, high = limits.seeds
    if number is not None and not low <= number <= high:
        raise FieldError("seed", f"seed must be in [{low}, {high}] (64 bits), got {number}")
    return number


def top_k(value: Any) -> int:
    """0 (the default) is off; top-k then top-p, after the temperature (as the engine's sampler)."""
    found = integer(value, "top_k")
    if found is None:
        return 0
    if found < 0:
        raise FieldError("top_k", f"top_k must be 0 (off) or more, got {found}")
    return found


def stop(value: Any, limits: RequestLimits = LIMITS) -> tuple[str, ...]:
    """A string or a list of strings; duplicates dropped, order kept."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise FieldError("stop", "stop must be a string or a list of strings", "invalid_type")
    if len(value) > limits.max_stop_strings:
        raise FieldError("stop", f"stop may hold at most {limits.max_stop_strings} strings, got {len(value)}")
    for item in value:
        if not isinstance(item, str):
            raise FieldError("stop", "stop must be a string or a list of strings", "invalid_type")
        if not item or len(item) > limits.max_stop_chars:
            raise FieldError("stop", f"each stop string must have 1 to {limits.max_stop_chars} characters")
        check_unicode("stop", item)
    return tuple(dict.fromkeys(value))


def proposer(value: Any) -> str | None:
    """A proposer name from the one table (``proposers.registry``), or None for the server's default."""
    if value is None:
        return None
    names = available_proposers()
    if not isinstance(value, str) or value not in names:
        raise FieldError("proposer", f"proposer must be one of {', '.join(names)}")
    return value


MAX_EDITS = 8  # recent edits a request may carry (the next-edit proposer reads the newest 3)
MAX_EDIT_CHARS = 4096  # per side of an edit: the lines it touched


def edits(value: Any) -> tuple[tuple[str, str], ...]:
    """The user's recent edits a request carries for next-edit drafting, oldest first: a list of
    ``{"before": lines, "after": lines}`` (docs/next-edit.md)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise FieldError("edits", "edits must be a list of {before, after} objects", "invalid_type")
    if len(value) > MAX_EDITS:
        raise FieldError("edits", f"edits may hold at most {MAX_EDITS} edits, got {len(value)}")
    pairs = []
    for item in value:
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("before"), str)
            or not isinstance(item.get("after"), str)
        ):
            raise FieldError("edits", "each edit must be an object {before: string, after: string}", "invalid_type")
        if len(item["before"]) > MAX_EDIT_CHARS or len(item["after"]) > MAX_EDIT_CHARS:
            raise FieldError("edits", f"each side of an edit may have at most {MAX_EDIT_CHARS} characters")
        pairs.append((check_unicode("edits", item["before"]), check_unicode("edits", item["after"])))
    return tuple(pairs)


@dataclass(frozen=True)
class Sampling:
    """What a client may set on any request, at any door, checked (:func:`sampling`)."""

    max_tokens: int | None = None  # None: the request kind's own budget
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] | None = None  # None: the request kind's own stop rule; (): none at all
    proposer: str | None = None  # None: the server's default
    top_k: int = 0  # 0: off

    def params(self) -> SamplingParams:
        """How the engine picks each token (the one shape the engine and the sampler read)."""
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.seed)


def sampling(data: Mapping[str, Any], *max_tokens_keys: str) -> Sampling:
    """The shared fields of a request's JSON object; ``max_tokens_keys``: the budget's names, first
    found wins (OpenAI chat: ``max_completion_tokens``, then ``max_tokens``)."""
    budget = None
    for key in max_tokens_keys or ("max_tokens",):
        budget = max_tokens(data.get(key), key)
        if budget is not None:
            break
    raw_stop = data.get("stop")
    return Sampling(
        budget,
        temperature(data.get("temperature")),
        top_p(data.get("top_p")),
        seed(data.get("seed")),
        None if raw_stop is None else stop(raw_stop),
        proposer(data.get("proposer")),
        top_k(data.get("top_k")),
    )


# ---- the request every door hands the engine -------------------------------------------------
REQUEST_LOG = "codespec.requests"  # the engine's one line per request, on stderr (`serve --quiet`: none)


@dataclass(frozen=True)
class GenerationRequest:
    """One completion or rewrite, built by :func:`request_of` (through ``service.inline`` for
    completions, ``service.edit`` for rewrites, ``service.next_edit`` for next edits); the service
    renders its prompt."""

    prompt: Prompt  # what is asked (codespec.prompts.Fim / Rewrite), or a plain string
    max_tokens: int
    kind: RequestKind = RequestKind.COMPLETE  # each kind's rules: service.schema.RequestKind
    stop: tuple[str, ...] = ()
    sampling: SamplingParams = SamplingParams()  # greedy by default
    reference: str | None = None  # reference draft: the text being rewritten, a prediction, a shown suggestion
    # what a rewrite's budget is counted from where the reference draft is other text (a next edit
    # drafted from its speculated answer keeps the budget of the window it rewrites); None: the reference
    budget_text: str | None = None
    cache_key: str | None = None  # document whose KV cache to reuse
    uri: str | None = None  # for the index proposer's locality ranking
    cursor: int | None = None  # code point offset of the cursor in ``uri``
    edits: tuple[tuple[str, str], ...] = ()  # the user's recent edits (next-edit drafting), oldest first
    # the target's token ids of text sent beside the prompt to draft from (llama.vim's input_extra chunks)
    material: tuple[tuple[int, ...], ...] = ()
    deadline_s: float | None = None
    proposer: str | None = None  # None: the service default
    origin: str = ""  # who asked: lsp, websocket, http (the request log names it)
    ahead: bool = False  # asked ahead of the user (a speculated next edit): background, whatever its kind

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", RequestKind(self.kind))  # a kind's name is accepted too

    @property
    def interactive(self) -> bool:
        """A user waits on it now (``RequestKind.interactive``, unless asked ahead): the scheduler
        admits it first and has the other requests mostly sit out beside it."""
        return self.kind.interactive and not self.ahead


def request_of(
    prompt: Prompt, max_tokens: int, kind: RequestKind, sampling: Sampling, stop: tuple[str, ...], **where: Any
) -> GenerationRequest:
    """The one place a client's request is built from a prompt and the client's sampling;
    ``where``: reference, edits, cache_key, uri, cursor, deadline_s, origin (``GenerationRequest``'s fields)."""
    return GenerationRequest(
        prompt=prompt,
        max_tokens=max_tokens,
        kind=kind,
        stop=tuple(stop),
        sampling=sampling.params(),
        proposer=sampling.proposer,
        **where,
    )


def prompt_request(
    prompt: str,
    max_tokens: int,
    *,
    chat: bool = False,
    sampling: Sampling = Sampling(),
    reference: str | None = None,
    edits: tuple[tuple[str, str], ...] = (),
    cache_key: str | None = None,
    uri: str | None = None,
    origin: str = "",
) -> GenerationRequest:
    """A prompt the client rendered itself (an OpenAI plain completion, a chat rendered by the
    model's template), sent as it is; ``chat`` ends it without the completion's loop stop;
    ``edits``: the user's recent edits the prompt shows (a next-edit prompt)."""
    kind = RequestKind.CHAT if chat else RequestKind.COMPLETE
    return request_of(
        prompt,
        max_tokens,
        kind,
        sampling,
        sampling.stop or (),
        reference=reference,
        edits=edits,
        cache_key=cache_key,
        uri=uri,
        origin=origin,
    )
