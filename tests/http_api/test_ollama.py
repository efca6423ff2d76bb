"""Ollama's API on the HTTP door with the official `ollama` Python client (PyPI), every call as a
user writes it, against a real server on the shipped model (tests/http_api/hosted.py) and, in the
slow test, against `codespec serve --http` as a process: the model's listing and details, generate
with a suffix (fill-in-the-middle), streamed NDJSON, chat, the errors, the token."""

from __future__ import annotations

import json
import signal
import time

import ollama
import pytest
from hosted import CODE, TOKEN, WAIT_S, Hosted, httpx2, plain_output

from codespec.core.prompts import Fim
from codespec.service.engine.service import COMPLETION_STOP_REPEATS, EngineService

FIM_PREFIX, FIM_SUFFIX = "def add(a, b):\n    return ", "\n\n\ndef sub(a, b):\n    return a - b\n"
STREAMED = CODE[:120]  # the shipped model writes 40+ tokens after it before any stop


def client(hosted: Hosted, **kwargs) -> ollama.Client:
    return ollama.Client(host=hosted.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=WAIT_S, **kwargs)


# ---- the model -----------------------------------------------------------------------------------
def test_tags_show_ps_and_version_describe_the_served_model(shipped):
    ollama_client = client(shipped)
    listed = ollama_client.list().models
    assert [model.model for model in listed] == ["codespec:latest", "qwen2.5-coder:codespec"]
    details = listed[0].details
    assert (details.format, details.family, details.quantization_level) == ("safetensors", "llama", "F32")
    assert details.parameter_size.endswith("M") and listed[0].size > 0 and len(listed[0].digest) == 64

    shown = ollama_client.show("codespec")
    assert ".Suffix" in shown.template  # what Continue reads to send prompt + suffix (FIM)
    assert "<|fim_prefix|>{{ .Prompt }}<|fim_suffix|>{{ .Suffix }}<|fim_middle|>" in shown.template
    assert shown.capabilities == ["completion", "insert"]
    context = shipped.service.target.max_context
    assert shown.modelinfo["llama.context_length"] == context
    assert f"num_ctx                        {context}" in shown.parameters.splitlines()
    assert shown.details == details

    running = ollama_client.ps().models
    assert [model.model for model in running] == ["codespec:latest"] and running[0].context_length == context
    assert running[0].expires_at.year > 2100  # kept while the server runs

    version = httpx2.get(shipped.url + "/api/version", headers={"Authorization": f"Bearer {TOKEN}"})
    assert version.status_code == 200 and version.json()["version"].count(".") == 2


def test_show_takes_the_older_name_field(shipped):
    response = httpx2.post(
        shipped.url + "/api/show", json={"name": "codespec"}, headers={"Authorization": f"Bearer {TOKEN}"}
    )  # Continue's spelling
    assert response.status_code == 200 and response.json()["capabilities"] == ["completion", "insert"]


# ---- generate --------------------------------------------------------------------------------------
def test_generate_with_a_suffix_fills_the_middle_as_the_engine_does(shipped):
    response = client(shipped).generate(
        model="codespec", prompt=FIM_PREFIX, suffix=FIM_SUFFIX, options={"num_predict": 16}
    )
    rendered = shipped.service.prompts.render(Fim(FIM_PREFIX, FIM_SUFFIX)).text
    plain = plain_output(shipped.service, rendered, 16, repeats=COMPLETION_STOP_REPEATS)
    assert response.response == plain.text and response.response  # lossless: plain greedy decoding's text
    assert response.done and response.done_reason in ("stop", "length") and response.model == "codespec"
    assert response.eval_count == len(plain.token_ids)
    assert response.prompt_eval_count == len(shipped.service.target.encode(rendered))
    assert response.total_duration >= response.prompt_eval_duration + response.eval_duration > 0
    # the same request through the OpenAI door answers the same text
    openai_text = shipped.client().completions.create(
        model="codespec", prompt=FIM_PREFIX, suffix=FIM_SUFFIX, max_tokens=16
    )
    assert openai_text.choices[0].text == response.response


def test_generate_streams_ndjson_token_by_token(shipped):
    ollama_client = client(shipped)
    chunks = list(
        ollama_client.generate(model="codespec", prompt=STREAMED, raw=True, stream=True, options={"num_predict": 48})
    )
    *pieces, last = chunks
    assert len(pieces) >= 8  # text goes out as the engine yields it, not at the end
    assert all(not piece.done and piece.response for piece in pieces)
    assert last.done and last.response == "" and last.done_reason == "length" and last.eval_count == 48
    assert last.prompt_eval_count == len(shipped.service.target.encode(STREAMED))
    whole = ollama_client.generate(model="codespec", prompt=STREAMED, raw=True, options={"num_predict": 48})
    assert "".join(piece.response for piece in pieces) == whole.response
    assert whole.response == plain_output(shipped.service, STREAMED, 48, repeats=COMPLETION_STOP_REPEATS).text

    # on the wire: one JSON object a line, each line sent as it is ready (a first request again: with
    # the session's history kept, it drafts the answer the two above wrote, in fewer, larger pieces)
    shipped.service.clear_history().result(WAIT_S)
    with httpx2.stream(
        "POST",
        shipped.url + "/api/generate",
        json={
            "model": "codespec",
            "prompt": STREAMED,
            "raw": True,
            "options": {"num_predict": 48},
        },  # stream by default
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=WAIT_S,
    ) as response:
        assert response.headers["content-type"] == "application/x-ndjson"
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert len(lines) >= 9 and [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]
    assert {"total_duration", "load_duration", "prompt_eval_count", "eval_count", "eval_duration"} <= set(lines[-1])


