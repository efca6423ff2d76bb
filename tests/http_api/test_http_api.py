"""The OpenAI-compatible HTTP API with the official `openai` client against a real server (uvicorn on
a free loopback port, in this process, on its own event loop thread).

The tiny random model where only the plumbing matters; the shipped default model where the real
copying behaviour matters (FIM in its format, chat with a prediction it repeats, stop strings over
readable text).
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time

import openai
import pytest

try:  # the HTTP client the openai package depends on (httpx2 in recent releases, httpx before)
    import httpx2
except ImportError:  # pragma: no cover
    import httpx as httpx2

from codespec.config import GenerationLimits
from codespec.decode import generate_all
from codespec.prompts import Fim
from http_api.server import start_http_server
from service.auth import Listen
from service.engine import COMPLETION_STOP_REPEATS, EngineService
from service.options import CompletionOptions, HttpLimits, ServerOptions
from service.runtime import LoopThread

TOKEN = "http-test-token"
WAIT_S = 120  # hang guard only: every wait below ends on an event
OPTIONS = ServerOptions(completion=CompletionOptions(deadline_ms=600_000))
LIMITS = HttpLimits(max_body_bytes=64 * 1024, max_requests=24, allowed_origins=("https://trusted.example",))
LONG_CHAT = [{"role": "user", "content": "```\nimport os\n```"}]  # the tiny model writes ~2000 tokens for it
CODE = '''def scale(values, factor):
    """Multiply every value by factor."""
    result = []
    for value in values:
        result.append(value * factor)
    return result


def total(values):
    return sum(values)
'''


class Hosted:
    """A server on its own loop thread, so the synchronous openai client can call it."""

    def __init__(self, service: EngineService, limits: HttpLimits = LIMITS, draft: str | None = None) -> None:
        self.service = service
        self.loop = LoopThread("test-http")
        self.server = self.loop.run(start_http_server(service, Listen(TOKEN), OPTIONS, limits, draft), WAIT_S)
        self.url = f"http://127.0.0.1:{self.server.port}"

    def client(self, **kwargs) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=TOKEN, max_retries=0, timeout=WAIT_S, **kwargs)

    def close(self) -> None:
        self.loop.run(self.server.stop(), WAIT_S)
        self.loop.stop()


@pytest.fixture(scope="module")
def one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as the server runs (service.runtime): small forwards on loaded cores
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(server_target, one_thread):
    service = EngineService(server_target, proposer="auto", max_draft=8)
    hosted = Hosted(service)
    yield hosted
    hosted.close()
    service.close()


@pytest.fixture(scope="module")
def shipped(one_thread):
    from codespec.default_model import target_path
    from codespec.model import TargetModel

    service = EngineService(TargetModel.load(str(target_path()), device="cpu"), proposer="auto", max_draft=32)
    hosted = Hosted(service)
    yield hosted
    hosted.close()
    service.close()


def post(hosted: Hosted, path: str, body=None, headers=None, **kwargs) -> httpx2.Response:
    headers = {"Authorization": f"Bearer {TOKEN}", **(headers or {})}
    return httpx2.post(hosted.url + path, json=body, headers=headers, timeout=WAIT_S, **kwargs)


def assert_error(response: httpx2.Response, status: int, code: str | None = None, param: str | None = None):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"] and "Traceback" not in body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code, body
    if param is not None:
        assert body["error"]["param"] == param, body
    return body["error"]


def wait_for(predicate, what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def plain_output(service: EngineService, prompt_text: str, max_tokens: int, stop=(), repeats: int = 0):
    """What plain greedy decoding of ``prompt_text`` produces under the service's end rules."""
    target = service.target
    limits = GenerationLimits(
        max_tokens, (*stop, *service.prompts.end_markers), stop_token_ids=service.stop_token_ids, stop_repeats=repeats
    )
    return generate_all(target, target.encode(prompt_text), None, limits=limits)


# ---- models, completions, chat ------------------------------------------------------------------
def test_models_lists_the_loaded_target(tiny, server_model_dir):
    models = tiny.client().models.list().data
    assert [model.id for model in models] == [tiny.service.target.name, "codespec"]  # and the alias
    assert models[0].id == str(server_model_dir) and models[0].object == "model"


