"""The package's import rules (docs/architecture.md, "Modules and layers").

Read from the source with ``ast`` (nothing is imported): no import cycle between the
package's modules, no private name (``_x``) imported from or used on another module,
and every import pointing down the layers. Also: importing every module initialises
no JAX backend.
"""

import ast
import pathlib
import subprocess
import sys
import textwrap

import pytest

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent.parent / "padded_eval"
PACKAGE = "padded_eval"

# Private names imported across modules: none. Keep it that way (make the name public in a
# leaf module, or keep it home).
KNOWN_PRIVATE_IMPORTS: set[tuple[str, str, str]] = set()

# The layers, lowest first (docs/architecture.md): the folders of the package, in the order
# the data flows, with the few modules at the top given their own. A module may import
# modules of its own layer or below. The longest matching prefix decides a module's layer.
LAYERS = {
  "padded_eval.validation": 0,  # leaves: config checks, the mask rule, keyword routing
  "padded_eval.masking": 0,
  "padded_eval.routing": 0,
  "padded_eval.caches": 0,  # the one list of what is kept between calls (every layer registers)
  "padded_eval.exact": 1,  # error-free floats, exact accumulators
  "padded_eval.metrics": 2,  # the Metric protocol and one file per family
  "padded_eval.losses": 3,  # never metrics
  "padded_eval.collections": 4,  # above both metrics and losses
  "padded_eval.data": 5,  # sources, pad_batches, BatchSpec, sharding helpers: never metrics
  "padded_eval.multihost": 6,  # pre-flight agreement, lockstep of the steps
  "padded_eval.eval": 7,  # masked_eval, backends, compiled-step cache, outputs, checkpoints
  "padded_eval.plot": 8,  # pictures of metric states (matplotlib imported on use)
  "padded_eval.demo": 8,
  "padded_eval.ecosystem": 8,  # pe.nnx, pe.clu: flax / clu imported there only
  "padded_eval.lm": 8,  # pe.lm.HarnessLM: lm-eval imported there only
  "padded_eval.__main__": 8,
  "padded_eval": 8,  # the facade, __init__.py
}
TOP_MODULES_AT_MOST = 5  # modules at the top of padded_eval/ besides __init__ / __main__


def module_files() -> dict[str, pathlib.Path]:
  """``{module name: file}`` for every module of the package (packages as their __init__)."""
  modules = {}
  for path in sorted(PACKAGE_DIR.rglob("*.py")):
    parts = (PACKAGE,) + path.relative_to(PACKAGE_DIR).with_suffix("").parts
    if parts[-1] == "__init__":
      parts = parts[:-1]
    modules[".".join(parts)] = path
  return modules


MODULES = module_files()


def is_private(name: str) -> bool:
  return name.startswith("_") and not name.startswith("__")


def absolute(module: str, node: ast.ImportFrom) -> str:
  """The absolute module name of a ``from ... import`` (relative imports resolved)."""
  if not node.level:
    return node.module or ""
  is_package = MODULES[module].name == "__init__.py"
  base = module.split(".")[: len(module.split(".")) - node.level + is_package]
  return ".".join(base + ([node.module] if node.module else []))


class ImportReader(ast.NodeVisitor):
  """Collects a module's imports of package modules and its private-name uses."""

  def __init__(self, module: str):
    self.module = module
    self.imports: set[str] = set()  # package modules imported
    self.private: set[tuple[str, str]] = set()  # (module, private name) imported or used
    self.bound: dict[str, str] = {}  # local name -> package module it holds

  def visit_Import(self, node):
    for alias in node.names:
      if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
        self.imports.add(alias.name)
        if alias.asname:
          self.bound[alias.asname] = alias.name
        else:
          self.bound[PACKAGE] = PACKAGE

  def visit_ImportFrom(self, node):
    source = absolute(self.module, node)
    if source != PACKAGE and not source.startswith(PACKAGE + "."):
      return
    for alias in node.names:
      submodule = f"{source}.{alias.name}"
      if submodule in MODULES:  # a module (private modules are package-internal: fine)
        self.imports.add(submodule)
        self.bound[alias.asname or alias.name] = submodule
        continue
      self.imports.add(source)
      if is_private(alias.name):
        self.private.add((source, alias.name))

  def visit_Attribute(self, node):
    base = self.resolve(node.value)
    if base is not None and is_private(node.attr) and f"{base}.{node.attr}" not in MODULES:
      self.private.add((base, node.attr))
    self.generic_visit(node)

  def resolve(self, node) -> str | None:
    """The package module an expression names (``pe.metrics.base``), or None."""
    if isinstance(node, ast.Name):
      return self.bound.get(node.id)
    if isinstance(node, ast.Attribute):
      base = self.resolve(node.value)
      if base is not None and f"{base}.{node.attr}" in MODULES:
        return f"{base}.{node.attr}"
    return None


def read_imports() -> dict[str, ImportReader]:
  readers = {}
  for module, path in MODULES.items():
    reader = ImportReader(module)
    reader.visit(ast.parse(path.read_text(), filename=str(path)))
    readers[module] = reader
  return readers


