"""The layout of docs/architecture.md, checked: imports run one way between packages
(``index``, ``codespec`` <- ``proposers`` <- ``service`` <- the doors ``lsp``, ``websocket_api``,
``http_api`` <- ``commands``; no door imports another; ``bench`` and ``training`` may import the
product and start a door through its package's public names, never the reverse), and no two modules
import each other, directly or around a loop."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOORS = ("lsp", "websocket_api", "http_api")
PACKAGES = ("codespec", "index", "proposers", "service", "vllm_proposer", *DOORS, "commands", "bench", "training")
CORE = {"codespec", "index", "proposers", "service"}
# package -> the packages its modules may import
ALLOWED = {
    "codespec": {"codespec"},
    "index": {"index"},
    "proposers": {"proposers", "codespec", "index"},
    "service": {"service", "proposers", "codespec", "index"},  # the engine service imports no door
    "vllm_proposer": {"vllm_proposer", "proposers", "codespec", "index"},  # a plug-in loaded by vLLM
    **{door: {door} | CORE for door in DOORS},  # no door imports another
    # `serve` wires the doors to one service; `cli` (the entry point) names bench's and training's
    # commands by module path only, imported when asked for, so the product never imports them
    "commands": {"commands", "vllm_proposer", *DOORS} | CORE,
    "bench": {"bench", "vllm_proposer", *DOORS} | CORE,  # a door only through its package's public names (below)
    "training": {"training", "bench"} | CORE,
}
OUTSIDE_DOORS = ("bench", "training")  # may start a door to measure it end to end, never reach inside


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def product_modules() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules ``path`` imports anywhere in it (lazy imports inside functions included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = product_modules()
    return {name: imports_of(path, modules) - {name} for name, path in modules.items()}


def test_imports_run_one_way_between_packages():
    wrong = []
    for module, imported in import_graph().items():
        package = module.split(".")[0]
        wrong += [f"{module} -> {other}" for other in sorted(imported) if other.split(".")[0] not in ALLOWED[package]]
        if package in OUTSIDE_DOORS:
            wrong += [
                f"{module} -> {other} (a door's internals)"
                for other in sorted(imported)
                if "." in other and other.split(".")[0] in DOORS
            ]
    assert not wrong, "imports against docs/architecture.md:\n" + "\n".join(wrong)


def test_no_import_cycles():
    graph = import_graph()
    graph = {
        module: {other for other in imported if not module.startswith(other + ".")}  # a package's own __init__
        for module, imported in graph.items()
    }
    state: dict[str, int] = {}
    cycles = []

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for other in sorted(graph.get(module, ())):
            if state.get(other) == 1:
                cycles.append(" -> ".join([*trail[trail.index(other) :], other]))
            elif other not in state:
                visit(other, [*trail, other])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_proposer_table_names_real_classes():
    from proposers.registry import PROPOSERS, proposer_class

    for name in PROPOSERS:
        assert isinstance(proposer_class(name), type), name


ASSEMBLY = "proposers.assembly"
ASSEMBLING = {"build_auto", "model_proposers", "create_proposer"}  # what puts proposers together


def test_proposers_are_assembled_in_one_place():
    """The server, bench, simulate and the CLI build proposers through ``proposers.assembly`` only."""
    wrong = []
    for module, path in product_modules().items():
        if module in (ASSEMBLY, "proposers.auto", "proposers.models", "proposers.registry"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("proposers"):
                wrong += [f"{module} imports {alias.name}" for alias in node.names if alias.name in ASSEMBLING]
    assert not wrong, "assemble proposers with proposers.assembly.ProposerAssembly:\n" + "\n".join(wrong)