def test_models_lists_the_draft_when_there_is_one(tiny):
    hosted = Hosted(tiny.service, draft="/models/draft")
    try:
        models = hosted.client().models.list().data
        assert [model.id for model in models] == [tiny.service.target.name, "/models/draft", "codespec"]
        assert [model.model_extra["codespec"]["role"] for model in models] == ["target", "draft", "alias"]
    finally:
        hosted.close()


def test_fim_completion_is_what_the_engine_produces(shipped):
    prefix, suffix = "def add(a, b):\n    return ", "\n\n\ndef sub(a, b):\n    return a - b\n"
    completion = shipped.client().completions.create(model="codespec", prompt=prefix, suffix=suffix, max_tokens=16)
    rendered = shipped.service.prompts.render(Fim(prefix, suffix)).text
    assert rendered.startswith("<|fim_prefix|>")  # the model's own FIM format
    plain = plain_output(shipped.service, rendered, 16, repeats=COMPLETION_STOP_REPEATS)
    assert completion.choices[0].text == plain.text  # lossless: token-identical to plain greedy decoding
    assert completion.usage.completion_tokens == len(plain.token_ids)
    assert completion.usage.prompt_tokens == len(shipped.service.target.encode(rendered))
    assert completion.object == "text_completion" and completion.choices[0].finish_reason in ("stop", "length")


def test_a_completion_prediction_is_drafted_and_counted(shipped):
    client = shipped.client()
    prompt = "def add(a, b):\n    return "
    first = client.completions.create(model="codespec", prompt=prompt, suffix="\n", max_tokens=16)
    answer = first.choices[0].text
    assert answer
    again = client.completions.create(
        model="codespec",
        prompt=prompt,
        suffix="\n",
        max_tokens=16,
        extra_body={"prediction": answer, "path": "file:///p/add.py"},
    )
    assert again.choices[0].text == answer  # the prediction only changes the speed
    details = again.usage.completion_tokens_details
    assert details.accepted_prediction_tokens == len(shipped.service.target.encode(answer))
    assert details.rejected_prediction_tokens == 0


def test_a_seed_makes_plain_sampling_reproducible(tiny):
    client = tiny.client()
    kwargs = dict(model="codespec", prompt="def f(x):\n    return ", max_tokens=24, temperature=1.0, top_p=0.95)
    # With drafting, the random draws follow the drafts (the same distribution, other samples); without it
    # the seed fixes the output (as OpenAI's, "best effort" otherwise).
    texts = {
        client.completions.create(**kwargs, seed=7, extra_body={"proposer": "none"}).choices[0].text for _ in range(2)
    }
    assert len(texts) == 1
    other = client.completions.create(**kwargs, seed=8, extra_body={"proposer": "none"}).choices[0].text
    assert other not in texts


def test_plain_prompt_is_sent_as_it_is(shipped):
    prompt = "<|fim_prefix|>def mul(a, b):\n    return <|fim_suffix|>\n<|fim_middle|>"  # as Zed renders it
    completion = shipped.client().completions.create(
        model="codespec", prompt=prompt, max_tokens=12, stop=["<|endoftext|>", "<|fim_pad|>"]
    )
    plain = plain_output(shipped.service, prompt, 12, repeats=COMPLETION_STOP_REPEATS)
    assert completion.choices[0].text == plain.text


def test_a_zeta_next_edit_prompt_drafts_from_its_excerpt_and_its_edits(shipped):
    """Zed sends Zeta's next-edit prompt to /v1/completions with no prediction: the door drafts
    from the excerpt and the diffs it shows, and the answer is plain decoding's."""
    from service.edit_history import EditHistory
    from service.next_edit import next_edit_request

    history = EditHistory()
    before = "def f(url):\n    x = fetch(url)\n    return fetch(x)\n"
    at = before.index("fetch") + len("fetch")
    history.record("file:///p/f.py", before, at, at, "_all")
    text = before[:at] + "_all" + before[at:]
    request, _ = next_edit_request(
        text, at + 4, history.recent("file:///p/f.py"), uri="file:///p/f.py", version=2, prompt_format="zeta", budget=8
    )
    prompt = request.prompt
    for proposer in ("reference", "next-edit"):
        completion = shipped.client().completions.create(
            model="codespec", prompt=prompt, max_tokens=24, extra_body={"proposer": proposer}
        )
        assert completion.codespec["proposer"] == proposer  # built from the excerpt (and the edits): no fallback
        assert completion.codespec["speculation"]["drafted_tokens"] > 0
        assert completion.choices[0].text == plain_output(shipped.service, prompt, 24).text


