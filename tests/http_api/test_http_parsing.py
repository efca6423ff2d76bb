"""The HTTP API's request parsing and the rewrite format's reading of chat messages (no server)."""

from __future__ import annotations

import pytest

from codespec.http_api.schema import ApiError, finish_reason, parse_chat, parse_completion, rewrite_parts


def user(text: str) -> tuple[dict, ...]:
    return ({"role": "user", "content": text},)


def test_the_last_fenced_block_of_the_last_user_message_is_the_region():
    messages = (
        {"role": "user", "content": "```\nold = 1\n```"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "context:\n```py\nctx()\n```\nrename x to y\n```python\nx = 1\nprint(x)\n```\n"},
    )
    region, instruction = rewrite_parts(messages, None)
    assert region == "x = 1\nprint(x)\n"
    assert instruction == "context:\n```py\nctx()\n```\nrename x to y"


def test_a_block_without_instruction_is_a_plain_copy():
    assert rewrite_parts(user("```\na = 1\n```"), None) == ("a = 1\n", None)


def test_without_a_block_the_prediction_is_the_region():
    assert rewrite_parts(user("add a docstring"), "def f():\n    pass\n") == ("def f():\n    pass\n", "add a docstring")
    with pytest.raises(ApiError) as refused:
        rewrite_parts(user("add a docstring"), None)
    assert refused.value.status == 400 and refused.value.param == "messages"


def test_text_parts_are_joined_and_other_parts_refused():
    body = parse_chat(
        {
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
            "prediction": {"type": "content", "content": [{"type": "text", "text": "p"}]},
        }
    )
    assert body.messages[0]["content"] == "ab" and body.prediction == "p"
    with pytest.raises(ApiError) as refused:
        parse_chat({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})
    assert refused.value.code == "unsupported_parameter"


def test_completion_defaults_follow_openai_except_temperature():
    body = parse_completion({"prompt": "x", "stop": "\n"})
    assert body.call.sampling.max_tokens == 16 and body.suffix is None and body.call.sampling.stop == ("\n",)
    assert body.call.sampling.temperature == 0.0  # greedy by default (documented deviation)
    assert parse_completion({"prompt": ["x"], "suffix": ""}).suffix == ""  # a one-string list; FIM with suffix
    assert (
        parse_chat({"messages": list(user("x")), "max_tokens": 5, "max_completion_tokens": 9}).call.sampling.max_tokens
        == 9
    )


def test_stream_options_need_stream():
    assert not parse_completion({"prompt": "x", "stream_options": {"include_usage": True}}).call.include_usage
    assert parse_completion(
        {"prompt": "x", "stream": True, "stream_options": {"include_usage": True}}
    ).call.include_usage


def test_finish_reasons_map_to_openai():
    assert [finish_reason(r) for r in ("eos", "stop", "repetition", "length", "context", "deadline")] == [
        "stop",
        "stop",
        "stop",
        "length",
        "length",
        "length",
    ]


def failed(error: Exception):
    import asyncio

    loop = asyncio.new_event_loop()
    try:
        future = loop.create_future()
        future.set_exception(error)
        return future
    finally:
        loop.close()


def test_errors_map_to_the_api_by_their_type_not_their_words():
    from codespec.core.errors import CodespecError, ContextLengthError, InvalidRequestError, ServiceClosedError
    from codespec.http_api.routes import job_failure as _failure

    too_long = _failure(failed(ContextLengthError("the prompt is 9 tokens but ...")), "prompt")
    assert (too_long.status, too_long.code, too_long.param) == (400, "context_length_exceeded", "prompt")
    # a message that mentions the context is not a context error (an empty prompt's message does)
    empty = _failure(failed(InvalidRequestError("the prompt is empty: give at least one token of context")), "prompt")
    assert (empty.status, empty.code) == (400, "invalid_value")
    assert _failure(failed(ServiceClosedError("stopping")), "prompt").status == 503
    assert _failure(failed(CodespecError("the engine service is closed")), "prompt").status == 500
