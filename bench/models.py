"""The bench's target and draft: a model directory, or a random-weight model of a named shape
(a Llama of the project's sizes, or a real code model's published configuration: bench/shapes.py).

Random weights are valid for replay timing (design.md §3: compute cost depends on the shape, the
choice is forced). A shaped model uses the shipped default model's tokenizer, so token counts are
the product's; a build without the default model trains a 4k byte-level BPE on standard-library
source (a few seconds) instead. Everything stays in memory except a shaped draft, which is written
to a temporary directory because the draft proposer loads its model from a path.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bench.shapes import PUBLISHED, SHAPE_NAMES
from codespec.core.errors import CodespecError

if TYPE_CHECKING:
    from codespec.core.model import TargetModel

log = logging.getLogger(__name__)


@dataclass
class BenchModels:
    target: TargetModel
    draft_path: str | None  # for the codespec draft proposer
    draft_hf: object | None  # the same draft as a transformers model, for hf-assisted
    description: str
    draft_description: str | None


def bench_tokenizer():
    """The default model's tokenizer (random-weight shapes use its ids)."""
    from transformers import AutoTokenizer

    from codespec.core.default_model import target_path

    path = target_path()
    return AutoTokenizer.from_pretrained(path, local_files_only=True), f"default model tokenizer ({path.name})"


def random_target(
    shape: str, tokenizer, device: str = "auto", dtype: str = "auto", seed: int = 0, max_context: int = 16384
):
    from bench.shapes import random_llama, random_published
    from codespec.core.model import TargetModel, resolve_device, resolve_dtype

    if shape not in SHAPE_NAMES:
        raise CodespecError(f"unknown model shape {shape!r}; choose one of {', '.join(SHAPE_NAMES)}")
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    if shape in PUBLISHED:  # the published vocabulary; the tokenizer's ids are its first rows
        model = random_published(shape, seed, tokenizer.eos_token_id, torch_device, torch_dtype, max_context)
        return TargetModel(model, tokenizer, name=f"random-{shape}")
    model = random_llama(shape, len(tokenizer), seed=seed, max_context=max_context, eos_token_id=tokenizer.eos_token_id)
    model = model.to(device=torch_device, dtype=torch_dtype)
    return TargetModel(model, tokenizer, name=f"random-llama-{shape}")


def shape_description(shape: str) -> str:
    if shape in PUBLISHED:
        spec = PUBLISHED[shape]
        tied = "tied" if spec.config.get("tie_word_embeddings") else "untied"
        return (
            f"random-weight {spec.model_type} of the published {shape} configuration "
            f"(vocabulary {spec.vocab_size:,}, {tied} embeddings)"
        )
    return f"random-weight Llama, shape {shape}"


def load_models(
    model: str | None, shape: str | None, draft: str | None, device: str, dtype: str, need_draft: bool
) -> BenchModels:
    """``--model`` / ``--model-shape`` and ``--draft`` (a path, or a shape name for a random draft)."""
    from codespec.core.default_model import draft_path as default_draft
    from codespec.core.model import TargetModel

    if shape is not None:
        tokenizer, where = bench_tokenizer()
        target = random_target(shape, tokenizer, device, dtype)
        description = f"{shape_description(shape)} ({_params(target)}), tokenizer: {where}"
    else:
        from codespec.core.default_model import target_path

        path = model or str(target_path())
        # dense weights kept: transformers' peers run the same model with PyTorch's linear
        target = TargetModel.load(path, device=device, dtype=dtype, release_dense=False)
        description = f"{path} ({_params(target)}{_weights_digest(path)})"
    draft_path = None
    if draft in SHAPE_NAMES:
        draft_path = str(_save_random_draft(draft, target))
    elif draft is not None:
        draft_path = draft
    elif shape is None and default_draft() is not None:
        draft_path = str(default_draft())
    draft_hf = draft_description = None
    if draft_path is not None and need_draft:
        from transformers import AutoModelForCausalLM

        draft_hf = (
            AutoModelForCausalLM.from_pretrained(draft_path, local_files_only=True, dtype=target.dtype)
            .to(target.device)
            .eval()
        )
        count = sum(p.numel() for p in draft_hf.parameters()) / 1e6
        draft_description = (
            f"{'random ' + draft + ' shape' if draft in SHAPE_NAMES else draft_path} "
            f"({count:.1f}M parameters{_weights_digest(draft_path)})"
        )
    return BenchModels(target, draft_path, draft_hf, description, draft_description)


def _save_random_draft(shape: str, target) -> Path:
    from bench.shapes import random_llama, random_published

    directory = Path(tempfile.mkdtemp(prefix=f"codespec-bench-draft-{shape}-"))
    if shape in PUBLISHED:
        model = random_published(shape, 1, target.tokenizer.eos_token_id)
    else:
        model = random_llama(
            shape, target.vocab_size, seed=1, max_context=target.max_context, eos_token_id=target.tokenizer.eos_token_id
        )
    model.save_pretrained(directory)
    target.tokenizer.save_pretrained(directory)
    return directory


def _weights_digest(path) -> str:
    """A short digest of the weights file, so a report names exactly which trained model it measured."""
    import hashlib

    weights = Path(path) / "model.safetensors"
    if not weights.is_file():
        return ""
    return f", weights sha256 {hashlib.sha256(weights.read_bytes()).hexdigest()[:12]}"


def _params(target) -> str:
    return f"{target.parameter_count / 1e6:.1f}M parameters"
