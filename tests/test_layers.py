"""The package reads bottom to top: every import, function-level and TYPE_CHECKING ones
included, goes down the layers of DESIGN.md "The shape of the code" (or stays in its
layer), and no file imports itself back through others."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "launcher"

# Bottom to top. A module belongs to the first layer one of whose prefixes names it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("floor", ("launcher", "launcher.errors", "launcher.shell", "launcher.rundir", "launcher.processes")),
    ("runtime", ("launcher.runtime",)),
    ("jobcontrol", ("launcher.jobcontrol",)),
    ("localrun", ("launcher.localrun",)),
    ("config", ("launcher.config",)),
    ("resolution", ("launcher.resolution",)),
    ("rendering", ("launcher.rendering",)),
    ("schedulers", ("launcher.schedulers",)),
    ("runner", ("launcher.runner",)),
    ("views", ("launcher.views",)),
    ("api", ("launcher.api",)),
    ("cli", ("launcher.cli", "launcher.cli_sites")),
]
# The training library stands on the floor alone, and so do the job controller and the
# local driver: what the ranks leave is read through the floor (launcher.rundir); the pure core (configuration, resolution, rendering) reaches for none of the job side;
# the CLI talks to the API and the views only.
MAY_IMPORT_ONLY: dict[str, tuple[str, ...]] = {
    "runtime": ("floor", "runtime"),
    "jobcontrol": ("floor", "jobcontrol"),
    "localrun": ("floor", "jobcontrol", "localrun"),
    "config": ("floor", "config"),
    "resolution": ("floor", "config", "resolution"),
    "rendering": ("floor", "config", "resolution", "rendering"),
    "cli": ("floor", "views", "api", "cli"),
}


def module_names(root: Path) -> dict[str, Path]:
    names = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        names[name] = path
    return names


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every project module that ``name`` imports, wherever the import statement stands."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return {m for m in found if m in known and m != name}


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    modules = module_names(root)
    return {name: imports_of(name, path, set(modules)) for name, path in modules.items()}


def layer_of(module: str) -> str:
    best, best_len = None, -1
    for layer, prefixes in LAYERS:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = layer, len(prefix)
    if best is None:
        raise LookupError(f"{module} belongs to no layer: add it to LAYERS")
    return best


RANK = {layer: i for i, (layer, _) in enumerate(LAYERS)}
# The one import from the controller into the training library: a bundle submitted by hand
# is taken on by pickling the task every node runs (launcher.runtime.task.place_task).
PICKLED_TASK = ("launcher.jobcontrol.jobstart", "launcher.runtime.task")


# The controller's public entry: the rest of glaunch (the local scheduler) uses the package,
# never its modules.
CONTROLLER_ENTRY = "launcher.jobcontrol"


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Each import against the layer order, as 'importer (layer) -> imported (layer)'."""
    found = []
    for importer, imported in sorted(graph.items()):
        low = layer_of(importer)
        for target in sorted(imported):
            high = layer_of(target)
            allowed = MAY_IMPORT_ONLY.get(low)
            upward = RANK[high] > RANK[low] or (allowed is not None and high not in allowed)
            if upward and (importer, target) == PICKLED_TASK:
                upward = False
            if upward:
                found.append(f"{importer} ({low}) -> {target} ({high})")
            elif high == "jobcontrol" and low not in ("jobcontrol", "localrun") and target != CONTROLLER_ENTRY:
                found.append(f"{importer} ({low}) -> {target} ({high}, not its public entry {CONTROLLER_ENTRY})")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_every_import_goes_down_the_layers():
    found = violations(import_graph())
    assert not found, "imports against the layer order:\n" + "\n".join(found)


def test_no_file_imports_itself_back():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(group) for group in found)


def test_every_module_has_a_layer():
    for name in import_graph():
        layer_of(name)


@pytest.fixture
def planted(tmp_path):
    """A copy of the package with one upward import planted inside a function of the floor."""
    import shutil

    copy = tmp_path / "launcher"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    layout = copy / "rundir" / "layout.py"
    layout.write_text(layout.read_text() + "\n\ndef _planted():\n    from launcher.runner import status\n")
    return copy