def test_a_chat_with_a_prediction_and_the_users_edits_drafts_them(shipped):
    edits = [{"before": "def scale(values, factor):\n", "after": "def scale(items, factor):\n"}]
    messages = [{"role": "user", "content": f"Rename values to items:\n```\n{CODE}```"}]
    chat = shipped.client().chat.completions.create(
        model="codespec",
        messages=messages,
        prediction={"type": "content", "content": CODE},
        max_tokens=32,
        extra_body={"edits": edits, "proposer": "next-edit"},
    )
    assert chat.codespec["proposer"] == "next-edit"  # the prediction and the edits reached the proposer
    plain = shipped.client().chat.completions.create(
        model="codespec", messages=messages, max_tokens=32, extra_body={"proposer": "none"}
    )
    assert chat.choices[0].message.content == plain.choices[0].message.content


def test_chat_with_prediction_copies_it_and_counts_it(shipped):
    client = shipped.client()
    messages = [{"role": "user", "content": f"```python\n{CODE}```"}]
    chat = client.chat.completions.create(
        model="codespec", messages=messages, prediction={"type": "content", "content": CODE}
    )
    predicted = len(shipped.service.target.encode(CODE))
    details = chat.usage.completion_tokens_details
    assert chat.choices[0].message.content == CODE  # the default model copies an uninstructed region
    assert details.accepted_prediction_tokens == predicted and details.rejected_prediction_tokens == 0
    assert chat.codespec["speculation"]["accepted_prediction_tokens"] > 0  # drafted from the prediction
    assert chat.codespec["stats"]["tokens_per_forward"] > 2

    extra = CODE + "\n\ndef unused(value):\n    return value\n"  # a prediction with a tail the answer lacks
    chat = client.chat.completions.create(
        model="codespec",
        messages=messages,
        prediction={"type": "content", "content": [{"type": "text", "text": extra}]},
    )
    details = chat.usage.completion_tokens_details
    assert chat.choices[0].message.content == CODE
    assert details.accepted_prediction_tokens > 0 and details.rejected_prediction_tokens > 0
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens == len(
        shipped.service.target.encode(extra)
    )


def test_chat_template_renders_the_messages(server_model_dir, one_thread):
    from codespec.model import TargetModel

    target = TargetModel.load(str(server_model_dir), device="cpu")
    target.tokenizer.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    service = EngineService(target, proposer="auto", max_draft=8)
    hosted = Hosted(service)
    try:
        messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "say x = 1"}]
        chat = hosted.client().chat.completions.create(model="codespec", messages=messages, max_completion_tokens=12)
        rendered = target.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert rendered == "<system>be brief\n<user>say x = 1\n<assistant>"
        assert chat.choices[0].message.content == plain_output(service, rendered, 12).text
        assert chat.usage.prompt_tokens == len(target.encode(rendered))
    finally:
        hosted.close()
        service.close()


