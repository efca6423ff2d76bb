"""Where a GGUF model is: a file path (llama.cpp's cache, LM Studio's folders) or an Ollama name.

``ollama:NAME[:TAG]`` reads Ollama's manifest for the name (``manifests/<registry>/<namespace>/
<name>/<tag>``, ``library`` and ``latest`` by default) and returns the blob its model layer names;
the models directory is ``$OLLAMA_MODELS`` or ``~/.ollama/models`` (docs/gguf.md, "Model files").
A file is checked for GGUF's magic bytes before llama.cpp sees it, so a wrong or truncated file is
one clear error, not a crash in the loader.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from codespec.core.errors import CodespecError, ModelNotFoundError

GGUF_MAGIC = b"GGUF"
OLLAMA_PREFIX = "ollama:"
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY = "registry.ollama.ai"


class BadModelFileError(CodespecError):
    """A file that is not a GGUF model llama.cpp can load (the message says what is wrong)."""


def is_gguf_name(name_or_path: str) -> bool:
    """Whether ``name_or_path`` names a GGUF model (a ``.gguf`` path or an Ollama name)."""
    text = str(name_or_path)
    return text.startswith(OLLAMA_PREFIX) or text.lower().endswith(".gguf") or _has_magic(Path(text).expanduser())


def _has_magic(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(4) == GGUF_MAGIC
    except OSError:
        return False


def resolve_gguf(name_or_path: str) -> Path:
    """The GGUF file behind a path or an ``ollama:`` name, checked to start like a GGUF file."""
    text = str(name_or_path)
    path = resolve_ollama(text[len(OLLAMA_PREFIX) :]) if text.startswith(OLLAMA_PREFIX) else Path(text).expanduser()
    if not path.is_file():
        raise ModelNotFoundError(f"no GGUF file at {path.resolve()}")
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(8)
    if head[:4] != GGUF_MAGIC:
        raise BadModelFileError(f"{path} is not a GGUF file (it starts with {head[:4]!r}, not b'GGUF')")
    if size < 32:
        raise BadModelFileError(f"{path} is truncated ({size} bytes)")
    return path


def ollama_models_dir() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models").expanduser()


def resolve_ollama(name: str) -> Path:
    """The model blob of Ollama's ``NAME[:TAG]`` (``namespace/name`` and ``host/namespace/name`` too)."""
    if not name:
        raise ModelNotFoundError("ollama: needs a model name, e.g. ollama:qwen2.5-coder:0.5b")
    base, _, tag = name.partition(":")
    parts = base.split("/")
    registry, namespace = OLLAMA_REGISTRY, "library"
    if len(parts) == 3:
        registry, namespace, model = parts
    elif len(parts) == 2:
        namespace, model = parts
    else:
        model = parts[0]
    root = ollama_models_dir()
    manifest = root / "manifests" / registry / namespace / model / (tag or "latest")
    if not manifest.is_file():
        known = sorted(
            f"{entry.parent.name}:{entry.name}"
            for entry in (root / "manifests" / registry / namespace).glob("*/*")
            if entry.is_file()
        )
        listing = f"; installed: {', '.join(known)}" if known else "; no Ollama models are installed there"
        raise ModelNotFoundError(f"Ollama model {name!r} not found: no manifest at {manifest}{listing}")
    try:
        layers = json.loads(manifest.read_text())["layers"]
        digest = next(layer["digest"] for layer in layers if layer.get("mediaType") == OLLAMA_MODEL_LAYER)
    except (ValueError, KeyError, StopIteration, TypeError):
        raise BadModelFileError(f"Ollama manifest {manifest} names no model layer") from None
    return root / "blobs" / digest.replace(":", "-")
