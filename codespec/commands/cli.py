"""The ``codespec`` command: the one place that wires every package together.

Every subcommand is listed in ``COMMANDS`` and the module named there adds its own subparser;
those modules import their heavy parts inside ``run``, so ``codespec --help`` stays instant. ``bench`` and ``simulate`` are measurement (``bench/``),
``train-default`` the default-model pipeline (``training/``, in a source checkout only); the
product packages never import them (docs/architecture.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from codespec.core.errors import CodespecError

# subcommand -> (module, function adding its subparser)
COMMANDS: dict[str, tuple[str, str]] = {
    "generate": ("codespec.commands.generate", "add_parser"),
    "serve": ("codespec.commands.serve", "add_serve_parser"),
    "complete": ("codespec.commands.complete", "add_complete_parser"),
    "demo": ("codespec.commands.demo", "add_parser"),
    "export-gguf": ("codespec.commands.export_gguf", "add_parser"),
    "vllm-config": ("codespec.commands.vllm_config", "add_parser"),
    "simulate": ("bench.simulate", "add_parser"),
    "bench": ("bench.cli", "add_parser"),
    "train-default": ("training.cli", "add_parser"),
}
CHECKOUT_ONLY = {"bench", "training"}  # not in the wheel: importable from a source checkout


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="codespec",
        description="Code completion and edits with lookup-drafted speculative decoding "
        "(output identical to plain decoding of the target).",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, (module, function) in sorted(COMMANDS.items()):
        try:
            add_parser = getattr(import_command_module(module), function)
        except ImportError as error:  # training/ outside a source checkout
            subparsers.add_parser(name, help=f"(unavailable: {error})").set_defaults(
                run=lambda _args, name=name, error=error: _unavailable(name, error)
            )
            continue
        add_parser(subparsers)
    return parser


def import_command_module(module: str):
    """Import a subcommand's module; ``training`` is found in the source checkout this package
    sits in (it is not installed with the package)."""
    import importlib

    if module.split(".")[0] in CHECKOUT_ONLY:
        checkout = Path(__file__).resolve().parents[2]
        if (checkout / module.split(".")[0]).is_dir() and str(checkout) not in sys.path:
            sys.path.append(str(checkout))
    return importlib.import_module(module)


def _unavailable(name: str, error: ImportError) -> int:
    raise CodespecError(f"{name} needs a source checkout of codespec ({error})")


def quiet_libraries() -> None:
    """Progress bars from model loading would corrupt streamed stdout and LSP stdio."""
    import os

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str] | None = None) -> int:
    quiet_libraries()
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except CodespecError as error:
        print(f"codespec: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
