"""The test processes' own setup (the root conftest.py): promotion, and a crashed worker's last words."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_tests_run_under_rank_promotion_raise():
  assert jax.config.jax_numpy_rank_promotion == "raise"
  with pytest.raises(ValueError, match="rank_promotion"):
    jnp.ones((2, 3)) + jnp.ones(3)


@pytest.mark.slow
def test_a_crashed_workers_c_level_stderr_ends_the_summary(tmp_path):
  (tmp_path / "test_crash.py").write_text(
    textwrap.dedent(
      """
      import os

      def test_passes():
        pass

      def test_aborts():
        os.write(2, b"F0000 rendezvous.cc:1] the reason the worker died\\n")
        os.abort()
      """
    )
  )
  env = {**os.environ, "PYTHONPATH": ROOT}
  env.pop("PYTEST_XDIST_WORKER", None)
  env.pop("PADDED_EVAL_TEST_WORKER_LOGS", None)
  run = subprocess.run(
    [
      sys.executable,
      "-m",
      "pytest",
      "-p",
      "conftest",
      "-n",
      "1",
      "--capture=sys",
      "-q",
      "-p",
      "no:cacheprovider",
      "--rootdir",
      str(tmp_path),
      "-c",
      os.devnull,
      str(tmp_path),
    ],
    cwd=tmp_path,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  out = run.stdout
  assert run.returncode == 1, out + run.stderr
  summary = out[out.index("C-level stderr of the crashed test worker gw0") :]
  assert "the reason the worker died" in summary
  assert "1 failed, 1 passed" in out


def test_pytest_is_configured_in_setup_cfg_and_nothing_twice(request):
  """setup.cfg holds pytest's section and nothing else; pyproject.toml every other tool's, not pytest's."""
  import configparser

  import tomllib

  config = configparser.ConfigParser(interpolation=None)
  config.read(os.path.join(ROOT, "setup.cfg"))
  assert config.sections() == ["tool:pytest"], config.sections()
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    tools = tomllib.load(f)["tool"]
  cfg_tools = {section.split(":")[-1] for section in config.sections()}
  assert not cfg_tools & set(tools), cfg_tools & set(tools)  # each tool configured in one file
  assert request.config.inipath.name == "setup.cfg"  # the file this run read
  assert "error" in request.config.getini("filterwarnings")
