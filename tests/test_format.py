"""The tree is formatted and linted as pyproject.toml configures (ruff, 2-space indent)."""

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
  exe = pathlib.Path(sys.executable).with_name("ruff")
  if exe.exists():
    return [str(exe)]
  found = shutil.which("ruff")
  if found is None:
    pytest.fail("ruff is not installed; it comes with the test extra: pip install -e '.[test]'")
  return [found]


@pytest.mark.parametrize(
  "args", [["format", "--check", "--diff"], ["check"]], ids=["format", "lint"]
)
def test_ruff(args):
  done = subprocess.run(_ruff() + args + ["."], cwd=ROOT, capture_output=True, text=True)
  assert done.returncode == 0, (
    f"ruff {' '.join(args)} failed; run `ruff format . && ruff check --fix .`\n"
    + done.stdout[-4000:]
    + done.stderr[-2000:]
  )
