"""Where the shipped default models live (inside the package, so a non-editable install has them)."""

from __future__ import annotations

from pathlib import Path

DEFAULT_DIR = Path(__file__).resolve().parent / "models" / "default"


def _model_dir(name: str) -> Path | None:
    directory = DEFAULT_DIR / name
    if (directory / "config.json").is_file() and (directory / "model.safetensors").is_file():
        return directory
    return None


def target_path() -> Path | None:
    """The default target model directory, or None if this build ships none."""
    return _model_dir("target")


def draft_path() -> Path | None:
    """The default draft model directory (same tokenizer as the target), or None."""
    return _model_dir("draft")