READERS = read_imports()


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One import cycle of ``graph`` as a path ``[a, b, ..., a]``, or None."""
  state = {}  # module -> "open" while on the DFS path, "done" after

  def visit(module, path):
    state[module] = "open"
    for target in sorted(graph.get(module, ())):
      if state.get(target) == "open":
        return path[path.index(target) :] + [target]
      if target not in state:
        cycle = visit(target, path + [target])
        if cycle:
          return cycle
    state[module] = "done"
    return None

  for module in sorted(graph):
    if module not in state:
      cycle = visit(module, [module])
      if cycle:
        return cycle
  return None


def layer_of(module: str) -> int:
  matches = [prefix for prefix in LAYERS if module == prefix or module.startswith(prefix + ".")]
  if not matches:
    pytest.fail(f"{module} has no layer: add it to LAYERS here and to docs/architecture.md")
  return LAYERS[max(matches, key=len)]


def test_the_reader_sees_what_it_must_refuse():
  """The checks below would fail on the patterns they forbid."""
  modules = {"padded_eval.a", "padded_eval.b"}
  MODULES.update({m: PACKAGE_DIR / "x.py" for m in modules})
  try:
    reader = ImportReader("padded_eval.a")
    reader.visit(
      ast.parse("from padded_eval.b import _x, y\nfrom padded_eval import b\nb._z\nb.w\nimport os")
    )
    assert reader.imports == {"padded_eval.b"}
    assert reader.private == {("padded_eval.b", "_x"), ("padded_eval.b", "_z")}
    attribute = ImportReader("padded_eval.a")
    attribute.visit(ast.parse("import padded_eval.b\nimport padded_eval as pe\npe.b._q"))
    assert attribute.private == {("padded_eval.b", "_q")}
  finally:
    for m in modules:
      del MODULES[m]
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle():
  graph = {m: {t for t in r.imports if t in MODULES and t != m} for m, r in READERS.items()}
  assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_no_private_name_imported_from_another_module():
  found = {
    (module, source, name)
    for module, reader in READERS.items()
    for source, name in reader.private
    if source != module
  }
  unexpected = sorted(found - KNOWN_PRIVATE_IMPORTS)
  assert not unexpected, (
    "private names imported or used across modules (make them public in a leaf module, "
    f"or keep them home): {unexpected}"
  )
  # An entry that no longer occurs must leave the allow-list, so it only shrinks.
  stale = sorted(KNOWN_PRIVATE_IMPORTS - found)
  assert not stale, f"remove from KNOWN_PRIVATE_IMPORTS, no longer imported: {stale}"


def test_imports_point_down_the_layers():
  upward = sorted(
    (module, target)
    for module, reader in READERS.items()
    for target in reader.imports
    if target in MODULES and layer_of(target) > layer_of(module)
  )
  assert not upward, f"imports from a higher layer (see docs/architecture.md): {upward}"


def test_every_folder_is_one_layer():
  """A layer is a folder (or one of the few top modules): no module has a layer of its own."""
  for module in MODULES:
    if module.count(".") >= 2:  # inside a subpackage: its folder decides
      folder = ".".join(module.split(".")[:2])
      assert folder in LAYERS, f"{module}: its folder {folder} has no layer"
      matches = [p for p in LAYERS if module.startswith(p + ".") or module == p]
      assert max(matches, key=len) == folder, f"{module} has a layer apart from its folder's"


def test_at_most_five_modules_at_the_top():
  top = sorted(
    path.name
    for path in PACKAGE_DIR.glob("*.py")
    if path.name not in ("__init__.py", "__main__.py")
  )
  assert len(top) <= TOP_MODULES_AT_MOST, f"modules at the top of padded_eval/: {top}"


def test_only_package_facades_re_export():
  """``from x import y as y`` (a re-export) only in ``__init__.py``: no compatibility shims."""
  found = []
  for module, path in MODULES.items():
    if path.name == "__init__.py":
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, (ast.Import, ast.ImportFrom)):
        found += [(module, a.name) for a in node.names if a.asname == a.name.split(".")[-1]]
  assert not found, f"re-exports outside __init__.py (import from the home module): {found}"


def test_no_ambient_state():
  """No context variable carries state between a metric and its helpers (explicit `Totals`)."""
  found = [
    module
    for module, reader in READERS.items()
    if "contextvars" in {n.split(".")[0] for n in _stdlib_imports(MODULES[module])}
  ]
  assert not found, f"modules using contextvars: {found}"


def _stdlib_imports(path: pathlib.Path) -> set[str]:
  names = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      names.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
      names.add(node.module)
  return names


def test_leaf_modules_import_nothing_from_the_package():
  for module in ("padded_eval.validation", "padded_eval.masking", "padded_eval.routing"):
    assert not READERS[module].imports, (module, READERS[module].imports)


def test_losses_do_not_import_metrics_or_collections():
  for module in (m for m in MODULES if m.startswith("padded_eval.losses")):
    imported = READERS[module].imports
    assert not {t for t in imported if t.startswith(("padded_eval.metrics", "padded_eval.coll"))}


def test_importing_every_module_initialises_no_jax_backend():
  modules = sorted(m for m in MODULES if m != "padded_eval.__main__")
  script = textwrap.dedent(
    f"""
    import importlib
    for name in {modules!r}:
      importlib.import_module(name)
    from jax._src import xla_bridge
    assert not xla_bridge._backends, xla_bridge._backends
    import jax
    jax.devices()
    assert xla_bridge._backends  # the check above would see a backend
    print("ok")
    """
  )
  result = subprocess.run(
    [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
  )
  assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]
