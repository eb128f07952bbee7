"""Issue 31: R2Score's ``adjusted=`` / ``force_finite=`` / ``multioutput`` weights, refusals.

The values themselves are rows of ``tests/metric_cases.py`` (``r2_adjusted*``,
``r2_multioutput_array_weighted``, ``r2_force_finite_false_raw``: scikit-learn float64,
garbage-padded uneven batches, every backend on 8 devices).
"""

import re
import warnings

import jax
import numpy as np
import pytest
import scipy.stats as scipy_stats
import sklearn.metrics as sklearn_metrics

import padded_eval as pe


@pytest.mark.parametrize(
  "kwargs, words",
  [
    ({"num_outputs": 3, "multioutput": (1.0, 2.0)}, "shape (3,)"),
    ({"num_outputs": 3, "multioutput": (1.0, -2.0, 1.0)}, ">= 0"),
    ({"num_outputs": 2, "multioutput": (0.0, 0.0)}, "not all 0"),
    ({"multioutput": "median"}, "multioutput must be one of"),
    ({"adjusted": -1}, "adjusted"),
    ({"adjusted": 1.5}, "adjusted"),
    ({"force_finite": "yes"}, "force_finite"),
  ],
)
def test_r2_refuses_bad_options(kwargs, words):
  with pytest.raises(ValueError, match=re.escape(words)):
    pe.metrics.R2Score(**kwargs)


def test_r2_array_multioutput_is_stored_hashable():
  metric = pe.metrics.R2Score(num_outputs=2, multioutput=np.array([1, 3]))
  assert metric.multioutput == (1.0, 3.0)
  hash(metric.multioutput)


def test_r2_adjusted_without_degrees_of_freedom_is_nan():
  # n = 3 rows, k = 2 regressors: n - k - 1 = 0 (torchmetrics warns and falls back).
  preds, target = np.array([1.0, 2.0, 3.5]), np.array([1.0, 2.5, 3.0])
  got = pe.metrics.R2Score(adjusted=2).update(preds=preds, target=target).compute()
  assert np.isnan(float(got))
  got = pe.metrics.R2Score(adjusted=1).update(preds=preds, target=target).compute()
  r2 = 1 - np.sum((preds - target) ** 2) / np.sum((target - target.mean()) ** 2)
  np.testing.assert_allclose(float(got), 1 - (1 - r2) * 2 / 1, rtol=1e-6)


def test_r2_force_finite_false_constant_target():
  target = np.array([2.0, 2.0, 2.0, 2.0])
  exact = pe.metrics.R2Score(force_finite=False).update(preds=target, target=target)
  off = pe.metrics.R2Score(force_finite=False).update(preds=target + 1, target=target)
  assert np.isnan(float(exact.compute()))
  assert float(off.compute()) == -np.inf


@pytest.mark.parametrize("name", ["MSE", "MAE", "RMSE"])
def test_per_output_means_refuse_bad_options(name):
  cls = getattr(pe.metrics, name)
  with pytest.raises(ValueError, match="variance_weighted"):  # not a choice here
    cls(num_outputs=3, multioutput="variance_weighted")
  with pytest.raises(ValueError, match=re.escape("shape (3,)")):
    cls(num_outputs=3, multioutput=(1.0, 1.0))
  with pytest.raises(ValueError, match=re.escape("[batch, ..., 3]")):
    cls(num_outputs=3).update(preds=np.zeros((4, 2)), target=np.zeros((4, 2)))


# A fuzzing find (issue 65): a constant target with uneven weights. Merging the parts rounded the
# means, leaving the target's co-moment at 6e-28 instead of 0: ExplainedVariance -3.18e28 in four
# batches of one row (0.0 in one pass), Pearson 0.0 or -2e-8 merged (NaN in one pass).
_CONSTANT_PREDS = np.array([-2.6246073, 1.27698, -0.48266661, -0.38245314], np.float32)
_CONSTANT_WEIGHTS = np.array([1.0, 7.0, 0.3, 1.0], np.float32)


def _constant_target_reference(name):
  target = np.full(4, 2.0)
  if name == "ExplainedVariance":
    return sklearn_metrics.explained_variance_score(
      target, _CONSTANT_PREDS.astype(np.float64), sample_weight=_CONSTANT_WEIGHTS
    )
  with warnings.catch_warnings():  # scipy warns that the input is constant
    warnings.simplefilter("ignore", scipy_stats.ConstantInputWarning)
    return scipy_stats.pearsonr(_CONSTANT_PREDS.astype(np.float64), target).statistic


def _garbage_padded(rows, size):
  """``rows`` (preds, weights) padded to ``size`` rows of NaN / 1e30 garbage with a mask."""
  preds, weights = rows
  pad = size - len(preds)
  return {
    "preds": np.concatenate([preds, np.full(pad, np.nan, np.float32)]),
    "target": np.concatenate(
      [np.full(len(preds), 2.0, np.float32), np.full(pad, 1e30, np.float32)]
    ),
    "weights": np.concatenate([weights, np.full(pad, np.nan, np.float32)]),
    "mask": np.arange(size) < len(preds),
  }


@pytest.mark.parametrize("name", ["ExplainedVariance", "PearsonCorrelation"])
def test_constant_target_scores_alike_in_every_batching(name):
  cls = getattr(pe.metrics, name)
  expected = _constant_target_reference(name)  # scikit-learn 0.0; scipy NaN (the documented answer)
  one_pass = cls().update(preds=_CONSTANT_PREDS, target=np.full(4, 2.0), weights=_CONSTANT_WEIGHTS)
  merged = cls()
  for i in range(4):
    row = _CONSTANT_PREDS[i : i + 1], _CONSTANT_WEIGHTS[i : i + 1]
    merged = merged.merge(cls().update(**_garbage_padded(row, 3)))
  for got in (one_pass.compute(), merged.compute()):
    np.testing.assert_equal(float(got), expected)


@pytest.mark.parametrize(
  "backend, devices", [("pmap", 8), ("shard_map", 8), ("shard_map", 1), ("jit", 1)]
)
@pytest.mark.parametrize("name", ["ExplainedVariance", "PearsonCorrelation"])
def test_constant_target_through_masked_eval(name, backend, devices):
  # Four batches of 8 holding one real row each: on one device every step merges a one-row
  # part into the carried state (-3.18e28 and 0.0 before); on 8 the parts also meet in psum.
  cls = getattr(pe.metrics, name)
  rows = [(_CONSTANT_PREDS[i : i + 1], _CONSTANT_WEIGHTS[i : i + 1]) for i in range(4)]
  mesh = None if devices == 8 else jax.make_mesh((1,), ("batch",), devices=jax.devices()[:1])

  def step(params, batch):
    return cls().batch_updates(**batch)

  batches = [_garbage_padded(row, 8) for row in rows]
  results = pe.masked_eval(step, None, batches, backend=backend, mesh=mesh)
  np.testing.assert_equal(results[cls().name], _constant_target_reference(name))
  assert results["num_examples"] == 4
