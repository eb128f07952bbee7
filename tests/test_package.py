"""The package as a user installs it: version, license, metadata, extras, the README off GitHub.

The wheel itself (built, `twine check --strict`, installed into a fresh venv and imported from
another directory) is checked by .ci/run; these tests read the files that go into it.
"""

import importlib.util
import pathlib
import re
import subprocess
import sys

import tomllib
from packaging.version import Version

import padded_eval as pe

ROOT = pathlib.Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


def test_version_is_written_once_and_read_by_the_metadata():
  assert str(Version(pe.__version__)) == pe.__version__, pe.__version__
  assert "version" not in PROJECT and "version" in PROJECT["dynamic"]
  assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {
    "attr": "padded_eval.__version__"
  }
  written = re.findall(
    r"^__version__ = \"(.+)\"$", (ROOT / "padded_eval/__init__.py").read_text(), re.M
  )
  assert written == [pe.__version__]


def test_license_is_an_spdx_expression_with_its_file():
  assert PROJECT["license"] == "Apache-2.0"
  assert PROJECT["license-files"] == ["LICENSE"]
  text = (ROOT / "LICENSE").read_text()
  assert "Apache License" in text and "Version 2.0, January 2004" in text
  assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
  # PEP 639: a license expression replaces the license classifiers.
  assert not [c for c in PROJECT["classifiers"] if c.startswith("License ::")]


def test_classifiers_and_urls():
  classifiers = PROJECT["classifiers"]
  assert "Typing :: Typed" in classifiers
  floor = PROJECT["requires-python"].removeprefix(">=")
  assert f"Programming Language :: Python :: {floor}" in classifiers
  urls = PROJECT["urls"]
  assert {"Homepage", "Documentation", "Repository", "Issues", "Changelog"} <= set(urls)
  assert all(url.startswith("https://") for url in urls.values()), urls


def test_py_typed_ships_in_the_package():
  assert (ROOT / "padded_eval" / "py.typed").is_file()
  assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["padded_eval"]


def test_changelog_starts_at_this_release():
  text = (ROOT / "CHANGELOG.md").read_text()
  releases = re.findall(r"^## \[([^\]]+)\]", text, re.M)
  assert releases[:2] == ["Unreleased", pe.__version__], releases
  assert re.search(rf"^\[{re.escape(pe.__version__)}\]: https://", text, re.M)


def test_readme_links_work_on_a_package_index():
  """A package index shows the README without the repository: no relative link or image."""
  text = (ROOT / "README.md").read_text()
  targets = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)", text) + re.findall(
    r"<img [^>]*src=\"([^\"]+)", text
  )
  assert targets, "the README links to its docs"
  relative = [t for t in targets if not t.startswith("https://")]
  assert not relative, relative
  repository = PROJECT["urls"]["Repository"]
  raw = repository.replace("https://github.com/", "https://raw.githubusercontent.com/")
  ours = [t for t in targets if "github" in t]
  assert all(t.startswith((repository + "/", raw + "/")) for t in ours), ours
  # the files linked on the default branch exist in this checkout
  for target in ours:
    path = target.removeprefix(raw + "/main/").split("/main/", 1)[-1].split("#")[0]
    assert (ROOT / path).exists(), target


def test_no_extra_pulls_cuda_wheels():
  """PyPI's Linux torch wheel (and jax[cuda*], tensorflow[and-cuda]) bring GB of CUDA libraries."""
  cuda = re.compile(
    r"^(torch|torchvision|torchaudio|nvidia-|jax\[cuda|jax-cuda|tensorflow\[and-cuda)"
  )
  offending = {
    extra: [r for r in requirements if cuda.match(r)]
    for extra, requirements in PROJECT["optional-dependencies"].items()
  }
  assert not any(offending.values()), offending
  assert "download.pytorch.org/whl/cpu" in (ROOT / "README.md").read_text()


