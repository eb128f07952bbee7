"""Every ```python block of HOWTO.md runs, in order, in one namespace.

Later blocks build on earlier ones; they check themselves against numpy / scikit-learn float64.
"""

import pathlib
import re

HOWTO = pathlib.Path(__file__).resolve().parent.parent / "HOWTO.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def python_blocks(text):
  """``[(line number, code)]`` of the fenced python blocks of a Markdown text."""
  return [
    (text.count("\n", 0, match.start()) + 1, match.group(1)) for match in BLOCK.finditer(text)
  ]


def test_howto_has_the_promised_sections():
  text = HOWTO.read_text()
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


def test_every_python_block_runs(capsys):
  text = HOWTO.read_text()
  namespace = {"__name__": "howto"}
  for line, code in python_blocks(text):
    try:
      exec(compile(code, f"HOWTO.md:{line}", "exec"), namespace)
    except Exception as error:
      raise AssertionError(
        f"the ```python block at HOWTO.md line {line} failed: {type(error).__name__}: {error}"
      ) from error


README = HOWTO.parent / "README.md"
CI_RUN = HOWTO.parent / ".ci" / "run"


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
