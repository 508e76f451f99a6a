"""The import layers (DEVELOPERS.md, "Layers"): no import circle, and no import from a layer to one above it.

Reads every ``import`` statement of ``stablemoe_jax/``, ``configs/`` and ``benchmarks/`` with ``ast`` (those inside
functions too: a deferred import is still a dependency), builds the file graph and checks it against ``LAYERS``.
Nothing is imported, so the test takes well under a second.
"""
from __future__ import annotations

import ast
import functools
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("stablemoe_jax", "configs", "benchmarks")

# Bottom first: (layer, the modules in it (a prefix takes its submodules; the longest prefix wins), the layers it may
# import besides itself). Every layer named on the right must lie below: an upward import cannot be declared.
LAYERS = (
    # The package root is here, so a new module that no row names falls to the bottom and fails on any import.
    ("core", ("stablemoe_jax", "stablemoe_jax.core"), ()),
    ("parallel", ("stablemoe_jax.parallel",), ("core",)),
    ("models", ("stablemoe_jax.models", "stablemoe_jax.flops"), ("core", "parallel")),
    ("data.common", ("stablemoe_jax.data", "stablemoe_jax.data.common"), ("core",)),
    ("data.lm", ("stablemoe_jax.data.lm",), ("core", "data.common")),
    ("data.translation", ("stablemoe_jax.data.translation",), ("core", "data.common")),
    ("data.prepare", ("stablemoe_jax.data.prepare",), ("core", "data.common", "data.lm", "data.translation")),
    ("decoding", ("stablemoe_jax.decoding",), ("core", "parallel", "models", "data.common", "data.translation")),
    ("analysis", ("stablemoe_jax.analysis",), ("core", "parallel", "models")),
    ("train", ("stablemoe_jax.train",), ("core", "parallel", "models")),
    ("tasks", ("stablemoe_jax.tasks",),
     ("core", "parallel", "models", "data.common", "data.lm", "data.translation", "decoding", "train")),
    ("step", ("stablemoe_jax.train.step",), ("core", "parallel", "models", "train", "tasks")),
    ("validation", ("stablemoe_jax.config_validation",),
     ("core", "models", "data.common", "data.lm", "data.translation", "analysis", "train", "tasks")),
    ("runners", ("stablemoe_jax.train.loop", "stablemoe_jax.plan"),
     ("core", "parallel", "models", "analysis", "train", "tasks", "step", "validation")),
    ("entry", ("stablemoe_jax.main", "stablemoe_jax.cli", "stablemoe_jax.commands", "stablemoe_jax.compare",
              "stablemoe_jax.data.prepare.__main__", "stablemoe_jax.data.download", "stablemoe_jax.data.wmt"), "*"),
    ("configs", ("configs",), ("core", "data.translation")),
    ("benchmarks", ("benchmarks",), "*"),
)


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


def layer_of(module: str) -> str:
  best = max(((len(prefix), layer) for layer, prefixes, _ in LAYERS for prefix in prefixes
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


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
  allowed = {layer: may for layer, _, may in LAYERS}
  found = []
  for module, targets in sorted(edges.items()):
    source = layer_of(module)
    for target in sorted(targets):
      goal = layer_of(target)
      if goal != source and allowed[source] != "*" and goal not in allowed[source]:
        found.append(f"{module} ({source}) imports {target} ({goal})")
  return found


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


def test_a_planted_circle_and_an_upward_import_are_found():
  edges = project_graph()
  edges["stablemoe_jax.core.constants"].add("stablemoe_jax.train.loop")
  assert any("stablemoe_jax.core.constants" in c and "stablemoe_jax.train.loop" in c for c in circles(edges))
  assert "stablemoe_jax.core.constants (core) imports stablemoe_jax.train.loop (runners)" in upward_imports(edges)


@pytest.mark.parametrize("source", ["from stablemoe_jax.train import loop", "import stablemoe_jax.train.loop",
                                    "def f():\n  from stablemoe_jax.train.loop import Experiment"])
def test_every_spelling_of_an_import_is_an_edge(tmp_path, source):
  path = tmp_path / "probe.py"
  path.write_text(source + "\n")
  files = {"stablemoe_jax.train.loop": ROOT / "stablemoe_jax" / "train" / "loop.py", "probe": path}
  assert import_graph(files)["probe"] == {"stablemoe_jax.train.loop"}
