"""One request schema: the websocket and HTTP doors give the same verdict on the same field values,
because both hand them to ``service.schema``; the request kinds carry their rules."""

from __future__ import annotations

import json

import pytest

from codespec.http_api.schema import ApiError, parse_completion
from codespec.service.requests import schema
from codespec.service.requests.schema import LIMITS, GenerationRequest, RequestKind
from codespec.websocket_api.protocol import ProtocolError, parse_message

FIELDS = [
    ("max_tokens", 1, True),
    ("max_tokens", LIMITS.max_tokens, True),
    ("max_tokens", LIMITS.max_tokens + 1, False),
    ("max_tokens", 0, False),
    ("max_tokens", True, False),
    ("max_tokens", 2.5, False),
    ("temperature", 0, True),
    ("temperature", LIMITS.max_temperature, True),
    ("temperature", LIMITS.max_temperature + 0.01, False),
    ("temperature", -1, False),
    ("temperature", "hot", False),
    ("stop", "\n", True),
    ("stop", ["a"] * LIMITS.max_stop_strings, True),
    ("stop", [str(n) for n in range(LIMITS.max_stop_strings + 1)], False),
    ("stop", ["x" * LIMITS.max_stop_chars], True),
    ("stop", ["x" * (LIMITS.max_stop_chars + 1)], False),
    ("stop", [""], False),
    ("stop", [3], False),
    ("stop", {"a": 1}, False),
    ("top_p", 1, True),
    ("top_p", 0, False),
    ("top_p", 1.5, False),
    ("seed", 7, True),
    ("seed", "7", False),
    ("seed", -(2**63), True),
    ("seed", 2**64 - 1, True),
    ("seed", 2**64, False),  # a torch generator refuses it: a 500 before the bound
    ("seed", -(2**63) - 1, False),
    ("proposer", "context", True),
    ("proposer", "fastest", False),
]


def _websocket_accepts(field: str, value) -> bool:
    message = json.dumps({"type": "complete", "id": 1, "prefix": "x", field: value})
    try:
        parse_message(message, 1 << 20)
    except ProtocolError as error:
        assert error.code == "invalid_request" and field in error.message
        return False
    return True


def _http_accepts(field: str, value) -> bool:
    try:
        parse_completion({"prompt": "x", field: value})
    except ApiError as error:
        assert error.status == 400 and error.param == field
        return False
    return True


@pytest.mark.parametrize(("field", "value", "valid"), FIELDS)
def test_the_doors_share_one_set_of_limits(field, value, valid):
    assert _websocket_accepts(field, value) is valid
    assert _http_accepts(field, value) is valid


def test_a_lone_surrogate_in_a_stop_string_is_refused_by_both_doors():
    raw = '{"type": "complete", "id": 1, "prefix": "x", "stop": ["\\udfff"]}'
    with pytest.raises(ProtocolError, match="lone surrogate"):
        parse_message(raw, 1 << 20)
    with pytest.raises(ApiError, match="lone surrogate"):
        parse_completion(json.loads(raw.replace('"type": "complete", "id": 1, "prefix"', '"prompt"')))


def test_a_float_that_is_not_finite_is_refused_by_value():
    # the shared decoder never makes one (service.jsondecode); a door that decodes otherwise still gets a 400
    for value in (float("nan"), float("inf")):
        with pytest.raises(schema.FieldError, match="must be a finite number"):
            schema.temperature(value)


def test_stop_strings_keep_their_order_without_duplicates():
    assert schema.stop(["b", "a", "b"]) == ("b", "a")


def test_proposer_names_come_from_the_one_table():
    from codespec.proposers.registry import available_proposers

    for name in available_proposers():
        assert schema.proposer(name) == name
    with pytest.raises(schema.FieldError, match="proposer must be one of"):
        schema.proposer("fastest")


def test_request_kinds_state_their_rules():
    assert [kind for kind in RequestKind if not kind.decodes] == [RequestKind.PREFILL]
    assert [kind for kind in RequestKind if not kind.is_history] == [RequestKind.WARM, RequestKind.PREFILL]
    assert [kind for kind in RequestKind if kind.budget_adds_reference] == [RequestKind.EDIT, RequestKind.NEXT_EDIT]
    assert [kind for kind in RequestKind if kind.stops_on_repeats] == [RequestKind.COMPLETE]


def test_a_request_takes_a_kind_by_name_and_refuses_an_unknown_one():
    assert GenerationRequest(prompt="x", max_tokens=1, kind="edit").kind is RequestKind.EDIT
    with pytest.raises(ValueError):
        GenerationRequest(prompt="x", max_tokens=1, kind="rewrite")