def test_a_planted_upward_import_is_found(planted):
    found = violations(import_graph(planted))
    assert "launcher.rundir.layout (floor) -> launcher.runner.status (runner)" in found


def test_a_planted_cycle_is_found(planted):
    status = planted / "runner" / "status.py"
    status.write_text(status.read_text() + "\n\nfrom launcher.rundir import layout\n")
    groups = cycles(import_graph(planted))
    assert any("launcher.rundir.layout" in group and "launcher.runner.status" in group for group in groups)


def test_the_runtime_may_not_reach_the_configuration(tmp_path):
    graph = {"launcher.runtime.task": {"launcher.config.load"}, "launcher.config.load": set()}
    assert violations(graph) == ["launcher.runtime.task (runtime) -> launcher.config.load (config)"]


def test_the_training_library_may_not_reach_the_controller():
    graph = {"launcher.runtime.stop": {"launcher.jobcontrol.jobend"}, "launcher.jobcontrol.jobend": set()}
    assert violations(graph) == ["launcher.runtime.stop (runtime) -> launcher.jobcontrol.jobend (jobcontrol)"]


def test_the_controller_and_the_local_driver_may_not_reach_the_training_library():
    graph = {"launcher.jobcontrol.watchdog": {"launcher.runtime.heartbeats", "launcher.rundir.heartbeatrecord"},
             "launcher.localrun.jobstep": {"launcher.runtime.telemetry", "launcher.rundir.rankcontext"},
             "launcher.runtime.heartbeats": set(), "launcher.runtime.telemetry": set(),
             "launcher.rundir.heartbeatrecord": set(), "launcher.rundir.rankcontext": set()}
    assert violations(graph) == ["launcher.jobcontrol.watchdog (jobcontrol) -> launcher.runtime.heartbeats (runtime)",
                                 "launcher.localrun.jobstep (localrun) -> launcher.runtime.telemetry (runtime)"]


def test_the_local_scheduler_uses_the_controller_through_its_public_entry():
    graph = {"launcher.schedulers.local": {"launcher.jobcontrol.jobend", "launcher.jobcontrol"},
             "launcher.jobcontrol.jobend": set(), "launcher.jobcontrol": set()}
    assert violations(graph) == ["launcher.schedulers.local (schedulers) -> launcher.jobcontrol.jobend (jobcontrol, "
                                 "not its public entry launcher.jobcontrol)"]


def test_every_package_is_shipped():
    """pyproject lists the wheel's packages by name: a new subpackage must be there too."""
    import tomllib

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.relative_to(PACKAGE.parent).parts) for p in PACKAGE.rglob("__init__.py")
             for p in [p.parent]}
    assert found <= listed, f"not in pyproject's packages: {sorted(found - listed)}"


# The Slurm backend's transport is handed to it: the process's own client (this machine's)
# is named only where a default is chosen, never read by a query or a check, so no command
# reaches this machine's Slurm on a road that goes to another's.
MACHINE_CLIENT_NAMED_IN = {"launcher/schedulers/slurm/client.py", "launcher/schedulers/slurm/scheduler.py",
                           "launcher/runner/road.py"}


def machine_client_uses(root: Path) -> set[str]:
    """The files under `root` (as launcher/...) that name client.CLIENT."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        attributes = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        if "CLIENT" in names | attributes:
            found.add(str(Path("launcher") / path.relative_to(root)))
    return found


def test_only_the_backend_s_default_names_this_machine_s_slurm_client():
    assert machine_client_uses(PACKAGE) <= MACHINE_CLIENT_NAMED_IN


def test_a_planted_use_of_this_machine_s_client_is_found(tmp_path):
    (tmp_path / "queries.py").write_text("from launcher.schedulers.slurm import client\n"
                                         "def ask():\n    return client.CLIENT.call('squeue')\n")
    assert machine_client_uses(tmp_path) == {"launcher/queries.py"}

