"""Write a GGUF file from a transformers checkpoint directory (``codespec export-gguf``).

Why our own writer: llama.cpp's ``convert_hf_to_gguf.py`` identifies a tokenizer by a hash of
how it splits a probe text and refuses any it has not seen ("BPE pre-tokenizer was not
recognized"), the shipped default model's among them. This writer reads the pre-tokenizer's
*configuration* instead and names the llama.cpp pre-tokenizer that implements it (docs/gguf.md,
"Exporting"). The tensors go through gguf-py's name map; llama-layout attention weights are
permuted to llama.cpp's rotary layout as the official converter does; quantized types
(``q8_0``, ``q4_k_m``) are made from an f16 file by llama.cpp's own quantizer.

Supported architectures: llama (and mistral, which llama.cpp reads as llama), qwen2, qwen3.
"""

from __future__ import annotations

import ctypes
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from codespec.core.errors import CodespecError, ModelNotFoundError

# The output types: what a tensor of two or more dimensions is stored as (norms stay f32).
FLOAT_TYPES = ("f32", "f16", "bf16")
QUANTIZED_TYPES = {"q8_0": 7, "q4_k_m": 15}  # llama.cpp's LLAMA_FTYPE_MOSTLY_* values
EXPORT_TYPES = (*FLOAT_TYPES, *QUANTIZED_TYPES)

# transformers model_type -> (llama.cpp architecture name, permute q/k for llama.cpp's rotary layout)
ARCHITECTURES = {
    "llama": ("llama", True),
    "mistral": ("llama", True),
    "qwen2": ("qwen2", False),
    "qwen3": ("qwen3", False),
}

# Qwen2's split pattern as tokenizer.json spells it (llama.cpp's pre-tokenizer "qwen2").
QWEN2_SPLIT = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"


class ExportError(CodespecError):
    """A checkpoint this exporter cannot write as GGUF (the message says what and why)."""


def export_gguf(model_dir: str | os.PathLike, out: str | os.PathLike, out_type: str = "f16", threads: int = 0) -> Path:
    """Write ``out`` from the checkpoint in ``model_dir``; return its path."""
    if out_type not in EXPORT_TYPES:
        raise ExportError(f"unknown GGUF type {out_type!r}; use one of {', '.join(EXPORT_TYPES)}")
    source = Path(model_dir).expanduser()
    if not (source / "config.json").is_file():
        raise ModelNotFoundError(f"{source} holds no config.json (not a transformers checkpoint directory)")
    out_path = Path(out).expanduser()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if out_type in FLOAT_TYPES:
        _write(source, out_path, out_type)
        return out_path
    with tempfile.TemporaryDirectory(dir=out_path.parent) as scratch:
        staged = Path(scratch) / "f16.gguf"
        _write(source, staged, "f16")
        quantize(staged, out_path, out_type, threads)
    return out_path


def quantize(source: str | os.PathLike, out: str | os.PathLike, out_type: str, threads: int = 0) -> Path:
    """``out`` as llama.cpp's quantizer writes ``source`` in ``out_type`` (q8_0 or q4_k_m)."""
    if out_type not in QUANTIZED_TYPES:
        raise ExportError(f"unknown quantized type {out_type!r}; use one of {', '.join(QUANTIZED_TYPES)}")
    from codespec.core.llama_cpp_lib import load_library

    lib = load_library()
    params = lib.llama_model_quantize_default_params()
    params.ftype = QUANTIZED_TYPES[out_type]
    params.nthread = threads
    status = lib.llama_model_quantize(str(source).encode(), str(out).encode(), ctypes.byref(params))
    if status != 0:
        raise ExportError(f"llama.cpp's quantizer failed on {source} (status {status})")
    return Path(out)


