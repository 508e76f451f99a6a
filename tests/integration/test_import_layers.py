"""The import layers (DEVELOPERS.md, "Layers"): no import circle, and no import from a layer to one above it.

Reads every ``import`` statement of ``stablemoe_jax/``, ``configs/`` and ``benchmarks/`` with ``ast`` (those inside
functions too: a deferred import is still a dependency), builds the file graph and checks it against ``LAYERS``, file
by file: the entry points too (``cli``, what they share, imports no runner; ``main`` and ``prepare``, the commands
at the package root, any layer below them; the data layer, ``data/prepare/`` included, none of them).
Then folder by folder: each folder (package) is one floor of the table (no other folder's module in a row between its
lowest and highest), and no folder imports a folder above it. Nothing is imported, so the test takes well under a
second.
"""
from __future__ import annotations

import ast
import functools
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("stablemoe_jax", "configs", "benchmarks")

# Bottom first: (layer, the modules in it (a prefix takes its submodules; the longest prefix wins), the layers it may
# import besides itself). Every layer named on the right must lie below: an upward import cannot be declared.
LAYERS = (
    # The package root is here, so a new module that no row names falls to the bottom and fails on any import.
    ("core", ("stablemoe_jax", "stablemoe_jax.core"), ()),
    ("parallel", ("stablemoe_jax.parallel",), ("core",)),
    ("models", ("stablemoe_jax.models",), ("core", "parallel")),
    ("data.common", ("stablemoe_jax.data", "stablemoe_jax.data.common"), ("core",)),
    ("data.lm", ("stablemoe_jax.data.lm",), ("core", "data.common")),
    ("data.translation", ("stablemoe_jax.data.translation",), ("core", "data.common")),
    ("data.prepare", ("stablemoe_jax.data.prepare",), ("core", "data.common", "data.lm", "data.translation")),
    ("decoding", ("stablemoe_jax.decoding",), ("core", "parallel", "models", "data.common", "data.translation")),
    ("analysis", ("stablemoe_jax.analysis",), ("core", "parallel", "models")),
    ("train", ("stablemoe_jax.train",), ("core", "parallel", "models")),
    ("tasks", ("stablemoe_jax.tasks",),
     ("core", "parallel", "models", "data.common", "data.lm", "data.translation", "decoding", "train")),
    # experiment/: what runs an experiment, three rows of one folder (file by file, each imports only down).
    ("step", ("stablemoe_jax.experiment.step",), ("core", "parallel", "models", "train", "tasks")),
    ("validation", ("stablemoe_jax.experiment.config_validation",),
     ("core", "models", "data.common", "data.lm", "data.translation", "analysis", "train", "tasks")),
    ("runners", ("stablemoe_jax.experiment", "stablemoe_jax.experiment.loop", "stablemoe_jax.experiment.plan"),
     ("core", "parallel", "models", "analysis", "train", "tasks", "step", "validation")),
    # Entry points ("*": any layer below). `cli` is what they share (flags, user errors as one line): it knows the
    # errors, never a runner.
    ("cli", ("stablemoe_jax.cli",), ("core", "train")),
    ("entry", ("stablemoe_jax.main", "stablemoe_jax.prepare", "stablemoe_jax.commands", "stablemoe_jax.compare",
               "stablemoe_jax.data.download", "stablemoe_jax.data.wmt"), "*"),
    ("configs", ("configs",), ("core", "data.translation")),
    ("benchmarks", ("benchmarks",), "*"),
)
# Layers that take no floor (``folder_floors``): an entry point sits in the folder of the command it runs (``python
# -m stablemoe_jax.data.wmt``) or at the package root, above every layer, so it takes no part in its folder's.
UNRANKED = ("cli", "entry", "benchmarks")


def module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(ROOT).with_suffix("").parts)
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(files: dict[str, pathlib.Path]) -> dict[str, set[str]]:
  """{module: the project modules it imports}; ``from pkg import name`` is an edge to ``pkg.name`` if that is a
  module, else to ``pkg`` (its ``__init__``)."""
  edges = {}
  for name, path in files.items():
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, ast.Import):
        candidates = [alias.name for alias in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
        candidates = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base for alias in node.names]
      else:
        continue
      for target in candidates:
        while target and target not in files:
          target = target.rpartition(".")[0]
        if target and target != name:
          targets.add(target)
    edges[name] = targets
  return edges