# ---- streaming ----------------------------------------------------------------------------------
def test_streaming_equals_non_streaming_for_completions(tiny):
    client = tiny.client()
    kwargs = dict(model="codespec", prompt="def scale(values, factor):\n    return [", suffix="]\n", max_tokens=40)
    whole = client.completions.create(**kwargs)
    chunks = list(client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    texts = [chunk.choices[0].text for chunk in chunks if chunk.choices]
    assert "".join(texts) == whole.choices[0].text
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(chunk.id == chunks[0].id for chunk in chunks)


def test_streaming_equals_non_streaming_for_chat(tiny):
    client = tiny.client()
    kwargs = dict(
        model="codespec", messages=[{"role": "user", "content": "tidy\n```\nx = [1, 2,3]\n```"}], max_tokens=60
    )
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    choices = [chunk.choices[0] for chunk in chunks if chunk.choices]
    assert choices[0].delta.role == "assistant"
    assert "".join(choice.delta.content or "" for choice in choices) == whole.choices[0].message.content
    assert choices[-1].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    without_usage = list(client.chat.completions.create(**kwargs, stream=True))
    assert all(chunk.usage is None for chunk in without_usage)


def test_stop_strings_across_tokens(shipped):
    client = shipped.client()
    prompt = "def add(a, b):\n    return a + b\n\n\ndef "
    plain = plain_output(shipped.service, prompt, 24, repeats=COMPLETION_STOP_REPEATS)
    target = shipped.service.target
    boundaries = [len(target.decode(plain.token_ids[:n])) for n in range(1, len(plain.token_ids))]
    text = plain.text
    cut, stop = next(
        (b - 2, text[b - 2 : b + 2])
        for b in boundaries
        if 2 < b <= len(text) - 2 and text.find(text[b - 2 : b + 2]) == b - 2
    )
    assert cut > 0 and len(stop) == 4  # the stop string spans a token boundary
    whole = client.completions.create(model="codespec", prompt=prompt, max_tokens=24, stop=[stop, "never-seen"])
    assert whole.choices[0].text == text[:cut] and whole.choices[0].finish_reason == "stop"
    streamed = list(client.completions.create(model="codespec", prompt=prompt, max_tokens=24, stop=stop, stream=True))
    assert "".join(chunk.choices[0].text for chunk in streamed) == text[:cut]  # nothing past the stop, ever


# ---- cancellation and fairness ----------------------------------------------------------------
def last_request(service: EngineService) -> dict:
    requests = service.snapshot()["last_requests"]
    return requests[-1] if requests else {}


def cancelled_count(service: EngineService) -> int:
    return service.snapshot()["finish_reasons"].get("cancelled", 0)


def test_a_client_that_disconnects_cancels_its_generation(tiny):
    body = {"model": "codespec", "messages": LONG_CHAT, "max_tokens": 2000, "stream": True}
    before = cancelled_count(tiny.service)
    with httpx2.Client(timeout=WAIT_S) as client:
        with client.stream(
            "POST", tiny.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
        ) as response:
            assert response.status_code == 200
            next(response.iter_lines())  # generating
    wait_for(lambda: cancelled_count(tiny.service) > before, "the streamed job to be cancelled")
    wait_for(lambda: tiny.server.door.running == 0, "the request slot to be released")
    assert last_request(tiny.service)["tokens"] < 2000

    before = cancelled_count(tiny.service)
    with pytest.raises(httpx2.TimeoutException):  # a non-streaming client that gives up
        httpx2.post(
            tiny.url + "/v1/chat/completions",
            json={**body, "stream": False},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=0.3,
        )
    wait_for(lambda: cancelled_count(tiny.service) > before, "the waiting job to be cancelled")
    assert last_request(tiny.service)["tokens"] < 2000


def test_a_long_chat_does_not_hold_up_a_short_completion(tiny):
    client = tiny.client()
    first_chunk, long_done = threading.Event(), threading.Event()
    long_tokens = []

    def long_chat() -> None:
        stream = client.chat.completions.create(
            model="codespec", messages=LONG_CHAT, max_tokens=2000, stream=True, stream_options={"include_usage": True}
        )
        for chunk in stream:
            first_chunk.set()
            if chunk.usage is not None:
                long_tokens.append(chunk.usage.completion_tokens)
        long_done.set()

    runner = threading.Thread(target=long_chat)
    runner.start()
    assert first_chunk.wait(WAIT_S)
    short = client.completions.create(model="codespec", prompt="x = ", max_tokens=4)
    running_after_short = not long_done.is_set()
    runner.join(WAIT_S)
    assert short.usage.completion_tokens >= 1
    assert long_tokens and long_tokens[0] > 500  # it was long ...
    assert running_after_short  # ... and the short request finished while it was still running


# ---- errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path, body, code, param",
    [
        ("/v1/completions", {"prompt": 3}, "invalid_type", "prompt"),
        ("/v1/completions", {"max_tokens": 4}, "missing_required_parameter", "prompt"),
        ("/v1/completions", {"prompt": "x", "temperature": "hot"}, "invalid_type", "temperature"),
        ("/v1/completions", {"prompt": "x", "temperature": 2.5}, "invalid_value", "temperature"),
        ("/v1/completions", {"prompt": "x", "top_p": 0}, "invalid_value", "top_p"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "invalid_value", "max_tokens"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 2.5}, "invalid_type", "max_tokens"),
        ("/v1/completions", {"prompt": "x", "stop": [""]}, "invalid_value", "stop"),
        ("/v1/completions", {"prompt": "x", "stop": 7}, "invalid_type", "stop"),
        ("/v1/completions", {"prompt": "x", "n": 2}, "unsupported_parameter", "n"),
        ("/v1/completions", {"prompt": "x", "echo": True}, "unsupported_parameter", "echo"),
        ("/v1/completions", {"prompt": "x", "stream": "yes"}, "invalid_type", "stream"),
        ("/v1/completions", {"prompt": ["a", "b"]}, "unsupported_parameter", "prompt"),
        ("/v1/completions", {"prompt": "x", "proposer": "magic"}, "invalid_value", "proposer"),
        ("/v1/chat/completions", {"messages": []}, "invalid_type", "messages"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "robot", "content": "x"}]},
            "invalid_value",
            "messages[0].role",
        ),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "invalid_type", "messages[0].content"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "no code here"}]},
            "invalid_value",
            "messages",
        ),
        ("/v1/chat/completions", {"messages": LONG_CHAT, "prediction": "text"}, "invalid_type", "prediction"),
        ("/v1/completions", {"prompt": "x", "edits": [{"before": "a"}]}, "invalid_type", "edits"),
        ("/v1/completions", {"prompt": "x", "edits": [{"before": "a", "after": "b"}] * 9}, "invalid_value", "edits"),
        ("/v1/chat/completions", {"messages": LONG_CHAT, "n": 3}, "unsupported_parameter", "n"),
        (
            "/v1/chat/completions",
            {"messages": LONG_CHAT, "tools": [{"type": "function"}]},
            "unsupported_parameter",
            "tools",
        ),
    ],
)
def test_bad_requests_are_400_in_openai_shape(tiny, path, body, code, param):
    assert_error(post(tiny, path, body), 400, code, param)


