"""The runnable examples: each checks itself against scikit-learn or numpy float64."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # demo / example / benchmark: run by CI, not by the fast tier

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _load(name):
  spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize("backend", ["pmap", "jit"])
def test_digits_classification_matches_sklearn(backend):
  # main() asserts accuracy, macro precision/recall/F1, the confusion matrix and the
  # cross-entropy against scikit-learn on the whole split.
  results = _load("digits_classification").main(["--backend", backend, "--train-steps", "50"])
  assert results["num_examples"] == 360
  assert np.asarray(results["confusionmatrix"]).sum() == 360


@pytest.mark.parametrize("backend", ["pmap", "shard_map"])
def test_lm_perplexity_matches_numpy(backend):
  # main() asserts perplexity and token accuracy against numpy float64 over real tokens.
  results = _load("lm_perplexity").main(
    ["--backend", backend, "--batch-size", "48", "--train-steps", "60"]
  )
  assert results["num_examples"] == 300
  assert 1.0 < results["perplexity"] < 32.0  # trained: better than uniform over the vocabulary


def test_example_runs_as_a_script():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
  command = [
    sys.executable,
    str(EXAMPLES / "lm_perplexity.py"),
    "--batch-size",
    "40",
    "--train-steps",
    "30",
  ]
  done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "matches numpy" in done.stdout
