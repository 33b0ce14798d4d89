"""The package's shape: no import cycle between its modules, and no module imports
another's private name (read from the source, so they fail before anything runs)."""

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


def _runtime_imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported (not those under ``if TYPE_CHECKING:``)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            for other in child.orelse:
                yield from _runtime_imports(other)
        elif isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        elif isinstance(child, ast.stmt):
            yield from _runtime_imports(child)


def _imports(module: str) -> Iterator[tuple[str, list[str]]]:
    """(imported module, names taken from it) for each runtime import of the package's own."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in _runtime_imports(ast.parse(path.read_text())):
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
    graph = {module: {target for target, _ in _imports(module)} for module in MODULES}
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