def project_files() -> dict[str, pathlib.Path]:
  return {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


@functools.cache
def _project_graph() -> dict[str, frozenset[str]]:
  return {module: frozenset(targets) for module, targets in import_graph(project_files()).items()}


def project_graph() -> dict[str, set[str]]:
  """The project's import graph (parsed once per test session; each call returns a copy to change freely)."""
  return {module: set(targets) for module, targets in _project_graph().items()}


def layer_of(module: str, layers=LAYERS) -> str:
  best = max(((len(prefix), layer) for layer, prefixes, _ in layers for prefix in prefixes
              if module == prefix or module.startswith(prefix + ".")), default=None)
  assert best is not None, f"{module} is in no layer of LAYERS; add it to one"
  return best[1]


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
  index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], 0
  for root in sorted(edges):
    if root in index:
      continue
    work = [(root, iter(sorted(edges[root])))]
    index[root] = low[root] = counter
    counter += 1
    stack.append(root)
    on_stack.add(root)
    while work:
      node, children = work[-1]
      child = next(children, None)
      if child is not None:
        if child not in index:
          index[child] = low[child] = counter
          counter += 1
          stack.append(child)
          on_stack.add(child)
          work.append((child, iter(sorted(edges[child]))))
        elif child in on_stack:
          low[node] = min(low[node], index[child])
        continue
      work.pop()
      if work:
        low[work[-1][0]] = min(low[work[-1][0]], low[node])
      if low[node] == index[node]:
        component = []
        while True:
          member = stack.pop()
          on_stack.discard(member)
          component.append(member)
          if member == node:
            break
        if len(component) > 1:
          out.append(sorted(component))
  return out


def upward_imports(edges: dict[str, set[str]], layers=LAYERS) -> list[str]:
  """File by file: each import whose target's layer is not one its module's layer may import ("*": any below)."""
  order = [layer for layer, _, _ in layers]
  allowed = {layer: set(order[:position]) if may == "*" else set(may)
             for position, (layer, _, may) in enumerate(layers)}
  found = []
  for module, targets in sorted(edges.items()):
    source = layer_of(module, layers)
    for target in sorted(targets):
      goal = layer_of(target, layers)
      if goal != source and goal not in allowed[source]:
        found.append(f"{module} ({source}) imports {target} ({goal})")
  return found


def folder_of(module: str) -> str:
  """The package a module's file lies in (a package's ``__init__`` lies in its own package)."""
  return module if module in _packages() else module.rpartition(".")[0]


@functools.cache
def _packages() -> frozenset[str]:
  return frozenset(module for module, path in project_files().items() if path.name == "__init__.py")


def folder_floors(edges: dict[str, set[str]], layers=LAYERS) -> dict[str, set[int]]:
  """{folder: the rows of ``layers`` (bottom 0) its modules are in}, entry points and benchmarks left out."""
  order = [layer for layer, _, _ in layers]
  floors = {}
  for module in edges:
    layer = layer_of(module, layers)
    if layer not in UNRANKED:
      floors.setdefault(folder_of(module), set()).add(order.index(layer))
  return floors


def folders_on_several_floors(edges: dict[str, set[str]], layers=LAYERS) -> list[str]:
  """Folders that are not one floor: a module of another folder lies in a row between their lowest and highest.

  A folder may hold several adjacent rows (``experiment/``: step, validation, runners), never straddle another."""
  floors = folder_floors(edges, layers)
  found = []
  for folder, rows in sorted(floors.items()):
    inside = set(range(min(rows) + 1, max(rows)))
    others = sorted(other for other, theirs in floors.items() if other != folder and theirs & inside)
    if others:
      found.append(f"{folder} spans rows {min(rows)}-{max(rows)} of the table, across {others}")
  return found


def upward_folder_imports(edges: dict[str, set[str]], layers=LAYERS) -> list[str]:
  """Folder-level imports that point up: a module of folder F imports one of folder G while G's highest row lies
  above F's lowest (an entry point's imports are its own, not its folder's)."""
  floors = folder_floors(edges, layers)
  found = set()
  for module, targets in edges.items():
    source = folder_of(module)
    if layer_of(module, layers) in UNRANKED:
      continue
    for target in targets:
      goal = folder_of(target)
      if goal != source and layer_of(target, layers) not in UNRANKED and max(floors[goal]) > min(floors[source]):
        found.add(f"{source} imports {goal} ({module} -> {target})")
  return sorted(found)


def test_the_layer_table_points_only_downward():
  order = [layer for layer, _, _ in LAYERS]
  assert len(set(order)) == len(order)
  for position, (layer, _, may) in enumerate(LAYERS):
    below = set(order[:position])
    assert may == "*" or set(may) <= below, f"{layer} may import {sorted(set(may) - below)}, which are not below it"


def test_no_import_circles():
  assert circles(project_graph()) == []


def test_no_import_from_a_lower_layer_to_a_higher_one():
  assert upward_imports(project_graph()) == []


def test_one_floor_per_folder():
  assert folders_on_several_floors(project_graph()) == []


def test_no_folder_imports_a_folder_above_it():
  assert upward_folder_imports(project_graph()) == []