def test_bad_json_and_non_objects_are_400(tiny):
    assert_error(
        post(tiny, "/v1/completions", content=b"{bad", headers={"Content-Type": "application/json"}),
        400,
        "invalid_json",
    )
    assert_error(post(tiny, "/v1/chat/completions", [1, 2]), 400, "invalid_json")


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_longer_than_the_context_is_400(tiny, stream):
    prompt = " ".join(f"word{i}" for i in range(3000))
    assert len(tiny.service.target.encode(prompt)) > tiny.service.target.max_context
    error = assert_error(
        post(tiny, "/v1/completions", {"prompt": prompt, "stream": stream}), 400, "context_length_exceeded"
    )
    assert "context" in error["message"] and error["param"] == "prompt"  # the endpoint's own field
    with pytest.raises(openai.BadRequestError) as raised:  # the official client sees a plain 400 too
        tiny.client().chat.completions.create(
            model="codespec", messages=[{"role": "user", "content": f"```\n{prompt}\n```"}], stream=stream
        )
    assert raised.value.status_code == 400 and raised.value.code == "context_length_exceeded"
    assert raised.value.param == "messages"
    with pytest.raises(openai.BadRequestError) as raised:
        tiny.client().completions.create(model="codespec", prompt=prompt, stream=stream)
    assert raised.value.code == "context_length_exceeded" and raised.value.param == "prompt"


def test_an_unknown_model_is_openais_404_naming_what_is_served(tiny):
    client = tiny.client()
    served = [model.id for model in client.models.list().data]
    assert "codespec" in served and tiny.service.target.name in served
    for call in (
        lambda: client.completions.create(model="gpt-4o", prompt="x", max_tokens=1),
        lambda: client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}]),
    ):
        with pytest.raises(openai.NotFoundError) as raised:
            call()
        assert raised.value.code == "model_not_found" and raised.value.param == "model"
        assert "'codespec'" in raised.value.message and "--http-any-model" in raised.value.message
    for name in served:  # every listed name is served
        assert client.completions.create(model=name, prompt="x", max_tokens=1).choices


