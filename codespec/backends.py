"""Which backend reads a model: the one place a target is loaded from a name or a path, so a new
backend (llama.cpp for GGUF files, a served engine) is added here and nowhere else
(codespec/target.py has the contract every backend meets)."""

from __future__ import annotations

from codespec.target import Target


def load_target(
    name_or_path: str, device: str = "auto", dtype: str = "auto", prompt_format: str | None = None
) -> Target:
    """The target behind ``name_or_path``, from the backend that reads it: a transformers model
    directory or hub id (``codespec.model.TargetModel``) is the one today. Callers that load a
    target (the service's runtime) come through here, so a new backend is added in one place."""
    from codespec.model import TargetModel

    return TargetModel.load(name_or_path, device=device, dtype=dtype, prompt_format=prompt_format)
