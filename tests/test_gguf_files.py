"""Finding GGUF files (paths, Ollama names) and the one-line errors for files that are not models."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from codespec.commands.cli import main
from codespec.core.errors import ModelNotFoundError
from codespec.core.gguf_files import BadModelFileError, is_gguf_name, resolve_gguf, resolve_ollama


def fake_gguf(path: Path, size: int = 64) -> Path:
    path.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + bytes(size - 8))
    return path


def install_ollama(root: Path, name: str, tag: str, blob: bytes, namespace: str = "library") -> Path:
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    blob_path = root / "blobs" / digest.replace(":", "-")
    blob_path.parent.mkdir(parents=True, exist_ok=True)
    blob_path.write_bytes(blob)
    manifest = root / "manifests" / "registry.ollama.ai" / namespace / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    layers = [
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64},
        {"mediaType": "application/vnd.ollama.image.model", "digest": digest},
    ]
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    return blob_path


def test_names_that_are_gguf(tmp_path):
    assert is_gguf_name("ollama:qwen2.5-coder:0.5b")
    assert is_gguf_name("/models/x.GGUF")
    assert is_gguf_name(str(fake_gguf(tmp_path / "no-suffix")))  # by its magic bytes
    assert not is_gguf_name(str(tmp_path))  # a directory: transformers
    assert not is_gguf_name("Qwen/Qwen2.5-Coder-0.5B")


def test_ollama_names_resolve_to_their_model_blob(tmp_path, monkeypatch):
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path))
    blob = install_ollama(tmp_path, "qwen2.5-coder", "0.5b", b"GGUF" + bytes(60))
    latest = install_ollama(tmp_path, "qwen2.5-coder", "latest", b"GGUF" + bytes(61))
    mine = install_ollama(tmp_path, "coder", "q8", b"GGUF" + bytes(62), namespace="someone")
    assert resolve_ollama("qwen2.5-coder:0.5b") == blob
    assert resolve_ollama("qwen2.5-coder") == latest
    assert resolve_ollama("someone/coder:q8") == mine
    assert resolve_gguf("ollama:qwen2.5-coder:0.5b") == blob


def test_a_missing_ollama_name_lists_what_is_installed(tmp_path, monkeypatch):
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path))
    install_ollama(tmp_path, "qwen2.5-coder", "0.5b", b"GGUF" + bytes(60))
    with pytest.raises(ModelNotFoundError, match=r"'llama3:8b' not found.*installed: qwen2.5-coder:0.5b"):
        resolve_ollama("llama3:8b")


def test_files_that_are_not_gguf(tmp_path):
    (tmp_path / "notes.gguf").write_text("hello")
    with pytest.raises(BadModelFileError, match="not a GGUF file"):
        resolve_gguf(str(tmp_path / "notes.gguf"))
    with pytest.raises(ModelNotFoundError, match="no GGUF file"):
        resolve_gguf(str(tmp_path / "missing.gguf"))
    (tmp_path / "tiny.gguf").write_bytes(b"GGUF\x03")
    with pytest.raises(BadModelFileError, match="truncated"):
        resolve_gguf(str(tmp_path / "tiny.gguf"))


def run_cli(args: list[str], capsys) -> tuple[int, str]:
    status = main(args)
    return status, capsys.readouterr().err


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: (d / "text.gguf").write_text("hello") and d / "text.gguf", "is not a GGUF file"),
        (lambda d: d / "missing.gguf", "no GGUF file at"),
    ],
)
def test_the_cli_says_one_line_and_exits_non_zero(tmp_path, capsys, make, message):
    status, err = run_cli(["generate", "--model", str(make(tmp_path)), "--prompt", "x"], capsys)
    assert status == 2
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_an_unknown_ollama_name_on_the_cli(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path))
    status, err = run_cli(["generate", "--model", "ollama:nothing:7b", "--prompt", "x"], capsys)
    assert status == 2 and "Ollama model 'nothing:7b' not found" in err and err.count("\n") == 1


def test_llama_cpp_refusals_are_one_line(tmp_path, capsys):
    pytest.importorskip("llama_cpp", reason="needs llama-cpp-python: pip install 'codespec[gguf]'")
    gguf = pytest.importorskip("gguf")
    import numpy as np

    from codespec.core.default_model import target_path
    from codespec.core.gguf_export import export_gguf

    writer = gguf.GGUFWriter(str(tmp_path / "foo.gguf"), "foo")  # an architecture llama.cpp does not know
    writer.add_block_count(1)
    writer.add_tensor("x", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    status, err = run_cli(["generate", "--model", str(tmp_path / "foo.gguf"), "--prompt", "x"], capsys)
    assert status == 2 and "unknown model architecture: 'foo'" in err and err.count("\n") == 1

    whole = export_gguf(target_path(), tmp_path / "whole.gguf", "q8_0")
    (tmp_path / "cut.gguf").write_bytes(whole.read_bytes()[:100_000])  # a download that stopped
    status, err = run_cli(["generate", "--model", str(tmp_path / "cut.gguf"), "--prompt", "x"], capsys)
    assert status == 2 and "truncated or damaged" in err and err.count("\n") == 1
