"""Every ```python block of the HOWTO's pages (docs/howto/) runs, page by page.

A page's blocks run in order in one namespace that starts from the setup blocks of
docs/howto/index.md and, where the page says ``<!-- howto: runs after a.md -->``, from the
namespace the named pages left. They check themselves against numpy / scikit-learn float64.
"""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
HOWTO_DIR = ROOT / "docs" / "howto"
SETUP = "index.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)
RUNS_AFTER = re.compile(r"^<!-- howto: runs after(( [\w.-]+\.md)*) -->$", re.MULTILINE)
PAGES = sorted(path.name for path in HOWTO_DIR.glob("*.md") if path.name != SETUP)


def python_blocks(text):
  """``[(line number, code)]`` of the fenced python blocks of a Markdown text."""
  return [
    (text.count("\n", 0, match.start()) + 1, match.group(1)) for match in BLOCK.finditer(text)
  ]


def runs_after(page):
  """The pages whose namespace ``page`` continues, from its ``runs after`` line."""
  found = RUNS_AFTER.findall((HOWTO_DIR / page).read_text())
  assert len(found) == 1, f"{page} needs one '<!-- howto: runs after ... -->' line"
  return found[0][0].split()


def run_blocks(page, namespace):
  for line, code in python_blocks((HOWTO_DIR / page).read_text()):
    try:
      exec(compile(code, f"docs/howto/{page}:{line}", "exec"), namespace)
    except Exception as error:
      raise AssertionError(
        f"the ```python block at docs/howto/{page} line {line} failed: "
        f"{type(error).__name__}: {error}"
      ) from error


_NAMESPACES = {}


def namespace_after(page):
  """The names a page leaves, run once per test session (its dependents get a copy)."""
  if page not in _NAMESPACES:
    namespace = {"__name__": "howto"}
    if page == SETUP:
      run_blocks(SETUP, namespace)
    else:
      for earlier in runs_after(page) or [SETUP]:
        namespace.update(namespace_after(earlier))
      run_blocks(page, namespace)
    _NAMESPACES[page] = dict(namespace)
  return _NAMESPACES[page]


def test_howto_has_the_promised_sections():
  text = "\n".join((HOWTO_DIR / page).read_text() for page in [SETUP, *PAGES])
  for topic in (
    "mnist",
    "imagenet",
    "lm1b",
    "wmt",
    "seq2seq",
    "nlp_seq",
    "sst2",
    "vae",
    "pixelcnn",
    "graph",
    "ppo",
    "MultiMetric",
    "Multi-host",
    "shard_map",
  ):
    assert topic in text, topic
  assert len(python_blocks(text)) >= 10
  index = (HOWTO_DIR / SETUP).read_text()
  root = (ROOT / "HOWTO.md").read_text()
  for page in PAGES:  # every page is listed on the first page and in the root HOWTO.md
    assert f"]({page})" in index and f"](docs/howto/{page})" in root, page
    assert python_blocks((HOWTO_DIR / page).read_text()), page


@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_of_the_page_runs(page):
  namespace_after(page)


README = ROOT / "README.md"
CI_RUN = ROOT / ".ci" / "run"


def test_readme_python_blocks_run():
  namespace = {"__name__": "readme"}
  for line, code in python_blocks(README.read_text()):
    exec(compile(code, f"README.md:{line}", "exec"), namespace)


def test_readme_quick_start_is_two_commands_agreeing_with_ci():
  bash_blocks = re.findall(r"^```bash\n(.*?)^```$", README.read_text(), re.DOTALL | re.MULTILINE)
  assert len(bash_blocks) == 2, bash_blocks
  demo, tests = (block.strip() for block in bash_blocks)
  assert "\n" not in demo and "\n" not in tests
  assert demo.endswith("-m padded_eval demo") and "'.[tf,demo]'" in demo
  assert tests.endswith("-m pytest")
  ci = CI_RUN.read_text()
  extras = re.search(r"pip install (?:--quiet )*-e (\S+)", ci).group(1)
  assert f"pip install -e {extras}" in tests, (extras, tests)
  assert "-m pytest" in ci
