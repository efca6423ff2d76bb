"""Reproducible training of the shipped default model pair (see docs/default-model.md).

Modules: ``corpus`` (stdlib source, held-out split, functions), ``tokenizer`` (byte-level BPE),
``examples`` (copy curriculum, rewrite, FIM and natural rows), ``trainer`` (target + draft,
early-exit loss, checkpoints, export), ``evaluate`` (model-card numbers), ``card`` and ``cli``.
"""
