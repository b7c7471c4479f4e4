"""Imports only point down the floors of docs/architecture.md ("Floors"), and a fleet never imports another fleet.

Every import in the project's packages counts, lazy and TYPE_CHECKING ones included: a function-level import is still
an arrow in the graph. A new top-level package fails here until it is given a floor.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("launch", "fleet", "services", "trainer", "rollout", "buffer_client", "sandbox_client", "envs",
            "weightsync", "workshop")

# Lowest first. A unit is a package or subpackage; a module belongs to the longest unit that prefixes it.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("contracts and config", ("grpofleet", "fleet")),
    ("shared wire code", ("services.runtime", "weightsync", "buffer_client", "sandbox_client", "envs", "workshop")),
    ("fleets", ("trainer", "rollout", "services.replay_buffer", "services.sandbox")),
    ("launch", ("launch",)),
]
CONTAINERS = {"services"}  # a folder of units, itself empty
FLEETS = dict(FLOORS)["fleets"]
FLOOR_OF = {unit: i for i, (_, units) in enumerate(FLOORS) for unit in units}

# Arrows that point the wrong way today, each with why it is still there. The list only shrinks: an entry that no
# longer matches anything fails the test too.
# Keys are (importer, imported) prefixes.
KNOWN: dict[tuple[str, str], str] = {}


def unit_of(module: str) -> str | None:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in FLOOR_OF:
            return ".".join(parts[:n])
    return None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return isinstance(test, ast.Name | ast.Attribute) and ast.unparse(test).endswith("TYPE_CHECKING")


def imports_of(path: Path, *, typing: bool = True) -> set[str]:
    """Every name `path` imports (`from pkg import x` counts as `pkg.x`: x may be a module). `typing=False` leaves
    out the imports under `if TYPE_CHECKING:`, which never run."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.update(f"{base}.{alias.name}" for alias in node.names)
        if not typing and _is_type_checking(node):
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def arrows() -> list[tuple[str, str, str, str]]:
    """(importer, imported, importer's unit, imported unit) for every import between two units."""
    out = []
    for module, path in project_modules().items():
        src = unit_of(module)
        if module in CONTAINERS:
            continue
        assert src is not None, f"{module}: its package has no floor; add it to FLOORS (and docs/architecture.md)"
        for name in imports_of(path):
            dst = unit_of(name)
            if dst is not None and dst != src:
                out.append((module, name, src, dst))
    return out


def violation(src: str, dst: str) -> str | None:
    if FLOOR_OF[dst] > FLOOR_OF[src]:
        return f"a lower floor ({FLOORS[FLOOR_OF[src]][0]}) imports a higher one ({FLOORS[FLOOR_OF[dst]][0]})"
    if src in FLEETS and dst in FLEETS:
        return "a fleet imports another fleet (what two fleets share belongs a floor below both)"
    return None


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _known(importer: str, imported: str) -> tuple[str, str] | None:
    return next((key for key in KNOWN if _under(importer, key[0]) and _under(imported, key[1])), None)


def test_imports_point_down_and_fleets_do_not_import_each_other() -> None:
    bad, used = [], set()
    for importer, imported, src, dst in arrows():
        why = violation(src, dst)
        if why is None:
            continue
        key = _known(importer, imported)
        if key is not None:
            used.add(key)
            continue
        bad.append(f"{importer} imports {imported}: {why}")
    assert not bad, "\n".join(sorted(set(bad)))
    assert not set(KNOWN) - used, f"KNOWN entries that no longer occur (remove them): {sorted(set(KNOWN) - used)}"


def test_units_import_each_other_without_a_circle() -> None:
    graph: dict[str, set[str]] = {}
    for importer, imported, src, dst in arrows():
        if _known(importer, imported) is None:
            graph.setdefault(src, set()).add(dst)
    state: dict[str, int] = {}

    def visit(unit: str, path: list[str]) -> None:
        state[unit] = 1
        for nxt in sorted(graph.get(unit, ())):
            assert state.get(nxt) != 1, f"import circle: {' -> '.join([*path, unit, nxt])}"
            if nxt not in state:
                visit(nxt, [*path, unit])
        state[unit] = 2

    for unit in sorted(graph):
        if unit not in state:
            visit(unit, [])


