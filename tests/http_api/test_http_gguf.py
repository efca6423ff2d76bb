"""`codespec serve --http --model FILE.gguf`: the OpenAI-compatible door on the llama.cpp backend,
through the official client (the model listed by its path, a rewrite completion, the same text
again from the cached prompt)."""

from __future__ import annotations

import signal

import openai
import pytest
from test_http_serve import WAIT_S, read_until, start_serve

pytest.importorskip("llama_cpp", reason="the llama.cpp backend needs: pip install 'codespec[gguf]'")
pytest.importorskip("gguf", reason="export needs gguf-py: pip install 'codespec[gguf]'")

pytestmark = pytest.mark.slow  # a subprocess server


def test_the_openai_client_against_a_gguf_model(tmp_path):
    import time

    from codespec.core.default_model import target_path
    from codespec.core.gguf_export import export_gguf

    model = export_gguf(target_path(), tmp_path / "default-q8_0.gguf", "q8_0")
    token_file = tmp_path / "token"
    process = start_serve(
        "--http", "--http-port", "0", "--model", str(model), "--threads", "1", "--token-file", str(token_file)
    )
    try:
        deadline = time.monotonic() + WAIT_S
        http = read_until(process, r"HTTP API on (http://127\.0\.0\.1:\d+/v1)  token written to (\S+)", deadline)
        client = openai.OpenAI(base_url=http.group(1), api_key=token_file.read_text().strip(), max_retries=0)
        assert client.models.list().data[0].id == str(model)
        prompt = "<|file_sep|>original.py\ndef add(a, b):\n    return a + b\n<|file_sep|>edited.py\n"
        plain = client.completions.create(model="codespec", prompt=prompt, max_tokens=16, temperature=0)
        assert plain.usage.completion_tokens >= 1 and plain.choices[0].text
        again = client.completions.create(model="codespec", prompt=prompt, max_tokens=16, temperature=0)
        assert again.choices[0].text == plain.choices[0].text  # greedy: the same text, from the cached prompt
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=WAIT_S) == 0
