"""The OpenAI-compatible HTTP API with the official `openai` client against a real server
(tests/http_api/hosted.py): models, completions and chat, streaming, cancellation and fairness.

The tiny random model where only the plumbing matters; the shipped default model where the real
copying behaviour matters (FIM in its format, chat with a prediction it repeats, stop strings over
readable text).
"""

from __future__ import annotations

import threading

import pytest
from hosted import (
    CODE,
    LONG_CHAT,
    TOKEN,
    WAIT_S,
    Hosted,
    cancelled_count,
    httpx2,
    last_request,
    plain_output,
    wait_for,
)

from codespec.core.prompts import Fim
from codespec.service.engine.service import COMPLETION_STOP_REPEATS, EngineService


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
    from codespec.service.requests.edit_history import EditHistory
    from codespec.service.requests.next_edit import next_edit_request

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
    from codespec.core.model import TargetModel

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
