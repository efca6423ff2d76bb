"""`codespec serve --http --model ollama:NAME`: a model from Ollama's own store (here the shipped model
exported to GGUF and installed as Ollama installs a pull) answers the official `ollama` client by
that name, on the llama.cpp backend."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import time

import ollama
import pytest
from test_http_serve import WAIT_S, read_until, start_serve

pytest.importorskip("gguf", reason="export needs gguf-py: pip install 'codespec[gguf]'")

pytestmark = pytest.mark.slow  # a subprocess server


def install_in_ollama_store(root, gguf_file, name: str, tag: str) -> None:
    """Ollama's layout: ``blobs/sha256-<digest>`` and a manifest naming it as the model layer."""
    digest = "sha256:" + hashlib.sha256(gguf_file.read_bytes()).hexdigest()
    blob = root / "blobs" / digest.replace(":", "-")
    blob.parent.mkdir(parents=True)
    shutil.copyfile(gguf_file, blob)
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / name / tag
    manifest.parent.mkdir(parents=True)
    layer = {"mediaType": "application/vnd.ollama.image.model", "digest": digest, "size": blob.stat().st_size}
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [layer]}))


def test_the_ollama_client_asks_for_the_model_by_its_ollama_name(tmp_path, monkeypatch):
    from codespec.core.default_model import target_path
    from codespec.core.gguf_export import export_gguf
    from codespec.core.gguf_files import resolve_gguf

    store = tmp_path / "ollama-models"
    install_in_ollama_store(
        store, export_gguf(target_path(), tmp_path / "tiny-q8_0.gguf", "q8_0"), "codespec-tiny", "q8"
    )
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    assert resolve_gguf("ollama:codespec-tiny:q8").parent == store / "blobs"
    pytest.importorskip("llama_cpp", reason="the llama.cpp backend needs: pip install 'codespec[gguf]'")

    token_file = tmp_path / "token"
    process = start_serve(
        "--http", "--http-port", "0", "--model", "ollama:codespec-tiny:q8", "--threads", "1",
        "--token-file", str(token_file),
    )  # fmt: skip
    try:
        http = read_until(process, r"HTTP API on (http://127\.0\.0\.1:\d+)/v1", time.monotonic() + WAIT_S)
        client = ollama.Client(
            host=http.group(1), headers={"Authorization": f"Bearer {token_file.read_text().strip()}"}, timeout=WAIT_S
        )
        listed = client.list().models
        assert listed[0].model == "codespec-tiny:q8" and listed[0].details.format == "gguf"
        response = client.generate(
            model="codespec-tiny:q8", prompt="def add(a, b):\n    return ", suffix="\n", options={"num_predict": 8}
        )
        assert response.done and response.model == "codespec-tiny:q8" and response.eval_count >= 1
        assert client.show("codespec-tiny:q8").details.format == "gguf"
        with pytest.raises(ollama.ResponseError) as unknown:
            client.generate(model="codespec-tiny:f16", prompt="x")
        assert unknown.value.status_code == 404
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=WAIT_S) == 0
