"""pyproject.toml declares what the package imports, and the same packages as requirements.txt (the README's
``pip install -r requirements.txt``): ``pip install -e .`` then installs a working package."""
from __future__ import annotations

import ast
import importlib.metadata
import sys
import tomllib

from tests.conftest import REPO
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def _requirement(text: str) -> tuple[str, str]:
  requirement = Requirement(text)
  return canonicalize_name(requirement.name), str(requirement.specifier)


def _project() -> dict:
  return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _declared(extras=("beam", "tests")) -> set[tuple[str, str]]:
  """(name, version specifier) of the dependencies and the given extras, the extras' self-references left out."""
  project = _project()
  texts = list(project["dependencies"])
  for extra in extras:
    texts += project["optional-dependencies"][extra]
  return {_requirement(t) for t in texts if canonicalize_name(Requirement(t).name) != "stablemoe-jax"}


def test_pyproject_declares_what_requirements_txt_installs():
  lines = [line.split("#")[0].strip() for line in (REPO / "requirements.txt").read_text().splitlines()]
  required = {_requirement(line) for line in lines if line}
  assert _declared() == required


def test_extras_for_cuda_beam_and_tests():
  extras = _project()["optional-dependencies"]
  assert {Requirement(t).name for t in extras["beam"]} == {"apache-beam"}
  cuda = [Requirement(t) for t in extras["cuda"]]
  assert [(r.name, r.extras) for r in cuda] == [("jax", {"cuda12"})]
  jax_core = next(Requirement(t) for t in _project()["dependencies"] if Requirement(t).name == "jax")
  assert cuda[0].specifier == jax_core.specifier  # the CUDA wheels of the version the CPU install gets
  assert {Requirement(t).name for t in extras["tests"]} >= {"pytest", "pytest-xdist"}


def _third_party_imports(folders) -> set[str]:
  """Top-level names of every module imported (at any depth of the code) under ``folders``, outside the project."""
  names = set()
  for folder in folders:
    for path in (REPO / folder).rglob("*.py"):
      for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
          names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
          names.add(node.module.split(".")[0])
  return names - set(sys.stdlib_module_names) - {"stablemoe_jax", "configs", "__future__"}


def test_every_imported_package_is_declared():
  """Each third-party module the package (and its configs) imports comes from a declared distribution or from a
  dependency of one (jaxlib with jax, tensorflow-datasets' own requirements): checked on the installed environment."""
  modules = _third_party_imports(["stablemoe_jax", "configs"])
  assert {"jax", "flax", "optax", "ml_collections", "apache_beam"} <= modules  # the scan sees the imports
  distributions = importlib.metadata.packages_distributions()
  declared = {name for name, _ in _declared()}
  reachable, queue = set(), list(declared)
  while queue:  # the declared distributions and everything they require, as installed here
    name = queue.pop()
    if name in reachable:
      continue
    reachable.add(name)
    try:
      requires = importlib.metadata.requires(name) or []
    except importlib.metadata.PackageNotFoundError:
      continue
    queue += [canonicalize_name(Requirement(r).name) for r in requires if "extra ==" not in r]
  undeclared = {module: distributions.get(module) for module in modules
                if not {canonicalize_name(d) for d in distributions.get(module, [])} & reachable}
  assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"