def _write(source: Path, out: Path, out_type: str) -> None:
    import gguf
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(source, local_files_only=True)
    if config.model_type not in ARCHITECTURES:
        raise ExportError(
            f"{source}: model type {config.model_type!r} is not exported; supported: {', '.join(ARCHITECTURES)}"
        )
    arch, permute = ARCHITECTURES[config.model_type]
    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    writer = gguf.GGUFWriter(str(out), arch)
    _write_hyperparameters(writer, config, source.name, out_type)
    _write_tokenizer(writer, tokenizer, config.vocab_size, getattr(config, "eos_token_id", None))
    arch_enum = next(key for key, name in gguf.MODEL_ARCH_NAMES.items() if name == arch)
    names = gguf.get_tensor_name_map(arch_enum, config.num_hidden_layers)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    for hf_name, tensor in _tensors(source):
        if hf_name == "lm_head.weight" and getattr(config, "tie_word_embeddings", False):
            continue  # llama.cpp reads a missing output.weight as the tied embedding
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            if "rotary_emb" in hf_name:
                continue
            raise ExportError(f"{source}: no GGUF name for tensor {hf_name!r} ({arch})")
        data = tensor  # float32 (``_tensors``)
        if permute and hf_name.endswith(("q_proj.weight", "q_proj.bias")):
            data = _permute(data, heads, heads)
        elif permute and hf_name.endswith(("k_proj.weight", "k_proj.bias")):
            data = _permute(data, heads, kv_heads)
        _add_tensor(writer, name, data, out_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _permute(weights: np.ndarray, heads: int, kv_heads: int) -> np.ndarray:
    """HF's rotate-half rows -> llama.cpp's interleaved pairs, per head (convert_hf_to_gguf's permute)."""
    if kv_heads != heads:
        heads = kv_heads
    shape = weights.shape
    return weights.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _add_tensor(writer: Any, name: str, data: np.ndarray, out_type: str) -> None:
    import gguf

    if data.ndim < 2 or out_type == "f32":
        writer.add_tensor(name, data)
    elif out_type == "f16":
        writer.add_tensor(name, data.astype(np.float16))
    else:  # bf16: gguf-py packs it as raw uint16 rows
        packed = gguf.quants.quantize(data, gguf.GGMLQuantizationType.BF16)
        writer.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)


def _tensors(source: Path) -> Iterator[tuple[str, np.ndarray]]:
    from safetensors import safe_open

    files = sorted(source.glob("*.safetensors"))
    if not files:
        raise ExportError(f"{source}: no *.safetensors weights (export reads safetensors checkpoints)")
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
                yield key, handle.get_tensor(key).float().numpy()


def _write_hyperparameters(writer: Any, config: Any, name: str, out_type: str) -> None:
    import gguf

    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope = getattr(config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    writer.add_name(name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(theta))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(config.vocab_size)
    if rope.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
    elif rope.get("rope_type") not in (None, "default"):
        raise ExportError(f"rope scaling {rope.get('rope_type')!r} is not exported (default and linear are)")
    file_types = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16}
    writer.add_file_type(file_types.get(out_type, gguf.LlamaFileType.MOSTLY_BF16))


def pre_tokenizer_name(tokenizer_json: dict) -> str:
    """The llama.cpp pre-tokenizer that splits text as this tokenizer.json's does."""
    pre = tokenizer_json.get("pre_tokenizer") or {}
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return "gpt-2"  # the GPT-2 regex inside the byte-level step
    steps = pre.get("pretokenizers") or []
    if (
        pre.get("type") == "Sequence"
        and len(steps) == 2
        and steps[0].get("type") == "Split"
        and (steps[0].get("pattern") or {}).get("Regex") == QWEN2_SPLIT
        and steps[1].get("type") == "ByteLevel"
        and not steps[1].get("use_regex", True)
    ):
        return "qwen2"
    raise ExportError(
        "the tokenizer's pre-tokenizer is neither GPT-2's byte-level regex nor Qwen2's split; "
        f"no llama.cpp pre-tokenizer is known to match it ({json.dumps(pre)[:200]})"
    )


def _write_tokenizer(writer: Any, tokenizer: Any, vocab_size: int, eos_token_id: Any) -> None:
    import gguf

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ExportError("export needs a fast (tokenizers) tokenizer: tokenizer.json")
    spec = json.loads(backend.to_str())
    if (spec.get("model") or {}).get("type") != "BPE":
        raise ExportError(f"tokenizer model {(spec.get('model') or {}).get('type')!r} is not exported (BPE is)")
    vocab = tokenizer.get_vocab()
    if len(vocab) > vocab_size:
        raise ExportError(f"the tokenizer has {len(vocab)} tokens but the embedding only {vocab_size} rows")
    by_id = {index: token for token, index in vocab.items()}
    added = {item["id"]: item for item in spec.get("added_tokens", [])}
    tokens, types = [], []
    for index in range(vocab_size):
        if index not in by_id:
            tokens.append(f"[PAD{index}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        tokens.append(by_id[index])
        if index in added:
            types.append(gguf.TokenType.CONTROL if added[index].get("special") else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"].get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_tokenizer_name(spec))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    eos = eos_token_id if isinstance(eos_token_id, int) else tokenizer.eos_token_id
    if eos is not None:
        writer.add_eos_token_id(int(eos))
    if tokenizer.bos_token_id is not None:
        writer.add_bos_token_id(int(tokenizer.bos_token_id))
    writer.add_add_bos_token(False)
    from codespec.core.prompts import detect_format

    spec_format = detect_format(tokenizer)
    if spec_format.fim_tokens is not None:
        keys = (gguf.Keys.Tokenizer.FIM_PRE_ID, gguf.Keys.Tokenizer.FIM_SUF_ID, gguf.Keys.Tokenizer.FIM_MID_ID)
        for key, token in zip(keys, spec_format.fim_tokens):
            writer.add_uint32(key, int(vocab[token]))
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str) and template:
        writer.add_chat_template(template)
