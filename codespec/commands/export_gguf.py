"""`codespec export-gguf DIR OUT.gguf`: a GGUF file from a transformers checkpoint directory, for
the llama.cpp backend (``--model OUT.gguf``), Ollama or llama.cpp itself (docs/gguf.md)."""

from __future__ import annotations

import sys
import time

from codespec.core.gguf_export import EXPORT_TYPES


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "export-gguf",
        help="write a GGUF file (f32, f16, bf16, q8_0, q4_k_m) from a transformers checkpoint directory",
        description="Write a GGUF file from a transformers checkpoint (llama, mistral, qwen2, qwen3). "
        "Quantized types are made by llama.cpp's own quantizer from an f16 export.",
    )
    parser.add_argument(
        "directory", help="transformers checkpoint directory (config.json, *.safetensors, tokenizer.json)"
    )
    parser.add_argument("out", help="the GGUF file to write")
    parser.add_argument("--type", default="f16", choices=EXPORT_TYPES, dest="out_type")
    parser.add_argument("--threads", type=int, default=0, help="quantizer threads (default: every core)")
    parser.set_defaults(run=run)


def run(args) -> int:
    from codespec.core.gguf_export import export_gguf

    started = time.perf_counter()
    path = export_gguf(args.directory, args.out, args.out_type, args.threads)
    size_mb = path.stat().st_size / 1e6
    print(
        f"codespec: wrote {path} ({args.out_type}, {size_mb:.1f} MB) in {time.perf_counter() - started:.1f} s",
        file=sys.stderr,
    )
    return 0
