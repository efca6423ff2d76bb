"""The ``codespec`` entry point: every subcommand is named, and building its parser (what
``codespec --help`` does) imports no heavy library."""

from __future__ import annotations

import subprocess
import sys

from codespec.commands.cli import COMMANDS, build_parser


def test_every_subcommand_is_on_the_parser():
    parser = build_parser()
    choices = next(action.choices for action in parser._actions if getattr(action, "choices", None))
    assert set(COMMANDS) <= set(choices)


def test_help_imports_no_torch_and_no_transformers():
    probe = "import sys; from codespec.commands.cli import build_parser; build_parser(); print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