def test_any_model_serves_every_name_with_the_loaded_target(server_target, one_thread):
    service = EngineService(server_target, proposer="none")
    hosted = Hosted(service, HttpLimits(any_model=True))
    try:
        response = hosted.client().completions.create(model="gpt-4o", prompt="def f():", max_tokens=2)
        assert response.model == tiny_name(service) and response.choices[0].text is not None
    finally:
        hosted.close()
        service.close()


def tiny_name(service) -> str:
    return str(service.target.name)


def test_speculation_counts_every_drafted_token_whatever_proposed_it(tiny):
    body = {"prompt": CODE + "\n\n" + CODE[:60], "max_tokens": 40, "proposer": "context"}
    extra = post(tiny, "/v1/completions", body).json()["codespec"]
    speculation, stats = extra["speculation"], extra["stats"]
    assert speculation["drafted_tokens"] == stats["drafted_tokens"] > 0  # context lookup's drafts count
    assert speculation["accepted_tokens"] == stats["accepted_tokens"] <= speculation["drafted_tokens"]
    assert speculation["target_forwards"] == stats["target_forwards"] > 0
    assert speculation["accepted_prediction_tokens"] == 0  # no prediction was sent


def test_every_body_has_one_json_spelling(tiny):
    ok = post(tiny, "/v1/completions", {"prompt": "x", "max_tokens": 1})
    bad = post(tiny, "/v1/completions", {"prompt": "x", "temperature": 3})
    missing = post(tiny, "/v1/nowhere", {})
    for response in (
        ok,
        bad,
        missing,
        httpx2.get(tiny.url + "/v1/models", headers={"Authorization": f"Bearer {TOKEN}"}),
    ):
        assert json.dumps(response.json(), ensure_ascii=False, separators=(",", ":")) == response.text


def test_the_openai_client_raises_its_typed_errors(tiny):
    client = tiny.client()
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model="codespec", prompt="x", temperature=3)
    assert raised.value.param == "temperature" and raised.value.code == "invalid_value"
    with pytest.raises(openai.BadRequestError) as raised:  # the chat endpoint names its own fields
        client.chat.completions.create(model="codespec", messages=[{"role": "user", "content": "x"}], top_p=5)
    assert raised.value.param == "top_p" and raised.value.code == "invalid_value"
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model="codespec", messages=[{"role": "user", "content": "x"}], max_completion_tokens=0
        )
    assert raised.value.param == "max_completion_tokens"
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="codespec", messages=[{"role": "wizard", "content": "x"}])
    assert raised.value.param == "messages[0].role"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=tiny.url + "/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.PermissionDeniedError):
        tiny.client(default_headers={"Origin": "https://evil.example"}).models.list()


def test_unknown_routes_and_methods(tiny):
    assert_error(post(tiny, "/v1/embeddings", {"input": "x"}), 404, "not_found")
    assert_error(httpx2.get(tiny.url + "/", headers={"Authorization": f"Bearer {TOKEN}"}), 404, "not_found")
    response = httpx2.delete(tiny.url + "/v1/models", headers={"Authorization": f"Bearer {TOKEN}"})
    assert_error(response, 405, "method_not_allowed")
    assert "GET" in response.headers["allow"]
    assert_error(httpx2.get(tiny.url + "/v1/completions", headers={"Authorization": f"Bearer {TOKEN}"}), 405)


def test_a_body_over_the_limit_is_413(tiny):
    big = {"prompt": "x" * (LIMITS.max_body_bytes + 10)}
    assert_error(post(tiny, "/v1/completions", big), 413, "request_too_large")

    def chunked():  # no Content-Length: counted while it is read
        for _ in range(20):
            yield b" " * 4096

    assert_error(post(tiny, "/v1/completions", content=chunked()), 413, "request_too_large")


@pytest.mark.parametrize(
    "headers, status",
    [
        ({}, 401),
        ({"Authorization": "Bearer wrong"}, 401),
        ({"Authorization": "Basic " + TOKEN}, 401),
        ({"Authorization": f"Bearer {TOKEN}", "Origin": "https://evil.example"}, 403),
        ({"Origin": "https://evil.example"}, 403),
    ],
)
def test_token_and_origin_refusals(tiny, headers, status):
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions")):
        response = httpx2.request(method, tiny.url + path, headers=headers, json={"prompt": "x"}, timeout=WAIT_S)
        assert_error(response, status, "invalid_api_key" if status == 401 else "origin_not_allowed")
    query = httpx2.get(tiny.url + f"/v1/models?token={TOKEN}", headers=headers)  # no token in URLs over HTTP
    assert query.status_code == status


