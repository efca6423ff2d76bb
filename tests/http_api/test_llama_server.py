"""llama.cpp server's API on the HTTP door (http_api/llama_server.py), against a real server on the
shipped model: the requests llama.vim sent in a recorded run (data/llama_vim_record.json, written by
bench/llama_vim.py) replayed with what the plugin needs of each answer, input_extra as drafting
material (the output does not change), and bad input answered with a 4xx naming the field."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from hosted import CODE, TOKEN, WAIT_S, assert_error, httpx2, post

from codespec.http_api.llama_schema import select_fields
from codespec.http_api.llama_server import Cutoff

RECORD = json.loads((Path(__file__).parent / "data/llama_vim_record.json").read_text())
LLAMA_VIM_BODY = next(e["body"] for e in RECORD["exchanges"] if e["body"].get("n_predict"))


def get(hosted, path: str, token: str | None = TOKEN) -> httpx2.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx2.get(hosted.url + path, headers=headers, timeout=WAIT_S)


# ---- the recorded llama.vim run, replayed ------------------------------------------------------
def test_the_recorded_run_showed_ghost_text_and_accepted_it():
    outcome = RECORD["outcome"]
    assert outcome["failure"] is None
    shown = outcome["ghost_text"]["first_line"]
    assert shown and any(shown in line for line in outcome["accepted_lines"])
    assert all(exchange["status"] == 200 for exchange in RECORD["exchanges"])


@pytest.mark.parametrize("number", range(len(RECORD["exchanges"])))
def test_llama_vim_requests_get_what_the_plugin_reads(shipped, number):
    exchange = RECORD["exchanges"][number]
    assert exchange["headers"]["Authorization"] == "Bearer <token>"  # llama.vim sends its api_key as a bearer token
    response = post(shipped, exchange["path"], exchange["body"])
    assert response.status_code == exchange["status"] == 200, response.text
    fields = exchange["body"].get("response_fields") or []
    body = response.json()
    assert set(body) <= set(fields), body  # response_fields: only those, under their paths
    if not exchange["body"]["n_predict"]:  # the ring buffer's hand-over of chunks: nothing to show
        assert body == {}
        return
    # s:fim_on_response's quick checks on the raw text, then what s:fim_render reads
    assert re.match(r"^\s*{", response.text) and re.search(r'"content"\s*:"', response.text), response.text
    assert isinstance(body["content"], str)
    for key in RECORD["read_by_plugin"][1:7]:
        assert isinstance(body[key], (int, float)) and not isinstance(body[key], bool), key
    assert isinstance(body["tokens_cached"], int) and isinstance(body["truncated"], bool)
    # Greedy and lossless: the same request gives the text the plugin showed in the recorded run.
    assert body["content"] == exchange["response"]["content"]


def test_the_recorded_requests_carry_input_extra():
    chunks = [len(e["body"].get("input_extra") or []) for e in RECORD["exchanges"]]
    assert max(chunks) >= 1


# ---- input_extra: drafting material, not prompt text -------------------------------------------
def test_input_extra_drafts_without_changing_the_output(shipped):
    prefix, rest = CODE[: CODE.index("    for value")], CODE[CODE.index("    for value") :]
    body = {**LLAMA_VIM_BODY, "input_prefix": prefix, "prompt": "", "input_suffix": "", "response_fields": []}
    body.update(n_predict=48, n_indent=0, t_max_predict_ms=0)
    plain = post(shipped, "/infill", {**body, "input_extra": []}).json()
    extra = [{"filename": "scale.py", "text": CODE}, {"filename": "other.py", "text": rest}]
    drafted = post(shipped, "/infill", {**body, "input_extra": extra}).json()
    assert drafted["content"] == plain["content"]
    assert plain["codespec"]["material_tokens"] == 0 < drafted["codespec"]["material_tokens"]


def test_n_predict_zero_takes_the_chunks_and_generates_nothing(shipped):
    body = {"input_extra": [{"filename": "a.py", "text": CODE}], "n_predict": 0}
    answer = post(shipped, "/infill", body).json()
    assert answer["content"] == "" and answer["tokens_predicted"] == 0 and answer["codespec"]["material_tokens"] > 0


def test_new_chunks_go_once_into_the_workspace_session_history(server_target, one_thread):
    from hosted import Hosted

    from codespec.index import WorkspaceIndex
    from codespec.service.engine.service import EngineService

    service = EngineService(server_target, proposer="auto", max_draft=8)
    index = WorkspaceIndex(server_target.tokenizer, db_path=None)
    service.call(lambda: service.attach_index(index)).result()
    hosted = Hosted(service)
    try:
        chunks = [{"filename": "a.py", "text": "def alpha():\n    return 1\n"}]
        for _ in range(2):  # the plugins resend their chunks with every request
            assert post(hosted, "/infill", {"input_extra": chunks, "n_predict": 0}).status_code == 200
        entries = service.call(lambda: index.history_entries("input_extra")).result()
        expected = tuple(server_target.tokenizer.encode(chunks[0]["text"], add_special_tokens=False))
        assert [entry.token_ids for entry in entries] == [expected]
    finally:
        hosted.close()
        service.close()


# ---- the other endpoints -----------------------------------------------------------------------
def test_completion_health_props_tokenize(shipped):
    completion = post(shipped, "/completion", {"prompt": "def add(a, b):\n", "n_predict": 8}).json()
    assert isinstance(completion["content"], str) and completion["stop"] is True
    assert completion["tokens_predicted"] <= 8 and completion["stop_type"] in ("eos", "limit", "word")
    assert get(shipped, "/health").json() == {"status": "ok"}
    props = get(shipped, "/props").json()
    assert props["default_generation_settings"]["n_ctx"] == shipped.service.target.max_context
    tokens = post(shipped, "/tokenize", {"content": "def add(a, b):"}).json()["tokens"]
    assert tokens == shipped.service.target.encode("def add(a, b):")
    pieces = post(shipped, "/tokenize", {"content": "def add", "with_pieces": True}).json()["tokens"]
    assert "".join(piece["piece"] for piece in pieces) == "def add"
    assert post(shipped, "/detokenize", {"tokens": tokens}).json() == {"content": "def add(a, b):"}


def test_streamed_infill_sends_content_events_then_the_result(shipped):
    body = {**LLAMA_VIM_BODY, "stream": True, "n_predict": 16, "n_indent": 0, "t_max_predict_ms": 0}
    with httpx2.stream(
        "POST", shipped.url + "/infill", json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=WAIT_S
    ) as response:
        assert response.status_code == 200
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1]["stop"] is True and all(event["stop"] is False for event in events[:-1])
    assert "".join(event["content"] for event in events[:-1]) == events[-1]["content"]


def test_the_token_is_required(shipped):
    assert get(shipped, "/health", token=None).status_code == 401
    assert post(shipped, "/infill", LLAMA_VIM_BODY, headers={"Authorization": "Bearer wrong"}).status_code == 401


# ---- bad input: 4xx JSON naming the field ------------------------------------------------------
@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/infill", {"input_prefix": 3}, "input_prefix"),
        ("/infill", {"input_extra": "text"}, "input_extra"),
        ("/infill", {"input_extra": [{"filename": "a"}]}, "input_extra[0]"),
        ("/infill", {"input_extra": [{"text": "x"}] * 65}, "input_extra"),
        ("/infill", {"prompt": [1, 2]}, "prompt"),
        ("/infill", {"n_predict": -2}, "n_predict"),
        ("/infill", {"n_predict": "many"}, "n_predict"),
        ("/infill", {"n_indent": -1}, "n_indent"),
        ("/infill", {"t_max_predict_ms": "soon"}, "t_max_predict_ms"),
        ("/infill", {"samplers": ["dry"]}, "samplers"),
        ("/infill", {"samplers": "top_k"}, "samplers"),
        ("/infill", {"temperature": 0.5, "samplers": ["top_k", "temperature"], "top_k": -1}, "top_k"),
        ("/infill", {"temperature": 0.5, "n_cmpl": 3}, "n_cmpl"),
        ("/infill", {"repeat_penalty": 1.1}, "repeat_penalty"),
        ("/infill", {"grammar": "root ::= x"}, "grammar"),
        ("/infill", {"lora": [{"id": 0, "scale": 0.5}]}, "lora"),
        ("/infill", {"response_fields": "content"}, "response_fields"),
        ("/infill", {"stream": "yes"}, "stream"),
        ("/infill", {"input_prefix": "\ud800"}, "input_prefix"),
        ("/completion", {"n_predict": 4}, "prompt"),
        ("/completion", {"prompt": [1, 2, 3]}, "prompt"),
        ("/completion", {"prompt": "x", "top_p": 0}, "top_p"),
        ("/tokenize", {}, "content"),
        ("/tokenize", {"content": "x", "with_pieces": "yes"}, "with_pieces"),
        ("/detokenize", {"tokens": [1, "a"]}, "tokens"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
    ],
)
def test_bad_input_is_400_naming_the_field(shipped, path, body, param):
    raw = json.dumps(body)  # ASCII JSON: a lone surrogate is spelled \\ud800, as a client may send it
    headers = {"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    assert_error(httpx2.post(shipped.url + path, content=raw, headers=headers, timeout=WAIT_S), 400, param=param)


@pytest.mark.parametrize("path", ["/infill", "/completion", "/tokenize", "/detokenize"])
@pytest.mark.parametrize("raw", [b"", b"not json", b"[1, 2]", b'"text"', b"{"])
def test_a_body_that_is_not_a_json_object_is_400(shipped, path, raw):
    headers = {"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    assert_error(httpx2.post(shipped.url + path, content=raw, headers=headers, timeout=WAIT_S), 400, "invalid_json")


def test_wrong_methods_are_405(shipped):
    assert_error(get(shipped, "/infill"), 405)
    assert_error(post(shipped, "/health", {}), 405)


def test_seeded_junk_in_every_field_is_never_a_5xx(shipped):
    """Each field of llama.vim's request replaced by junk of another type (seeded): a 4xx or a 200."""
    junk = [None, -1, 0, 2**40, 1.5, float("nan"), True, "", "x" * 300, [], [1], ["a"], {}, {"a": [1]}]
    rng = random.Random(50)
    statuses = []
    for _ in range(60):
        body = dict(LLAMA_VIM_BODY, n_predict=4, t_max_predict_ms=0)
        for key in rng.sample(sorted(body), 2):
            body[key] = rng.choice(junk)
        path = rng.choice(["/infill", "/completion"])
        raw = json.dumps(body, allow_nan=True)  # NaN as JSON allows it (Python writes it; a client may)
        response = httpx2.post(
            shipped.url + path,
            content=raw,
            headers={"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
            timeout=WAIT_S,
        )
        statuses.append(response.status_code)
        assert response.status_code < 500, (path, body, response.text)
        if response.status_code >= 400:
            assert set(response.json()) == {"error"}
    assert 200 in statuses and any(400 <= status < 500 for status in statuses)


# ---- pure parts --------------------------------------------------------------------------------
def test_cutoff_n_indent_cuts_before_a_line_indented_less():
    cutoff = Cutoff(n_indent=4, t_max_predict_ms=0)
    kept = [cutoff.add(delta, 0.0) for delta in ["x = 1\n", "    y = 2\n", "  z", " = 3\n"]]
    assert cutoff.cut and cutoff.text == "x = 1\n    y = 2\n  "
    assert "".join(kept) == cutoff.text and cutoff.add("more", 0.0) == ""


def test_cutoff_time_limit_ends_at_the_first_newline_past_it():
    cutoff = Cutoff(n_indent=0, t_max_predict_ms=100)
    cutoff.add("a", 0.0)
    cutoff.add("b", 0.5)  # past the limit, no newline yet: goes on
    assert not cutoff.cut
    cutoff.add("c\nd", 0.6)
    assert cutoff.cut and cutoff.text == "abc\nd"


def test_response_fields_pick_paths_as_keys():
    body = {"content": "x", "timings": {"prompt_n": 3}, "truncated": False}
    assert select_fields(body, ("content", "timings/prompt_n", "missing", "timings/none")) == {
        "content": "x",
        "timings/prompt_n": 3,
    }
    assert select_fields(body, ("",)) == {} and select_fields(body, ()) == body
