"""Property suite, means and moments: Mean, MSE, MAE, RMSE, Std, R2Score, PearsonCorrelation.

Every property feeds random data through a random padded batching, merge tree and
device count (``metric_checks.evaluate_randomly``) and compares with numpy / scikit-learn
in float64 on the values the metric sees (float32, or float16/bfloat16 upcast).

Tolerances, from float32 analysis (``EPS = 2**-24``, the unit roundoff; batches have at
most 16 rows; merges and device totals are double-float, about ``2**-48``, negligible):

* weighted means: each batch sum of ``w * x`` is a float32 sum of at most 16 terms
  (``<= 16 EPS * sum |w x|``), plus the product, the weight total and the final division
  (``<= 4 EPS`` relative): ``atol = 16 EPS * mean|x|``, ``rtol = 20 EPS``. MSE/MAE/RMSE
  average non-negative terms, so that is ``rtol = 32 EPS`` (difference, square, sum).
* Std: the same sums of squared deviations around a float32 centre: ``rtol = 32 EPS``
  on the standard deviation.
* R2 = 1 - SSres / SStot: ``32 EPS`` relative on each sum gives
  ``|error| <= 64 EPS * max(1, SSres / SStot)``.
* Pearson C_xy / sqrt(C_xx C_yy): ``|error| <= 64 EPS`` (relative errors of the three
  co-moments, plus sqrt and division).
"""

from __future__ import annotations

import numpy as np
import pytest
import sklearn.metrics
from hypothesis import given
from hypothesis import strategies as st
from metric_checks import assert_close, evaluate_randomly

import padded_eval as pe

EPS = 2.0**-24
SEEDS = st.integers(0, 2**32 - 1)
ROWS = st.integers(1, 40)
MODERATE_SCALES = st.sampled_from([1e-3, 1.0, 1e3])


def _values(rng, n, scale, offset, dtype=np.float32, constant=False, shape=()):
  z = np.zeros((n,) + shape) if constant else rng.standard_normal((n,) + shape)
  return (scale * (offset + z)).astype(dtype)


def _weights(rng, n, weighted):
  return rng.uniform(0.1, 2.0, n).astype(np.float32) if weighted else None


def _seen(x):
  """float64 values as the metric sees them (bfloat16/float16 upcast exactly)."""
  return np.asarray(x).astype(np.float32).astype(np.float64)


def _fields(weights, **arrays):
  return {**arrays, **({} if weights is None else {"weights": weights})}


# --- Mean ------------------------------------------------------------------------------------


@given(
  seed=SEEDS,
  n=ROWS,
  scale=st.sampled_from([1e-25, 1e-3, 1.0, 1e18]),
  offset=st.sampled_from([0.0, 3.0, 1e6]),
  weighted=st.booleans(),
  constant=st.booleans(),
)
def test_mean_any_scale_offset_and_weights(seed, n, scale, offset, weighted, constant):
  rng = np.random.default_rng(seed)
  values, weights = _values(rng, n, scale, offset, constant=constant), _weights(rng, n, weighted)
  got = evaluate_randomly(pe.metrics.Mean(), _fields(weights, values=values), rng)
  x, w = _seen(values), np.ones(n) if weights is None else _seen(weights)
  assert_close(got, np.sum(w * x) / np.sum(w), rtol=20 * EPS, atol=16 * EPS * np.mean(np.abs(x)))


@given(
  seed=SEEDS,
  n=ROWS,
  dtype=st.sampled_from(["float16", "bfloat16"]),
  offset=st.sampled_from([0.0, 300.0]),
)
def test_mean_half_precision_inputs_are_upcast(seed, n, dtype, offset):
  import ml_dtypes

  rng = np.random.default_rng(seed)
  values = _values(rng, n, 1.0, offset, dtype=getattr(ml_dtypes, dtype, np.float16))
  got = evaluate_randomly(pe.metrics.Mean(), {"values": values}, rng)
  x = _seen(values)
  assert_close(got, np.mean(x), rtol=20 * EPS, atol=16 * EPS * np.mean(np.abs(x)))


# --- MSE, MAE, RMSE ----------------------------------------------------------------------------

_ERRORS = {
  "mse": (
    pe.metrics.MSE,
    lambda t, p, w: sklearn.metrics.mean_squared_error(t, p, sample_weight=w),
  ),
  "mae": (
    pe.metrics.MAE,
    lambda t, p, w: sklearn.metrics.mean_absolute_error(t, p, sample_weight=w),
  ),
  "rmse": (
    pe.metrics.RMSE,
    lambda t, p, w: np.sqrt(sklearn.metrics.mean_squared_error(t, p, sample_weight=w)),
  ),
}


@pytest.mark.parametrize("name", sorted(_ERRORS))
@given(
  seed=SEEDS,
  n=ROWS,
  scale=MODERATE_SCALES,
  offset=st.sampled_from([0.0, 1e6]),
  weighted=st.booleans(),
  dtype=st.sampled_from(["float32", "bfloat16"]),
)
def test_errors_match_sklearn(name, seed, n, scale, offset, weighted, dtype):
  import ml_dtypes

  rng = np.random.default_rng(seed)
  dtype = np.float32 if dtype == "float32" else ml_dtypes.bfloat16
  preds, target = (_values(rng, n, scale, offset, dtype) for _ in range(2))
  weights = _weights(rng, n, weighted)
  make, reference = _ERRORS[name]
  got = evaluate_randomly(make(), _fields(weights, preds=preds, target=target), rng)
  w = None if weights is None else _seen(weights)
  assert_close(got, reference(_seen(target), _seen(preds), w), rtol=32 * EPS, atol=0.0)


OVERFLOW = "issue 12: MSE/Std/R2 on values near 1e18 overflow float32 sums of squares"
_HUGE = [
  "mae",
  pytest.param("mse", marks=pytest.mark.xfail(reason=OVERFLOW, strict=True)),
  pytest.param("rmse", marks=pytest.mark.xfail(reason=OVERFLOW, strict=True)),
]


@pytest.mark.parametrize("name", _HUGE)
@given(seed=SEEDS, n=st.integers(16, 40))
def test_errors_at_huge_scale(name, seed, n):
  """Values near 1e18: each squared error (~4e37) and the MSE fit in float32, their sum not."""
  rng = np.random.default_rng(seed)
  preds = (1e18 * (3.0 + 0.1 * rng.standard_normal(n))).astype(np.float32)
  target = (-1e18 * (3.0 + 0.1 * rng.standard_normal(n))).astype(np.float32)
  make, reference = _ERRORS[name]
  got = evaluate_randomly(make(), {"preds": preds, "target": target}, rng)
  assert_close(got, reference(_seen(target), _seen(preds), None), rtol=32 * EPS, atol=0.0)
