"""Reproducible training of the shipped default model pair (see docs/default-model.md).

Modules: ``corpus`` (stdlib source, held-out split, functions), ``tokenizer`` (byte-level BPE),
``examples`` (copy curriculum, rewrite, FIM and natural rows), ``trainer`` (target + draft,
early-exit loss, checkpoints, export), ``evaluate`` (model-card numbers), ``card`` and ``cli``.
"""

from pathlib import Path

# the completion records the model card is measured on (a development input; the product never reads it)
DEFAULT_COMPLETIONS = Path(__file__).resolve().parents[2] / "shared" / "workloads" / "completions-httpx.jsonl"
