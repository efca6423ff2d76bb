"""Rewrites (``codespec/edit`` and the websocket ``edit`` message): plain functions, no server.

The original text of the range is the reference draft (or the client's ``prediction`` when it
sends one: its guess of the result, as with OpenAI Predicted Outputs), so the copy pointer drafts
long runs of unchanged text and the target verifies them in one forward each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from codespec.core.prompts import Rewrite
from codespec.service.requests.positions import PositionError, range_offsets
from codespec.service.requests.schema import GenerationRequest, RequestKind, Sampling, request_of


class EditParamsError(ValueError):
    """Malformed edit parameters (missing range, wrong types)."""


@dataclass(frozen=True)
class EditPlan:
    original: str
    instruction: str | None
    reference: str  # the reference draft: the client's prediction, else the original
    start: int  # code point offsets of the rewritten range
    end: int
    max_tokens: int  # budget beyond the original's length (the service adds that; a prediction does not)


def as_dict(params: Any) -> Any:
    """pygls hands custom-method params over as namedtuples; turn them back into plain JSON values."""
    if hasattr(params, "_asdict"):
        return {key: as_dict(value) for key, value in params._asdict().items()}
    if isinstance(params, dict):
        return {key: as_dict(value) for key, value in params.items()}
    if isinstance(params, (list, tuple)):
        return [as_dict(value) for value in params]
    return params


def text_document_uri(raw: Any) -> str:
    document = raw.get("textDocument") if isinstance(raw, dict) else None
    uri = document.get("uri") if isinstance(document, dict) else None
    if not isinstance(uri, str):
        raise EditParamsError("codespec/edit needs textDocument.uri")
    return uri


def _position(raw: Any, name: str) -> tuple[int, int]:
    if not isinstance(raw, dict) or "line" not in raw or "character" not in raw:
        raise EditParamsError(f"{name} must be an object with line and character")
    return raw["line"], raw["character"]


def plan_edit(text: str, raw: dict, encoding: str, budget: int) -> EditPlan:
    """Validate an edit request against the document text and build its prompt."""
    rng = raw.get("range")
    if not isinstance(rng, dict):
        raise EditParamsError("an edit needs a range {start, end}")
    start, end = range_offsets(
        text, _position(rng.get("start"), "range.start"), _position(rng.get("end"), "range.end"), encoding=encoding
    )
    instruction = _optional_text(raw, "instruction")
    prediction = _optional_text(raw, "prediction")
    original = text[start:end]
    return EditPlan(original, instruction, prediction if prediction is not None else original, start, end, budget)


def plan_text_edit(original: str, instruction: str | None, prediction: str | None, budget: int) -> EditPlan:
    """An edit of free text (the websocket ``edit`` message)."""
    return EditPlan(original, instruction, prediction if prediction is not None else original, 0, len(original), budget)


def _optional_text(raw: dict, key: str) -> str | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise EditParamsError(f"{key} must be a string")
    return value


def edit_response(edit_id: str, rng: dict, result, prediction_tokens: tuple[int, int] = (0, 0)) -> dict:
    """The ``codespec/edit`` result: the TextEdits, why it ended, usage (its prediction tokens as
    every door counts them, ``service.doors.predictions``), the drafting and engine stats."""
    usage = result.usage.as_dict()
    usage["accepted_prediction_tokens"], usage["rejected_prediction_tokens"] = prediction_tokens
    return {
        "editId": edit_id,
        "edits": [{"range": rng, "newText": result.text}],
        "finishReason": result.reason,
        "usage": usage,
        "speculation": result.speculation(),
        "stats": result.stats,
        "proposer": result.proposer,
    }


def edit_request(
    plan: EditPlan,
    *,
    sampling: Sampling = Sampling(),
    cache_key: str | None = None,
    uri: str | None = None,
    cursor: int | None = None,
    whole_budget: bool = False,
    edits: tuple[tuple[str, str], ...] = (),
    origin: str = "",
) -> GenerationRequest:
    """A rewrite of ``plan``'s region: its text (or the client's prediction) is the reference draft;
    ``edits``: the user's recent edits (next-edit drafting repeats them in the region).

    ``plan.max_tokens`` is a budget on top of the original's length (a rewrite is about as long as
    its region; the prediction is only a draft, so it never changes the answer), or with
    ``whole_budget`` the whole budget (OpenAI's ``max_tokens``); it is the budget
    (``sampling.max_tokens`` is not read).
    """
    kind = RequestKind.CHAT if whole_budget else RequestKind.EDIT
    return request_of(
        Rewrite(plan.original, plan.instruction),
        plan.max_tokens,
        kind,
        sampling,
        sampling.stop or (),
        reference=plan.reference,
        budget_text=plan.original,
        edits=edits,
        cache_key=cache_key,
        uri=uri,
        cursor=cursor,
        origin=origin,
    )


__all__ = [
    "EditPlan",
    "EditParamsError",
    "PositionError",
    "as_dict",
    "plan_edit",
    "plan_text_edit",
    "edit_response",
    "edit_request",
]
