"""Imports only point down (service -> workers -> trainers -> api_schemas), and the service
reaches trainers only through the registry and the generic trainer modules: no trainer is
special-cased by module."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What service/ may import from trainers/: the registry and the generic interfaces.
GENERIC_TRAINER_MODULES = {"trainers", "trainers.base", "trainers.runtime", "trainers.reports"}
LAYERS = ["api_schemas", "trainers", "workers", "service"]  # each may import only earlier ones


def imported_modules(package: str) -> dict[str, set[str]]:
    """Per file of `package`, the modules it imports (absolute names)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[str(path.relative_to(ROOT))] = names
    return found


def test_the_service_imports_no_trainer_module_by_name() -> None:
    offenders = {(file, module) for file, modules in imported_modules("service").items()
                 for module in modules
                 if module.split(".")[0] == "trainers" and module not in GENERIC_TRAINER_MODULES}
    assert offenders == set()


def test_imports_only_point_down() -> None:
    upward = set()
    for level, package in enumerate(LAYERS):
        above = set(LAYERS[level + 1:])
        for file, modules in imported_modules(package).items():
            upward.update((file, m) for m in modules if m.split(".")[0] in above)
    assert upward == set()
