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
    offenders = {
        (file, module)
        for file, modules in imported_modules("service").items()
        for module in modules
        if module.split(".")[0] == "trainers" and module not in GENERIC_TRAINER_MODULES
    }
    assert offenders == set()


def test_imports_only_point_down() -> None:
    upward = set()
    for level, package in enumerate(LAYERS):
        above = set(LAYERS[level + 1 :])
        for file, modules in imported_modules(package).items():
            upward.update((file, m) for m in modules if m.split(".")[0] in above)
    assert upward == set()


# service/'s parts, each allowed to import the parts listed (and itself). The foundation is the
# modules at service/'s top level that every part reads: settings, errors, what a spec means.
FOUNDATION = "foundation"
SERVICE_PARTS: dict[str, set[str]] = {
    FOUNDATION: set(),
    "storage": {FOUNDATION},
    "analysis": {FOUNDATION, "storage"},
    "scheduling": {FOUNDATION, "storage", "analysis"},
    "experiments": {FOUNDATION, "storage", "analysis", "scheduling"},
    "api": {FOUNDATION, "storage", "analysis", "scheduling", "experiments"},
    "client": {FOUNDATION},  # a user's process: never the server's code
    "cli": {FOUNDATION, "storage", "analysis", "scheduling", "experiments", "api", "client"},
}
TOP_LEVEL_PARTS = {"client", "cli"}


def service_part(module: str) -> str:
    """The part of service/ a module (service.x.y) belongs to."""
    name = module.split(".")[1]
    if name in SERVICE_PARTS and name != FOUNDATION:
        return name
    if (ROOT / "service" / name).is_dir():
        raise AssertionError(f"service/{name}/ is a part the boundaries test does not know")
    return FOUNDATION


def service_imports() -> dict[str, set[str]]:
    """Per module of service/ (dotted), the service modules it imports, lazily or not."""
    found: dict[str, set[str]] = {}
    for file, modules in imported_modules("service").items():
        dotted = file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        found[dotted] = {m for m in modules if m.startswith("service.")}
    return found


def test_service_parts_import_only_the_parts_below_them() -> None:
    wrong = set()
    for module, imported in service_imports().items():
        if module == "service":
            continue
        part = service_part(module)
        allowed = SERVICE_PARTS[part] | {part}
        wrong.update((module, m) for m in imported if service_part(m) not in allowed)
    assert wrong == set()


def test_no_import_circle_inside_the_service() -> None:
    graph = service_imports()
    known = set(graph)

    def target(module: str) -> str | None:
        # `from service.x import name` may name a module or a name in it
        while module and module not in known:
            module = module.rpartition(".")[0]
        return module or None

    edges = {
        m: {t for i in imported if (t := target(i)) not in (None, m)}
        for m, imported in graph.items()
    }
    circles = []
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done

    def walk(module: str, path: list[str]) -> None:
        state[module] = 1
        for nxt in sorted(edges[module]):
            if state.get(nxt) == 1:
                circles.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                walk(nxt, [*path, nxt])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            walk(module, [module])
    assert circles == []
