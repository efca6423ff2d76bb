"""The layout of docs/architecture.md, checked: one installed namespace, ``codespec``, whose parts
import one way (``core`` <- ``index`` <- ``proposers`` <- ``service`` <- the doors ``lsp``,
``websocket_api``, ``http_api`` <- ``commands``; ``vllm_proposer`` beside the service); no door
imports another; ``bench`` and ``training`` may import the product and start a door through its
package's public names, never the reverse; no two modules import each other, directly or around a
loop. A module named in a string by a module that loads modules by ``importlib`` counts as imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOORS = ("lsp", "websocket_api", "http_api")
PARTS = ("core", "index", "proposers", "service", "vllm_proposer", *DOORS, "commands")
OUTSIDE = ("bench", "training")  # in the checkout, not installed
CORE = {"core", "index", "proposers", "service"}
# part -> the parts its modules may import (``codespec`` alone is the package's root: version, __main__)
ALLOWED = {
    "codespec": {"codespec", "commands"},
    "core": {"core"},
    "index": {"index", "core"},
    "proposers": {"proposers", "core", "index"},
    "service": {"service", "proposers", "core", "index"},  # the engine service imports no door
    "vllm_proposer": {"vllm_proposer", "proposers", "core", "index"},  # a plug-in loaded by vLLM
    **{door: {door, "codespec"} | CORE for door in DOORS},  # no door imports another
    # `serve` wires the doors to one service; `cli` (the entry point) loads bench's and training's
    # commands by module path, from a source checkout only, so no product module imports them
    "commands": {"commands", "codespec", "vllm_proposer", *DOORS} | CORE,
    "bench": {"bench", "codespec", "vllm_proposer", *DOORS} | CORE,  # a door only through its package's public names
    "training": {"training", "bench", "codespec"} | CORE,
}
CHECKOUT_LOADS = {"codespec.commands.cli": {"bench", "training"}}  # importlib loads of the checkout's commands


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_of(module: str) -> str:
    """``codespec.index.store`` -> ``index``; ``codespec`` -> ``codespec``; ``bench.cli`` -> ``bench``."""
    names = module.split(".")
    if names[0] != "codespec":
        return names[0]
    return names[1] if len(names) > 1 and names[1] in PARTS else "codespec"


def product_modules() -> dict[str, Path]:
    return {module_name(path): path for package in ("codespec", *OUTSIDE) for path in (ROOT / package).rglob("*.py")}


def loads_by_importlib(tree: ast.AST) -> bool:
    return any(
        isinstance(node, ast.Attribute)
        and node.attr == "import_module"
        or isinstance(node, ast.Name)
        and node.id == "__import__"
        for node in ast.walk(tree)
    )


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules ``path`` imports anywhere in it (lazy imports inside functions included, and
    modules it names in strings where it loads modules by ``importlib``)."""
    found = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    by_importlib = loads_by_importlib(tree)
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif by_importlib and isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value.partition(":")[0]] if node.value.partition(":")[0] in modules else []
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = product_modules()
    return {name: imports_of(path, modules) - {name} for name, path in modules.items()}