def test_demo_without_its_extras_says_which_in_one_line():
  # flax (demo extra) and tensorflow_datasets (tf extra) made unimportable in a fresh process.
  code = (
    "import sys; sys.modules['flax'] = None; sys.modules['tensorflow_datasets'] = None; "
    "from padded_eval.__main__ import main; sys.exit(main(['demo', '--devices', '2']))"
  )
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert done.returncode == 2, done.stdout + done.stderr
  assert "Traceback" not in done.stderr and not done.stdout, done.stdout + done.stderr
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1, lines
  assert "pip install 'padded_eval[tf,demo]'" in lines[0] and "flax" in lines[0], lines
  assert "tensorflow_datasets" in lines[0] and "optax" not in lines[0], lines
  assert importlib.util.find_spec("flax") is not None  # this process is untouched


def test_public_surface_takes_arraylike_and_returns_jax_arrays():
  """py.typed makes these annotations what a user's type checker sees."""
  import inspect

  metrics = [
    value
    for value in vars(pe.metrics).values()
    if isinstance(value, type) and issubclass(value, pe.Metric)
  ]
  for metric in metrics:
    for method in ("update", "batch_updates"):
      kwargs = inspect.signature(getattr(metric, method)).parameters["kwargs"]
      assert kwargs.annotation == "ArrayLike", (metric.__name__, method, kwargs.annotation)
    if metric not in (
      pe.Metric,
      pe.metrics.Bootstrap,
      pe.metrics.Sliced,
      pe.metrics.FromFun,
    ):  # those return what they wrap
      returned = inspect.signature(metric.compute).return_annotation
      assert returned == "jax.Array", (metric.__name__, returned)


# The facade's names: the public API as DESIGN.md ("Public contract") and docs/api/ promise it.
# Internal modules (routing, validation, masking, exact.accumulate, multihost.distributed) are
# imported from their own module paths, not through `pe`.
FACADE = {
  # modules
  "collections",
  "losses",
  "metrics",
  "plot",
  "regularizers",
  "results",
  # data
  "pad_batches",
  "PaddedBatches",
  "shard",
  "unshard",
  "prefetch_to_device",
  "global_batch",
  "data_axes",
  "process_slice",
  # metrics and collections
  "Metric",
  "Metrics",
  "Losses",
  "LossesAndMetrics",
  # the driver
  "masked_eval",
  "place_params",
  "EvalResults",
  "best",
  "InvalidValuesWarning",
  "RecompileWarning",
  "clear_caches",
}
LAZY = {"nnx", "clu", "lm"}  # imported on first read (flax, clu, lm-eval optional)


def facade_re_exports() -> set[str]:
  """The names `padded_eval/__init__.py` re-exports (``from x import y as y``), read with ast."""
  import ast

  tree = ast.parse((ROOT / "padded_eval" / "__init__.py").read_text())
  names = set()
  for node in tree.body:
    if isinstance(node, ast.ImportFrom):
      names.update(a.asname for a in node.names if a.asname == a.name)
  return names


def test_the_facade_exports_the_public_api_only():
  assert facade_re_exports() == FACADE, sorted(facade_re_exports() ^ FACADE)
  for name in FACADE | LAZY | {"__version__"}:
    assert getattr(pe, name) is not None, name
  internal = {"routing", "validation", "masking", "accumulate", "distributed", "importlib"}
  assert not internal & facade_re_exports()
  assert "importlib" not in vars(pe)  # the lazy import's helper is private


def test_every_facade_name_is_documented():
  """Each name the facade exports is on a page of docs/api/ (a module on modules.md) or in
  DESIGN's contract, as ``pe.<name>``, in the README or the HOWTO."""
  api = "".join(page.read_text() for page in (ROOT / "docs" / "api").glob("*.md"))
  prose = (ROOT / "README.md").read_text() + (ROOT / "HOWTO.md").read_text()
  for name in sorted(FACADE):
    module = getattr(pe, name).__name__ if isinstance(getattr(pe, name), type(pe)) else None
    on_a_page = f"::: padded_eval.{name}\n" in api or f"::: {module}\n" in api
    assert on_a_page or f"pe.{name}" in prose, name
