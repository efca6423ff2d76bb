"""Which backend reads a model: the one place a target is loaded from a name or a path, so a new
backend is added here and nowhere else (codespec/target.py has the contract every backend meets).

- a transformers checkpoint directory or cached hub id: ``codespec.model.TargetModel`` (PyTorch);
- a ``.gguf`` file, or ``ollama:NAME[:TAG]``: ``codespec.llama_cpp_target.LlamaCppTarget``
  (llama.cpp's kernels, through llama-cpp-python; docs/gguf.md).
"""

from __future__ import annotations

from codespec.core.errors import InvalidRequestError
from codespec.core.gguf_files import is_gguf_name
from codespec.core.target import Target


def load_target(
    name_or_path: str,
    device: str = "auto",
    dtype: str = "auto",
    prompt_format: str | None = None,
    threads: int | None = None,
    kv_tokens: int | None = None,
    trust_remote_code: bool = False,
) -> Target:
    """The target behind ``name_or_path``, from the backend that reads it. ``threads`` and
    ``kv_tokens`` (KV cells shared by all sequences) apply to llama.cpp; PyTorch's threads are set
    process-wide by the caller, its KV grows per request."""
    if is_gguf_name(name_or_path):
        from codespec.core.llama_cpp_target import LlamaCppTarget

        if device not in ("auto", "cpu"):
            raise InvalidRequestError(f"GGUF models run on the CPU here; device {device!r} is not supported for them")
        if dtype not in ("auto", None):
            raise InvalidRequestError(f"a GGUF file fixes its own types; --dtype {dtype!r} does not apply to it")
        return LlamaCppTarget(name_or_path, threads=threads, kv_tokens=kv_tokens, prompt_format=prompt_format)
    from codespec.core.model import TargetModel

    return TargetModel.load(
        name_or_path, device=device, dtype=dtype, prompt_format=prompt_format, trust_remote_code=trust_remote_code
    )
