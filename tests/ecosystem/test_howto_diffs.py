"""The before/after ```diff blocks of docs/howto/ecosystem.md run: the code before the change and after it.

A diff block's context and ``-`` lines are the user's code before, its context and ``+`` lines
the code after switching to padded_eval. Both run; the *after* result is checked against
scikit-learn / numpy float64 over every row, the *before* one shows what the old loop computed
(the batch-mean weighting, the dropped remainder).
"""

import pathlib
import re

import numpy as np
import pytest
import sklearn.metrics

HOWTO = pathlib.Path(__file__).resolve().parents[2] / "docs" / "howto" / "ecosystem.md"
DIFF = re.compile(r"^```diff\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def diff_blocks() -> dict[str, str]:
  """``{section heading: diff text}`` for each section of the page holding a diff block."""
  text = HOWTO.read_text()
  blocks = {}
  for match in DIFF.finditer(text):
    heading = re.findall(r"^#{2,3} (.*)$", text[: match.start()], re.MULTILINE)[-1]
    blocks[heading] = match.group(1)
  return blocks


def versions(diff: str) -> tuple[str, str]:
  """``(before, after)`` programs of a diff block (a bare empty line is context)."""
  before, after = [], []
  for line in diff.split("\n"):
    mark, code = (line[:1], line[1:]) if line else (" ", "")
    assert mark in " -+", f"a diff line must start with ' ', '-' or '+': {line!r}"
    if mark in " -":
      before.append(code)
    if mark in " +":
      after.append(code)
  return "\n".join(before), "\n".join(after)


def run(code: str, name: str) -> dict:
  namespace = {"__name__": name}
  exec(compile(code, f"docs/howto/ecosystem.md ({name})", "exec"), namespace)
  return namespace


def test_the_sections_have_their_diffs():
  assert {
    "nnx: padded_eval metrics in `nnx.MultiMetric`",
    "CLU: padded_eval metrics in a `clu.metrics.Collection`",
  } <= set(diff_blocks())


@pytest.fixture(scope="module")
def nnx_runs():
  diff = diff_blocks()["nnx: padded_eval metrics in `nnx.MultiMetric`"]
  return [run(code, name) for code, name in zip(versions(diff), ("before", "after"))]


def test_nnx_after_equals_numpy_over_every_row(nnx_runs):
  before, after = nnx_runs
  x, y = after["x"], after["y"].astype(np.float64)
  preds = np.asarray(after["model"](x), np.float64)
  np.testing.assert_allclose(float(after["result"]["mse"]), np.mean((preds - y) ** 2), rtol=1e-6)
  np.testing.assert_allclose(float(after["result"]["mae"]), np.mean(np.abs(preds - y)), rtol=1e-6)
  # Before: the mean of 13 batch means, the 11-row last batch weighing as much as the others.
  chunks = [slice(i, i + 16) for i in range(0, 203, 16)]
  batch_means = np.mean([np.mean((preds[c] - y[c]) ** 2) for c in chunks])
  np.testing.assert_allclose(float(before["result"]["mse"]), batch_means, rtol=1e-5)
  assert abs(batch_means - np.mean((preds - y) ** 2)) > 1e-4 * np.mean((preds - y) ** 2)


def test_clu_after_equals_sklearn_over_every_row():
  diff = diff_blocks()["CLU: padded_eval metrics in a `clu.metrics.Collection`"]
  before, after = (run(code, name) for code, name in zip(versions(diff), ("before", "after")))
  images, labels, w = after["images"], after["labels"], after["w"].astype(np.float64)
  logits = images.astype(np.float64) @ w
  log_probs = (
    logits
    - np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1, keepdims=True))
    - logits.max(-1, keepdims=True)
  )
  loss = -log_probs[np.arange(203), labels]
  for result, rows in ((after["result"], 203), (before["result"], 192)):  # before: 11 dropped
    accuracy = sklearn.metrics.accuracy_score(labels[:rows], np.argmax(logits[:rows], -1))
    np.testing.assert_allclose(float(result["accuracy"]), accuracy, rtol=1e-6)
    np.testing.assert_allclose(float(result["loss"]), np.mean(loss[:rows]), rtol=1e-5)
