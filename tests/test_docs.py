"""The API reference: every public name of `pe`, `pe.metrics` and `pe.plot` is on a page of
docs/api/ and carries an example, and the examples run. `mkdocs build --strict` itself runs in
.ci/run (the `docs` extra)."""

import doctest
import importlib
import inspect
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


# --- the built reference (issue 65): what a reader of the pages sees ------------------------


def _metric_classes():
  """``{name: class}`` of the public metric classes of ``pe.metrics`` (not functions)."""
  return {
    name.rpartition(".")[2]: value
    for name, value in PUBLIC.items()
    if name.startswith("padded_eval.metrics.")
    and isinstance(value, type)
    and issubclass(value, pe.Metric)
    and value is not pe.Metric
  }


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
  """The site built by ``mkdocs build --strict`` into a temporary folder (skipped without the
  ``docs`` extra)."""
  pytest.importorskip("mkdocstrings")
  import subprocess

  site = tmp_path_factory.mktemp("site")
  done = subprocess.run(
    [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert done.returncode == 0, done.stderr[-4000:]
  return site


def _sections(html: str) -> dict[str, list[str]]:
  """``{heading id: [its HTML, ...]}`` of the object headings (``<hN id="padded_eval...">``)."""
  heads = list(re.finditer(r'<h[1-6] id="(padded_eval[\w.]*)"', html))
  sections: dict[str, list[str]] = {}
  for head, following in zip(heads, heads[1:] + [None]):
    end = following.start() if following else len(html)
    sections.setdefault(head.group(1), []).append(html[head.start() : end])
  return sections


def _parameters(section: str) -> set[str]:
  """The names of a section's "Parameters" entries (``<b><code>name</code></b>``; not the
  ``code`` spans of their descriptions)."""
  names = set()
  for block in re.findall(r"Parameters:</th>(.*?)</td>", section, re.S):
    names |= set(re.findall(r"<b><code>(\w+)</code></b>", block))
  return names


def test_the_metrics_page_describes_each_metric_once_with_every_argument(built_site):
  html = (built_site / "api" / "metrics" / "index.html").read_text()
  sections = _sections(html)
  classes = _metric_classes()
  twice = [
    name
    for name, cls in classes.items()
    if len(sections.get(f"padded_eval.metrics.{name}", []))
    + (cls.__name__ != name) * len(sections.get(f"padded_eval.metrics.{cls.__name__}", []))
    > 1
  ]
  assert not twice, f"described more than once on the metrics page: {twice}"
  missing = {}
  for name, cls in classes.items():
    # NPV is NegativePredictiveValue: described under either name
    found = sections.get(f"padded_eval.metrics.{name}") or sections.get(
      f"padded_eval.metrics.{cls.__name__}"
    )
    (section,) = found or [""]
    params = [p for p in inspect.signature(cls).parameters.values() if p.kind != p.VAR_KEYWORD]
    absent = [p.name for p in params if p.name not in _parameters(section)]
    if absent:
      missing[name] = absent
  assert not missing, f"constructor arguments missing from the rendered Parameters: {missing}"


def test_no_page_points_at_a_module_docstring_it_does_not_render(built_site):
  pages = {page: page.read_text() for page in built_site.rglob("*.html")}
  anchors = {a for html in pages.values() for a in re.findall(r'id="(padded_eval[\w.]*)"', html)}
  for page, html in pages.items():
    for found in re.finditer(r"module docstring", html):
      after = html[found.start() - 300 : found.end() + 400]  # the phrase is the link, or near it
      link = re.search(r'href="[^"]*#(padded_eval[\w.]*)"', after)
      assert link and link.group(1) in anchors, (
        page,
        re.sub(r"<[^>]+>", "", html[found.start() - 200 : found.end() + 100]),
      )


def test_a_multi_line_returns_section_is_one_entry(built_site):
  html = (built_site / "api" / "padded_eval" / "index.html").read_text()
  (section,) = _sections(html)["padded_eval.masked_eval"]
  returns = re.search(r"Returns:(.*?)</table>|Returns:(.*?)</ul>", section, re.S)
  assert returns, "masked_eval's Returns section is not rendered"
  block = returns.group(1) or returns.group(2)
  entries = len(re.findall(r"<tr", block)) - 1 if "<tr" in block else len(re.findall(r"<li", block))
  assert entries == 1, f"masked_eval's Returns is {entries} entries"