def test_an_empty_prompt_loads_the_model(shipped):
    response = client(shipped).generate(model="codespec")
    assert response.done and response.done_reason == "load" and response.response == ""


# ---- chat --------------------------------------------------------------------------------------------
def test_chat_streamed_and_not(shipped):
    ollama_client = client(shipped)
    messages = [{"role": "user", "content": f"Rename values to items:\n```\n{CODE}```"}]
    answer = ollama_client.chat(model="codespec:latest", messages=messages, options={"num_predict": 64})
    assert answer.message.role == "assistant" and answer.message.content.startswith("def scale(")
    assert answer.done and answer.eval_count >= 8 and answer.prompt_eval_count > 0

    chunks = list(ollama_client.chat(model="codespec", messages=messages, stream=True, options={"num_predict": 64}))
    *pieces, last = chunks
    assert len(pieces) >= 2 and last.done and last.message.content == "" and last.eval_count == answer.eval_count
    assert "".join(piece.message.content for piece in pieces) == answer.message.content


# ---- errors and the token -------------------------------------------------------------------------------
def test_errors_are_ollamas(shipped):
    ollama_client = client(shipped)
    with pytest.raises(ollama.ResponseError) as unknown:
        ollama_client.generate(model="llama3.2", prompt="x")
    assert unknown.value.status_code == 404 and unknown.value.error.startswith("model 'llama3.2' not found")
    with pytest.raises(ollama.ResponseError) as unknown_show:
        ollama_client.show("llama3.2")
    assert unknown_show.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as options:
        ollama_client.generate(model="codespec", prompt="x", options={"temperature": "hot"})
    assert options.value.status_code == 400 and "options.temperature" in options.value.error
    with pytest.raises(ollama.ResponseError) as penalty:
        ollama_client.chat(
            model="codespec", messages=[{"role": "user", "content": "x"}], options={"repeat_penalty": 1.2}
        )
    assert penalty.value.status_code == 400 and "options.repeat_penalty" in penalty.value.error
    with pytest.raises(ollama.ResponseError) as structured:
        ollama_client.generate(model="codespec", prompt="x", format="json")
    assert structured.value.status_code == 400 and structured.value.error.startswith("format:")
    with pytest.raises(ollama.ResponseError) as streamed:  # refused before the stream starts
        list(ollama_client.generate(model="codespec", prompt="x", stream=True, options={"top_k": -1}))
    assert streamed.value.status_code == 400 and "options.top_k" in streamed.value.error
    sampled = ollama_client.generate(
        model="codespec", prompt="def f(", options={"top_k": 5, "temperature": 0.8, "seed": 3, "num_predict": 8}
    )
    assert sampled.done and sampled.eval_count >= 1  # top-k sampling runs (the engine's sampler has it)


def test_the_token_is_required_and_ollama_api_key_sends_it(shipped, monkeypatch):
    monkeypatch.delenv("OLLAMA_API_KEY", raising=False)
    with pytest.raises(ollama.ResponseError) as missing:
        ollama.Client(host=shipped.url).list()
    assert missing.value.status_code == 401
    assert missing.value.error.startswith("missing token")  # Ollama's {"error": "..."}, not OpenAI's object
    monkeypatch.setenv("OLLAMA_API_KEY", TOKEN)  # the client sends it as Authorization: Bearer
    assert ollama.Client(host=shipped.url).list().models[0].model == "codespec:latest"


def test_a_model_from_ollamas_store_answers_to_its_ollama_name(one_thread):
    """`--model ollama:NAME` names the target ``ollama:NAME``: the door lists NAME and serves it."""
    from codespec.core.default_model import target_path
    from codespec.core.model import TargetModel

    target = TargetModel.load(str(target_path()), device="cpu")
    target.name = "ollama:qwen2.5-coder:0.5b"  # what load_target names a model it read from Ollama's store
    service = EngineService(target, proposer="auto", max_draft=8)
    hosted = Hosted(service)
    try:
        ollama_client = client(hosted)
        assert ollama_client.list().models[0].model == "qwen2.5-coder:0.5b"
        response = ollama_client.generate(
            model="qwen2.5-coder:0.5b", prompt=FIM_PREFIX, suffix="\n", options={"num_predict": 4}
        )
        assert response.done and response.model == "qwen2.5-coder:0.5b"
        assert ollama_client.show("codespec").capabilities == ["completion", "insert"]  # the alias still answers
    finally:
        hosted.close()
        service.close()


@pytest.mark.slow  # a subprocess server
def test_ollama_client_against_codespec_serve(tmp_path, monkeypatch):
    from test_http_serve import read_until, start_serve

    token_file = tmp_path / "token"
    process = start_serve("--http", "--http-port", "0", "--threads", "1", "--token-file", str(token_file))
    try:
        http = read_until(process, r"HTTP API on (http://127\.0\.0\.1:\d+)/v1", time.monotonic() + WAIT_S)
        monkeypatch.setenv("OLLAMA_API_KEY", token_file.read_text().strip())
        ollama_client = ollama.Client(host=http.group(1), timeout=WAIT_S)
        assert "codespec:latest" in [model.model for model in ollama_client.list().models]
        response = ollama_client.generate(
            model="codespec", prompt=FIM_PREFIX, suffix=FIM_SUFFIX, options={"num_predict": 8}
        )
        assert response.done and response.eval_count >= 1
        chunks = list(
            ollama_client.generate(
                model="codespec", prompt=STREAMED, raw=True, stream=True, options={"num_predict": 24}
            )
        )
        assert len(chunks) >= 4 and chunks[-1].done and chunks[-1].eval_count == 24
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=WAIT_S) == 0