def test_modules_import_each_other_without_a_circle() -> None:
    """Module by module, lazy imports included (a lazy import that closes a circle only hides it); type-only imports
    left out, they never run."""
    modules = project_modules()
    graph = {m: {_owner(name, modules, m) for name in imports_of(p, typing=False)} - {None, m}
             for m, p in modules.items()}
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for nxt in sorted(n for n in graph[module] if n is not None):
            assert state.get(nxt) != 1, f"import circle: {' -> '.join([*path, module, nxt])}"
            if nxt not in state:
                visit(nxt, [*path, module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def _owner(name: str, modules: dict[str, Path], importer: str) -> str | None:
    """The project module an imported name lives in (`pkg.mod.func` -> `pkg.mod`); a package's own submodules are
    not a circle with it (`pkg/__init__.py` importing `pkg.sub` while `pkg.sub` imports a sibling)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return None if importer.startswith(candidate + ".") else candidate
    return None


GROUP_PROTOS = ("grpofleet.v1.common_pb2", "grpofleet.v1.replay_buffer_pb2")
"""Generated code that spells a group (prompt, trajectory, verdict, scored group) or a replay-buffer message."""
GROUP_PROTO_EDGES = {"rollout.servicer": "PushWeights' stream is made of common_pb2.WeightChunk messages"}
"""Servicers of the trainer and rollout fleets that read generated code of their own calls, with why."""


def test_only_the_buffer_client_converts_groups_for_the_trainer_and_the_rollout_workers() -> None:
    """One vocabulary for a group: the trainer and the rollout workers speak fleet/contracts, and buffer_client
    (buffer_client/wire.py) is the one place that turns it into protobuf and back."""
    bad = []
    for module, path in project_modules().items():
        if unit_of(module) not in ("trainer", "rollout") or module in GROUP_PROTO_EDGES:
            continue
        bad += [f"{module} imports {name}" for name in imports_of(path)
                if any(_under(name, proto) or name.startswith(proto + "_") for proto in GROUP_PROTOS)]
    assert not bad, "\n".join(sorted(bad)) + "\n(convert in buffer_client/wire.py, speak fleet/contracts)"
    assert set(GROUP_PROTO_EDGES) <= set(project_modules()), "GROUP_PROTO_EDGES names a module that is gone"


CLIENTS = ("buffer_client", "sandbox_client")
"""The clients of the services, for the fleets that call them."""


def test_no_service_imports_a_client_of_the_services() -> None:
    """`services/` is one floor's worth of servers and the runtime they share: a service never reaches up into the
    clients written for its callers (what both ends need, like the Redis client settings, lives in
    `services/runtime`)."""
    bad = [f"{importer} imports {imported}" for importer, imported, src, dst in arrows()
           if src.startswith("services.") and dst in CLIENTS]
    assert not bad, "\n".join(sorted(set(bad)))


def test_every_floor_is_listed_in_the_architecture_doc() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    for name, units in FLOORS:
        assert name in doc, f"docs/architecture.md does not name the floor {name!r}"
        for unit in units:
            assert f"`{unit.replace('.', '/')}`" in doc or f"`{unit}`" in doc, f"docs/architecture.md: {unit}?"


def test_the_rules_refuse_an_upward_import_and_a_fleet_importing_another() -> None:
    assert violation("rollout", "services.sandbox") is not None
    assert violation("fleet", "launch") is not None
    assert violation("sandbox_client", "trainer") is not None
    assert violation("launch", "trainer") is None
    assert violation("rollout", "weightsync") is None
    assert violation("weightsync", "services.runtime") is None
