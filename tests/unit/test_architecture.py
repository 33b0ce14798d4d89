"""The package's shape (docs/architecture.md): its layers, no import going up a layer, no
import cycle between its modules, and no module importing another's private name (read
from the source, so they fail before anything runs)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "priority_router"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _runtime_imports(node: ast.AST, typing: bool = False) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported, anywhere in it (also in functions);
    with ``typing``, those under ``if TYPE_CHECKING:`` too."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            for other in (child.body if typing else []) + child.orelse:
                yield from _runtime_imports(other, typing)
        elif isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        elif isinstance(child, ast.stmt):
            yield from _runtime_imports(child, typing)


def _imports(module: str, typing: bool = False) -> Iterator[tuple[str, list[str]]]:
    """(imported module, names taken from it) for each runtime import of the package's own
    (with ``typing``, the type-only ones too)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in _runtime_imports(ast.parse(path.read_text()), typing):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    yield alias.name, []
            continue
        if node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        names = [alias.name for alias in node.names]
        submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES]
        for sub in submodules:
            yield sub, []
        if target in MODULES and len(submodules) < len(names):
            yield target, [n for n in names if f"{target}.{n}" not in MODULES]


def test_the_package_has_its_modules() -> None:
    assert {"priority_router.router", "priority_router.ops.cli", "priority_router.integration.gate"} <= set(
        MODULES
    )


def test_no_import_cycle_between_the_packages_modules() -> None:
    """Type-only imports count: a cycle of them is still two modules that need each other."""
    graph = {module: {target for target, _ in _imports(module, typing=True)} for module in MODULES}
    cycles = []

    def visit(start: str, node: str, path: list[str]) -> None:
        for target in sorted(graph[node]):
            if target == start:
                cycles.append(" -> ".join([*path, start]))
            elif target not in path and target > start:
                visit(start, target, [*path, target])

    for module in sorted(graph):
        visit(module, module, [module])
    assert cycles == []


def test_no_module_imports_another_modules_private_name() -> None:
    private = [
        f"{module} imports {name} from {target}"
        for module in MODULES
        for target, names in _imports(module)
        for name in names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert private == []


#: The layers, bottom up (docs/architecture.md, "Layers"): a module imports only modules of
#: its own layer or below, at run time and for types alike.
LAYERS = {
    "values": {
        "batch",
        "config",
        "decision",
        "errors",
        "forks",
        "headers",
        "limits",
        "local_counts",
        "metrics",
        "policy",
        "redact",
        "redis_urls",
        "thresholds",
        "tiers",
    },
    "store": {"store"},
    "engine": {"engine"},
    "integration": {"integration"},
    "router": {"router", ""},
    "operators": {"ops", "simulation", "demo", "__main__"},
}
ORDER = list(LAYERS)


def layer_of(module: str) -> int:
    part = module.split(".")[1] if "." in module else ""
    (found,) = [n for n, (_, parts) in enumerate(LAYERS.items()) if part in parts]
    return found


def test_every_module_is_in_a_layer() -> None:
    for module in MODULES:
        layer_of(module)


def test_no_import_goes_up_a_layer() -> None:
    upward = [
        f"{module} ({ORDER[layer_of(module)]}) imports {target} ({ORDER[layer_of(target)]})"
        for module in sorted(MODULES)
        for target, _ in _imports(module, typing=True)
        if layer_of(target) > layer_of(module)
    ]
    assert upward == []