def test_one_namespace_is_installed():
    """Everything the wheel installs lives under ``codespec``: no top-level package beside it."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert config["tool"]["setuptools"]["packages"]["find"]["include"] == ["codespec*"]
    beside = sorted(
        p.name
        for p in ROOT.iterdir()
        if p.is_dir() and (p / "__init__.py").exists() and p.name not in ("codespec", *OUTSIDE, "tests")
    )
    assert not beside, f"packages outside the codespec namespace: {beside}"
    assert {p.name for p in (ROOT / "codespec").iterdir() if (p / "__init__.py").exists()} == {
        *PARTS,
        "models",
    }  # models: the shipped weights (data)


def test_importlib_loads_are_seen():
    graph = import_graph()
    assert "codespec.proposers.auto" in graph["codespec.proposers.registry"]
    assert "codespec.commands.serve" in graph["codespec.commands.cli"]


def test_imports_run_one_way_between_packages():
    wrong = []
    for module, imported in import_graph().items():
        part = part_of(module)
        allowed = ALLOWED[part] | CHECKOUT_LOADS.get(module, set())
        wrong += [f"{module} -> {other}" for other in sorted(imported) if part_of(other) not in allowed]
        if part in OUTSIDE:
            wrong += [
                f"{module} -> {other} (a door's internals)"
                for other in sorted(imported)
                if part_of(other) in DOORS and other.count(".") > 1
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
    from codespec.proposers.registry import PROPOSERS, proposer_class

    for name in PROPOSERS:
        assert isinstance(proposer_class(name), type), name


ASSEMBLY = "codespec.proposers.assembly"
ASSEMBLING = {"build_auto", "model_proposers", "create_proposer"}  # what puts proposers together


def test_proposers_are_assembled_in_one_place():
    """The server, bench, simulate and the CLI build proposers through ``proposers.assembly`` only."""
    wrong = []
    for module, path in product_modules().items():
        if module in (ASSEMBLY, "codespec.proposers.auto", "codespec.proposers.models", "codespec.proposers.registry"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("codespec.proposers"):
                wrong += [f"{module} imports {alias.name}" for alias in node.names if alias.name in ASSEMBLING]
    assert not wrong, "assemble proposers with proposers.assembly.ProposerAssembly:\n" + "\n".join(wrong)


# library -> the one module allowed to touch its private names (None: none may)
ADAPTERS = {"pygls": "codespec.lsp.rpc", "transformers": "codespec.core.attention", "vllm": None}


def library_private_names(library: str) -> set[str]:
    """Private attributes and methods the library's own classes define (``self._x = ``, ``def _x(self``)."""
    import importlib.util
    import re

    spec = importlib.util.find_spec(library)
    if spec is None or spec.origin is None:
        return set()
    names: set[str] = set()
    for path in Path(spec.origin).parent.rglob("*.py"):
        text = path.read_text(encoding="utf-8", errors="replace")
        names |= set(re.findall(r"self\.(_[a-z]\w*)\s*[:=]", text)) | set(re.findall(r"def (_[a-z]\w*)\(self", text))
    return names


def imports_library(tree: ast.AST, library: str) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(alias.name.split(".")[0] == library for alias in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == library:
            return True
    return False


def private_touches(tree: ast.AST, private: set[str], library: str) -> set[str]:
    """The library's private names a module reads, calls, overrides or sets, except names the
    module defines for itself (its own functions and the attributes it assigns on ``self``)."""
    own = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    own |= {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }
    touched = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
    }
    from_library = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == library
        for alias in node.names
    }
    derived = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and any(isinstance(base, ast.Name) and base.id in from_library for base in node.bases)
    ]
    overridden: set[str] = set()  # in a subclass of the library's class: methods it overrides, attributes it sets
    for node in derived:
        for item in ast.walk(node):
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                overridden.add(item.name)
            elif isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store):
                overridden.add(item.attr)
    return (touched - own | overridden) & private


def test_private_api_of_pygls_transformers_and_vllm_only_in_their_adapter():
    wrong = []
    for library, adapter in ADAPTERS.items():
        private = library_private_names(library)
        for module, path in product_modules().items():
            if not module.startswith("codespec") or module == adapter:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            if not imports_library(tree, library):
                continue
            if adapter is None:
                wrong.append(f"{module} imports {library} (no module of codespec may)")
            elif touched := private_touches(tree, private, library):
                wrong.append(f"{module}: {library}'s private {sorted(touched)} (only {adapter} may)")
    assert not wrong, "\n".join(wrong)


# the service's rooms -> the rooms their modules may import: the request values and builders know no
# engine; the engine knows the requests; what the doors share may use both
SERVICE_ROOMS = {
    "requests": {"requests"},
    "engine": {"engine", "requests"},
    "doors": {"doors", "requests", "engine"},
}


def test_the_service_s_rooms_import_one_way():
    wrong = []
    for module, imported in import_graph().items():
        names = module.split(".")
        if names[:2] != ["codespec", "service"] or len(names) < 4:
            continue
        room = names[2]
        for other in sorted(imported):
            other_names = other.split(".")
            if (
                other_names[:2] == ["codespec", "service"]
                and len(other_names) > 2
                and other_names[2] not in SERVICE_ROOMS[room]
            ):
                wrong.append(f"{module} -> {other}")
    assert set(SERVICE_ROOMS) == {
        p.name for p in (ROOT / "codespec" / "service").iterdir() if (p / "__init__.py").exists()
    }, "every module of the service lives in a room"
    assert [p.name for p in (ROOT / "codespec" / "service").glob("*.py")] == ["__init__.py"]
    assert not wrong, "the service's rooms import one way (requests <- engine <- doors):\n" + "\n".join(wrong)