def test_the_old_train_folder_is_caught_on_three_floors():
  """The layout before issue 41: the step and the loop inside ``train/``, below and above ``tasks/``."""
  old = {"stablemoe_jax.experiment.step": "stablemoe_jax.train.step",
         "stablemoe_jax.experiment.loop": "stablemoe_jax.train.loop"}
  rename = lambda module: old.get(module, module)
  edges = {rename(module): {rename(t) for t in targets} for module, targets in project_graph().items()}
  layers = tuple((layer, tuple(rename(p) for p in prefixes), may) for layer, prefixes, may in LAYERS)
  assert upward_imports(edges, layers) == []  # file by file, every import still points down
  assert any(line.startswith("stablemoe_jax.train spans") and "stablemoe_jax.tasks" in line
             for line in folders_on_several_floors(edges, layers))
  upward = upward_folder_imports(edges, layers)
  assert any(line.startswith("stablemoe_jax.tasks imports stablemoe_jax.train (") for line in upward)


def test_a_planted_circle_and_an_upward_import_are_found():
  edges = project_graph()
  edges["stablemoe_jax.core.constants"].add("stablemoe_jax.experiment.loop")
  assert any("stablemoe_jax.core.constants" in c and "stablemoe_jax.experiment.loop" in c for c in circles(edges))
  assert "stablemoe_jax.core.constants (core) imports stablemoe_jax.experiment.loop (runners)" in upward_imports(edges)


# The imports that ran back up before issue 54, as those files had them: the shared `cli` imported the loop for its
# NonFiniteLossError, and the prepare command lived in the data layer, importing `cli` and the config check.
OLD_BACK_UP_IMPORTS = {
    "stablemoe_jax.cli": "from stablemoe_jax.core.errors import ConfigError, DataError, DataNotFoundError\n"
                         "from stablemoe_jax.experiment import loop\n"
                         "from stablemoe_jax.train.checkpoint import CheckpointMismatchError\n",
    "stablemoe_jax.data.prepare.__main__": "from stablemoe_jax import cli\n"
                                           "from stablemoe_jax.data.prepare import lm as lm_prepare\n"
                                           "from stablemoe_jax.experiment.config_validation import validate_config\n",
}


def test_the_old_back_up_imports_are_caught_file_by_file(tmp_path):
  files = project_files()
  for module, source in OLD_BACK_UP_IMPORTS.items():
    files[module] = tmp_path / f"{module}.py"
    files[module].write_text(source)
  old = import_graph(files)
  assert upward_imports({m: old[m] for m in OLD_BACK_UP_IMPORTS}) == [
      "stablemoe_jax.cli (cli) imports stablemoe_jax.experiment.loop (runners)",
      "stablemoe_jax.data.prepare.__main__ (data.prepare) imports stablemoe_jax.cli (cli)",
      "stablemoe_jax.data.prepare.__main__ (data.prepare) imports stablemoe_jax.experiment.config_validation "
      "(validation)",
  ]


def test_a_command_name_inside_the_data_layer_that_hands_over_to_its_entry_point_is_caught(tmp_path):
  """Until issue 76 the command was named ``python -m stablemoe_jax.data.prepare``: a ``data/prepare/__main__.py``
  that only handed over to the command above the layers, one import up from the data layer. The command is
  ``python -m stablemoe_jax.prepare`` now; such a file would be caught."""
  files = project_files()
  files["stablemoe_jax.data.prepare.__main__"] = tmp_path / "__main__.py"
  files["stablemoe_jax.data.prepare.__main__"].write_text("from stablemoe_jax import prepare\n")
  old = import_graph(files)
  assert upward_imports({"stablemoe_jax.data.prepare.__main__": old["stablemoe_jax.data.prepare.__main__"]}) == [
      "stablemoe_jax.data.prepare.__main__ (data.prepare) imports stablemoe_jax.prepare (entry)"]


def test_cli_and_the_data_layer_may_not_import_an_entry_point():
  edges = project_graph()
  edges["stablemoe_jax.cli"].add("stablemoe_jax.prepare")
  edges["stablemoe_jax.data.prepare.lm"].add("stablemoe_jax.prepare")
  assert upward_imports(edges) == [
      "stablemoe_jax.cli (cli) imports stablemoe_jax.prepare (entry)",
      "stablemoe_jax.data.prepare.lm (data.prepare) imports stablemoe_jax.prepare (entry)",
  ]


@pytest.mark.parametrize("source", ["from stablemoe_jax.experiment import loop",
                                    "import stablemoe_jax.experiment.loop",
                                    "def f():\n  from stablemoe_jax.experiment.loop import Experiment"])
def test_every_spelling_of_an_import_is_an_edge(tmp_path, source):
  path = tmp_path / "probe.py"
  path.write_text(source + "\n")
  files = {"stablemoe_jax.experiment.loop": ROOT / "stablemoe_jax" / "experiment" / "loop.py", "probe": path}
  assert import_graph(files)["probe"] == {"stablemoe_jax.experiment.loop"}