def test_an_allowed_origin_gets_cors_headers(tiny):
    origin = {"Origin": "https://trusted.example"}
    preflight = httpx2.options(
        tiny.url + "/v1/chat/completions",
        headers={**origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"},
    )
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == "https://trusted.example"
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    response = httpx2.get(tiny.url + "/v1/models", headers={**origin, "Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200 and response.headers["access-control-allow-origin"] == "https://trusted.example"
    assert httpx2.get(tiny.url + "/v1/models", headers=origin).status_code == 401  # still needs the token


def test_a_full_queue_is_429(tiny):
    small = Hosted(tiny.service, HttpLimits(max_requests=1))
    try:
        body = {"model": "codespec", "messages": LONG_CHAT, "max_tokens": 2000, "stream": True}
        with httpx2.Client(timeout=WAIT_S) as client:
            with client.stream(
                "POST", small.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
            ) as response:
                lines = response.iter_lines()  # kept: a dropped line iterator closes the response
                next(lines)  # running
                refused = post(small, "/v1/completions", {"prompt": "x"})
                assert_error(refused, 429, "rate_limit_exceeded")
                assert refused.headers["retry-after"] == "1"
                with pytest.raises(openai.RateLimitError):
                    small.client().completions.create(model="codespec", prompt="x")
        wait_for(lambda: small.server.door.running == 0, "the slot to be released")
        assert (
            small.client().completions.create(model="codespec", prompt="x", max_tokens=2).usage.completion_tokens >= 1
        )
    finally:
        small.close()


# ---- many clients at once ------------------------------------------------------------------------
def test_sixteen_concurrent_clients_with_random_disconnects(tiny):
    rng = random.Random(16)
    plans = [(rng.choice(["completion", "chat"]), rng.choice([True, False]), rng.random() < 0.4) for _ in range(16)]
    assert any(p[2] for p in plans) and not all(p[2] for p in plans)

    async def one(kind: str, stream: bool, leave: bool, number: int) -> str:
        client = openai.AsyncOpenAI(base_url=tiny.url + "/v1", api_key=TOKEN, max_retries=0, timeout=WAIT_S)
        try:
            if kind == "completion":
                kwargs = dict(
                    model="codespec", prompt=f"def f{number}(x):\n    return ", max_tokens=rng.choice([8, 64, 400])
                )
                create = client.completions.create
            else:
                messages = LONG_CHAT if leave else [{"role": "user", "content": f"```\nx{number} = {number}\n```"}]
                kwargs = dict(model="codespec", messages=messages, max_tokens=rng.choice([16, 200, 1500]))
                create = client.chat.completions.create
            if leave and not stream:
                async with httpx2.AsyncClient() as raw:
                    path = "/v1/completions" if kind == "completion" else "/v1/chat/completions"
                    try:
                        await raw.post(
                            tiny.url + path,
                            json={**kwargs, "max_tokens": 2000},
                            headers={"Authorization": f"Bearer {TOKEN}"},
                            timeout=0.05,
                        )
                    except httpx2.TimeoutException:
                        return "left"
                    return "finished before leaving"
            if stream:
                chunks = await create(**kwargs, stream=True)
                async for _ in chunks:
                    if leave:
                        await chunks.close()
                        return "left"
                return "streamed"
            await create(**kwargs)
            return "answered"
        finally:
            await client.close()

    async def everyone():
        return await asyncio.wait_for(asyncio.gather(*(one(*plan, n) for n, plan in enumerate(plans))), WAIT_S)

    outcomes = asyncio.run(everyone())
    assert len(outcomes) == 16 and set(outcomes) <= {"left", "streamed", "answered", "finished before leaving"}
    wait_for(lambda: tiny.server.door.running == 0, "every request slot to be released")
    wait_for(lambda: tiny.service.snapshot()["active_requests"] == 0, "the engine to be idle")
    client = tiny.client()
    assert client.models.list().data
    assert client.completions.create(model="codespec", prompt="y = ", max_tokens=3).usage.completion_tokens >= 1
