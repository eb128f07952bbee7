"""Shared checks for the grain, Hugging Face and torch sources (tests/test_sources_*.py).

`check_padded` compares `pe.pad_batches(source, ...)` with index arithmetic over the original arrays
(`_padding_reference.expected_batches`): every real row exactly once and in order, the mask, garbage on padded
rows, `len()` where the source knows it, and a second pass equal to the first. `check_exact` runs
`pe.masked_eval` and compares with float64 numpy / scikit-learn over the original arrays.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from _padding_reference import assert_batches_equal, expected_batches
from sklearn.metrics import accuracy_score

import padded_eval as pe
from padded_eval.metrics.base import Metric, state

NUM_FEATURES, NUM_CLASSES, BATCH = 3, 5, 16
GARBAGE = {"x": np.nan, "label": -7, "y": np.inf}  # a padded row that leaked would show


def make_data(n, seed=0, strings=True):
  """``x`` float32 ``[n, 3]`` (small integers), ``label`` int32, ``y`` float32, ``name`` unicode (optional)."""
  rng = np.random.default_rng(seed)
  data = {
    "x": rng.integers(-4, 5, (n, NUM_FEATURES)).astype(np.float32),
    "label": rng.integers(0, NUM_CLASSES, n).astype(np.int32),
    "y": rng.normal(size=n).astype(np.float32),
  }
  if strings:
    data["name"] = np.array([f"row{i}" for i in range(n)])
  return data


def rows_of(data):
  """The dataset as a list of per-row dicts (numpy scalars and arrays)."""
  n = len(data["y"])
  return [{key: values[i] for key, values in data.items()} for i in range(n)]


def numeric(data):
  return {key: values for key, values in data.items() if key != "name"}


def check_padded(source, data, *, known_len, batch_size=BATCH, num_devices=2, **options):
  """pad_batches over `source` equals index arithmetic over `data`, twice; `len()` iff `known_len`."""
  batches = pe.pad_batches(
    source, batch_size, num_devices=num_devices, pad_value=GARBAGE, **options
  )
  want = expected_batches(data, batch_size, pad=GARBAGE)
  if known_len:
    assert len(batches) == len(want)
  else:
    with pytest.raises(TypeError, match="number of batches of this .* source is unknown"):
      len(batches)
  assert_batches_equal(batches, want)
  assert_batches_equal(batches, want)  # a second pass re-reads the source
  return batches


class AccuracyAndMSE(Metric):
  """Accuracy of a linear classifier and MSE of a linear regressor, one state."""

  accuracy: pe.metrics.Accuracy = state(lambda self: pe.metrics.Accuracy())
  mse: pe.metrics.MSE = state(lambda self: pe.metrics.MSE())

  def _batch_state(self, *, logits, labels, preds, target, mask=None, **_):
    return {
      "accuracy": self.accuracy.batch_updates(preds=logits, target=labels, mask=mask),
      "mse": self.mse.batch_updates(preds=preds, target=target, mask=mask),
    }

  def compute(self):
    return {"accuracy": self.accuracy.compute(), "mse": self.mse.compute()}

  def compute_logs(self):
    return self.compute()


def make_params(seed=1):
  """Small-integer weights with class biases k/8: float32 logits are exact, never tied."""
  rng = np.random.default_rng(seed)
  return {
    "w_cls": rng.integers(-3, 4, (NUM_FEATURES, NUM_CLASSES)).astype(np.float32),
    "b_cls": (np.arange(NUM_CLASSES) / 8).astype(np.float32),
    "w_reg": rng.normal(size=(NUM_FEATURES,)).astype(np.float32),
  }


def step_fn(params, batch):
  x = batch["x"].astype(jnp.float32)
  logits = x @ params["w_cls"] + params["b_cls"][None, :]
  labels = jnp.where(batch["mask"], batch["label"], 0)
  return AccuracyAndMSE().batch_updates(
    logits=logits,
    labels=labels,
    preds=x @ params["w_reg"],
    target=batch["y"].astype(jnp.float32),
    mask=batch["mask"],
  )


def reference(params, data):
  x = np.asarray(data["x"], np.float64)
  logits = x @ params["w_cls"].astype(np.float64) + params["b_cls"].astype(np.float64)
  preds = x @ params["w_reg"].astype(np.float64)
  return {
    "accuracy": accuracy_score(data["label"], logits.argmax(-1)),
    "mse": np.mean((preds - np.asarray(data["y"], np.float64)) ** 2),
    "num_examples": len(data["y"]),
  }


def check_exact(source, data, backend="jit", batch_size=BATCH):
  """masked_eval over pad_batches(source) equals the float64 reference over `data`'s rows."""
  params = make_params()
  batches = pe.pad_batches(source, batch_size, pad_value=GARBAGE)
  got = pe.masked_eval(step_fn, params, batches, backend=backend)
  want = reference(params, data)
  assert got["num_examples"] == want["num_examples"]
  np.testing.assert_allclose(
    got["accuracy"], want["accuracy"], rtol=1e-6
  )  # a ratio of exact counts
  np.testing.assert_allclose(got["mse"], want["mse"], rtol=1e-5)  # float32 model vs float64
  return got
