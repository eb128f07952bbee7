"""Issue 31: R2Score's ``adjusted=`` / ``force_finite=`` / ``multioutput`` weights, refusals.

The values themselves are rows of ``tests/metric_cases.py`` (``r2_adjusted*``,
``r2_multioutput_array_weighted``, ``r2_force_finite_false_raw``: scikit-learn float64,
garbage-padded uneven batches, every backend on 8 devices).
"""

import re

import numpy as np
import pytest

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
