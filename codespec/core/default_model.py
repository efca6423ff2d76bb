"""Where the shipped default models live (inside the package, so a non-editable install has them)."""

from __future__ import annotations

from pathlib import Path

DEFAULT_DIR = Path(__file__).resolve().parents[1] / "models" / "default"


def target_path() -> Path:
    """The default target model directory."""
    return DEFAULT_DIR / "target"


def draft_path() -> Path:
    """The default draft model directory (same tokenizer as the target)."""
    return DEFAULT_DIR / "draft"
