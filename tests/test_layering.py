"""The architecture as a test: dependencies point downwards (docs/LAYOUT.md), no module imports
itself through others, and the library imports nothing of the benchmarks beside it (softrl_bench,
benchmarks/). Imports inside functions count."""

import ast
from pathlib import Path

import softrl

ROOT = Path(softrl.__file__).parent
# bottom to top; a package may import its own layer and the layers below
LAYERS = [
    {"algorithms", "tabular", "limits", "hub", "files", "network"},
    {"objectives"},
    {"config", "config_reference", "safe_yaml", "rewards", "plots"},
    {"tasks"},
    {"data", "models"},
    {"rollout", "endpoint"},
    {"annotate", "eval", "training"},
    {"bootstrap", "assemble", "toy"},
    {"runtime"},
    {"api"},
    {"cli"},
    {"command", "__main__"},
]
LEVEL = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """module -> the softrl modules it imports (`from softrl.x import y` counts y when it is a module)."""
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("softrl.")}
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("softrl"):
                found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                          for a in node.names}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "softrl"


def test_every_package_has_a_layer():
    assert {package(m) for m in imports()} - {"softrl"} <= set(LEVEL)


def test_no_import_from_a_layer_above():
    upward = [f"{a} -> {b}" for a, targets in imports().items() for b in targets
              if package(a) in LEVEL and package(b) in LEVEL and LEVEL[package(b)] > LEVEL[package(a)]]
    assert upward == []


def test_no_import_cycle():
    graph, state, cycles = imports(), {}, []

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]) if nxt in path else nxt)
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    # a package's __init__ re-exporting its modules is not a cycle of behaviour
    cycles = [c for c in cycles if not all(package(m) == package(c.split(" -> ")[0]) for m in c.split(" -> "))
              or not any(m == "softrl." + package(m) for m in c.split(" -> "))]
    assert cycles == []



def test_the_library_imports_nothing_of_the_benchmarks():
    """softrl_bench adds `softrl bench` through an entry point; softrl names it nowhere."""
    named = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                       else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            named += [f"{path.relative_to(ROOT)}: {m}" for m in modules if m.split(".")[0] == "softrl_bench"]
    assert named == []
    assert not (ROOT / "bench").exists()


def test_the_command_line_is_one_package_of_side_by_side_modules():
    """softrl/cli/ builds the app from its MODULES, side by side: none imports another (what several
    share is in common) or a private helper, and no cli_*.py module is left beside the package."""
    from softrl import cli

    assert sorted(p.name for p in ROOT.glob("cli*.py")) == []
    files = {p.stem for p in (ROOT / "cli").glob("*.py")} - {"__init__", "common", "root"}
    assert {m.__name__.split(".")[-1] for m in cli.MODULES} == files
    private = [f"{p.name}: {node.module}.{a.name}" for p in (ROOT / "cli").glob("*.py")
               for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.ImportFrom)
               and (node.module or "").startswith("softrl.cli") for a in node.names if a.name.startswith("_")]
    assert private == []
    # side by side: a command module imports only common, never another command module
    sideways = [f"{p.name}: {node.module}" for p in (ROOT / "cli").glob("*.py") if p.stem in files
                for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.ImportFrom)
                and (node.module or "").startswith("softrl.cli.") and node.module != "softrl.cli.common"]
    assert sideways == []


def test_one_class_per_name_for_the_central_concepts():
    """`Run` is the finished run softrl.train returns (api.py); the run's assembled pieces are RunParts."""
    classes = [f"{p.relative_to(ROOT)}" for p in ROOT.rglob("*.py")
               for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.ClassDef) and node.name == "Run"]
    assert classes == ["api.py"]


def test_lance_is_seen_only_by_the_storage_implementation():
    """data/storage.py is the interface; data/lance_table.py its one implementation, the only module
    that imports Lance or names a row address. Everything else holds opaque row handles and staged
    writes."""
    importers, leaks = [], []
    for path in ROOT.rglob("*.py"):
        name = str(path.relative_to(ROOT))
        if name == "data/lance_table.py":
            continue
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                       else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            importers += [f"{name}: {m}" for m in modules if m.split(".")[0] == "lance"]
        leaks += [f"{name}: {word}" for word in ("_rowaddr", "_take_rows", "read_lance", "LanceDataset",
                                                 "get_fragments", "write_fragments") if word in text]
    assert importers == [] and leaks == []


def test_the_storage_interface_is_complete():
    """Every public method of the Lance table is in the interface (nothing reaches past it), and the
    interface names nothing Lance lacks."""
    import inspect

    from softrl.data.lance_table import LanceTable
    from softrl.data.storage import Table

    def public(cls) -> set[str]:
        return {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}

    assert public(LanceTable) == public(Table)
    for name in public(Table):
        assert list(inspect.signature(getattr(Table, name)).parameters) == \
            list(inspect.signature(getattr(LanceTable, name)).parameters), name
