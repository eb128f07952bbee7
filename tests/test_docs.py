"""The API reference: every public name of `pe`, `pe.metrics` and `pe.plot` is on a page of
docs/api/ and carries an example, and the examples run. `mkdocs build --strict` itself runs in
.ci/run (the `docs` extra)."""

import doctest
import importlib
import pathlib
import re
import sys
import types

import pytest

import padded_eval as pe

ROOT = pathlib.Path(__file__).resolve().parent.parent
NAMESPACES = {"padded_eval": pe, "padded_eval.metrics": pe.metrics, "padded_eval.plot": pe.plot}


def public_names():
  """``{qualified name: object}`` of the public, non-module names of the three namespaces."""
  names = {}
  for prefix, namespace in NAMESPACES.items():
    for name in dir(namespace):
      value = getattr(namespace, name)
      if name.startswith("_") or isinstance(value, types.ModuleType):
        continue
      defined_in = getattr(value, "__module__", "")
      if namespace is pe.plot and defined_in != "padded_eval.plot":
        continue  # what pe.plot imports to draw (find_metric, the metric classes)
      if not defined_in.startswith("padded_eval"):
        continue
      if any(value is seen for seen in names.values()):
        continue  # pe.metrics.Metric is pe.Metric
      names[f"{prefix}.{name}"] = value
  return names


PUBLIC = public_names()


def documented_targets():
  """The objects the ``::: dotted.path`` lines of docs/api/*.md render."""
  targets = []
  for page in sorted((ROOT / "docs" / "api").glob("*.md")):
    for path in re.findall(r"^::: ([\w.]+)$", page.read_text(), re.M):
      module, _, attribute = path.rpartition(".")
      try:
        targets.append(getattr(importlib.import_module(module), attribute))
      except ModuleNotFoundError:
        targets.append(importlib.import_module(path))
  return targets


def test_the_api_reference_lists_every_public_name():
  targets = documented_targets()
  missing = [name for name, value in PUBLIC.items() if not any(value is t for t in targets)]
  assert not missing, f"add '::: <name>' to a page of docs/api/ for {missing}"
  assert len(PUBLIC) >= 40, sorted(PUBLIC)


@pytest.fixture(scope="module")
def collected_doctests(request) -> set[str]:
  """The names of the docstring examples this session runs as doctests (``--doctest-modules``
  over ``padded_eval/``, as in the whole suite's run)."""
  return {item.name for item in request.session.items if type(item).__name__ == "DoctestItem"}


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_every_public_name_has_an_example_that_runs(name, collected_doctests):
  """Each public name has an example, and it runs once per session: as a doctest where the
  session collects ``padded_eval/`` (the whole suite), here otherwise (``pytest tests/``)."""
  value = PUBLIC[name]
  module = sys.modules[value.__module__]
  finder = doctest.DocTestFinder(recurse=False)
  qualified = f"{value.__module__}.{value.__qualname__}"
  tests = [t for t in finder.find(value, qualified, globs=dict(vars(module))) if t.examples]
  assert tests, f"{name} has no '>>>' example in its docstring (an 'Examples:' section)"
  tests = [t for t in tests if t.name not in collected_doctests]
  runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
  for test in tests:
    runner.run(test)
  assert runner.failures == 0, f"{runner.failures} example(s) of {name} failed (output above)"


def test_the_site_reaches_the_readme_howto_architecture_and_changelog():
  config = (ROOT / "mkdocs.yml").read_text()
  for page in ["index.md", "architecture.md", "changelog.md", "api/padded_eval.md"]:
    assert re.search(rf"^\s+- (\w[\w ]*: )?{re.escape(page)}$", config, re.M), page
  for page in sorted((ROOT / "docs" / "howto").glob("*.md")):
    assert f"- howto/{page.name}\n" in config, page.name
  assert (ROOT / "docs" / "index.md").read_text().strip() == '--8<-- "README.md"'
  assert (ROOT / "docs" / "changelog.md").read_text().strip() == '--8<-- "CHANGELOG.md"'
  assert re.search(r"^strict: true$", config, re.M)
