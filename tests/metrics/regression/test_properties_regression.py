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
  on the standard deviation, plus ``2**-44 |mean|`` absolute: the dataset mean is a
  double-float (about ``2**-48`` relative). Weighted constant data: each float32 product
  ``w * x`` carries one rounding, a spread of up to ``EPS |x|`` that no float32 algorithm
  can tell from data, so the std of constant ``x`` is 0 within ``2 EPS |x|`` (3.4e-9 seen
  for 34 weighted copies of 1000.0).
* R2 = 1 - SSres / SStot: ``32 EPS`` relative on each sum gives
  ``|error| <= 64 EPS * max(1, SSres / SStot)``.
* Pearson C_xy / sqrt(C_xx C_yy): ``|error| <= 64 EPS`` (relative errors of the three
  co-moments, plus sqrt and division).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
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


_HUGE = [
  "mae",
  "mse",
  "rmse",
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


# --- Std ---------------------------------------------------------------------------------------


@given(
  seed=SEEDS,
  n=ROWS,
  scale=MODERATE_SCALES,
  offset=st.sampled_from([0.0, 3.0, 1e4, 1e6]),
  ddof=st.sampled_from([0, 1]),
  weighted=st.booleans(),
  constant=st.booleans(),
)
def test_std_matches_numpy(seed, n, scale, offset, ddof, weighted, constant):
  rng = np.random.default_rng(seed)
  values, weights = _values(rng, n, scale, offset, constant=constant), _weights(rng, n, weighted)
  got = evaluate_randomly(pe.metrics.Std(ddof=ddof), _fields(weights, values=values), rng)
  x, w = _seen(values), np.ones(n) if weights is None else _seen(weights)
  mean = np.sum(w * x) / np.sum(w)
  dof = np.sum(w) - ddof
  expected = np.sqrt(np.sum(w * (x - mean) ** 2) / dof) if dof > 0 else np.nan
  spread = 2 * EPS if weighted and constant else 2.0**-44  # see the module docstring
  assert_close(got, expected, rtol=32 * EPS, atol=spread * abs(mean))


@given(seed=SEEDS, n=st.integers(8, 40))
def test_std_at_huge_scale(seed, n):
  """Values +-1e19: the std (1e19) and the variance (1e38) fit in float32, sums of squares not."""
  rng = np.random.default_rng(seed)
  values = (1e19 * np.where(rng.random(n) < 0.5, -1.0, 1.0)).astype(np.float32)
  got = evaluate_randomly(pe.metrics.Std(), {"values": values}, rng)
  assert_close(got, np.std(_seen(values)), rtol=32 * EPS, atol=0.0)


@given(seed=SEEDS, n=st.integers(2, 40), scale=st.sampled_from([1e-25, 1e-20]))
def test_std_at_tiny_scale(seed, n, scale):
  rng = np.random.default_rng(seed)
  values = _values(rng, n, scale, 0.0)
  got = evaluate_randomly(pe.metrics.Std(), {"values": values}, rng)
  assert_close(got, np.std(_seen(values)), rtol=32 * EPS, atol=0.0)


# --- R2Score -----------------------------------------------------------------------------------


def _r2_tolerance(target, preds, weights):
  w = np.ones(len(target)) if weights is None else weights
  mean = np.sum(w * target) / np.sum(w)
  ss_res, ss_tot = np.sum(w * (target - preds) ** 2), np.sum(w * (target - mean) ** 2)
  return 64 * EPS * max(1.0, ss_res / ss_tot) if ss_tot > 0 else 0.0


@given(
  seed=SEEDS,
  n=st.integers(2, 40),
  scale=MODERATE_SCALES,
  offset=st.sampled_from([0.0, 3.0, 1e6]),
  weighted=st.booleans(),
  noise=st.sampled_from([0.0, 0.1, 1.0, 3.0]),
)
def test_r2_matches_sklearn(seed, n, scale, offset, weighted, noise):
  rng = np.random.default_rng(seed)
  target = _values(rng, n, scale, offset)
  preds = (target + scale * noise * rng.standard_normal(n)).astype(np.float32)
  weights = _weights(rng, n, weighted)
  got = evaluate_randomly(pe.metrics.R2Score(), _fields(weights, preds=preds, target=target), rng)
  t, p, w = _seen(target), _seen(preds), None if weights is None else _seen(weights)
  expected = sklearn.metrics.r2_score(t, p, sample_weight=w)
  assert_close(got, expected, atol=_r2_tolerance(t, p, w))


@given(seed=SEEDS, n=st.integers(2, 40), exact=st.booleans(), level=st.sampled_from([0.0, 1e6]))
def test_r2_constant_target_follows_sklearn(seed, n, exact, level):
  """sklearn (force_finite): 1.0 for a perfect fit of a constant target, else 0.0."""
  rng = np.random.default_rng(seed)
  target = np.full(n, level + 2.0, np.float32)
  preds = target if exact else (target + rng.standard_normal(n)).astype(np.float32)
  got = evaluate_randomly(pe.metrics.R2Score(), {"preds": preds, "target": target}, rng)
  assert_close(got, sklearn.metrics.r2_score(_seen(target), _seen(preds)), atol=0.0)


@given(
  seed=SEEDS,
  weighted=st.booleans(),
  outputs=st.sampled_from([1, 3]),
  force_finite=st.booleans(),
  exact=st.booleans(),
)
def test_r2_of_one_observation_is_nan_as_sklearn(seed, weighted, outputs, force_finite, exact):
  """scikit-learn: R2 is undefined (NaN) on fewer than two samples; a single real row used to
  score 1 or 0 (or NaN / -inf) as a constant target. torchmetrics raises there."""
  rng = np.random.default_rng(seed)
  shape = () if outputs == 1 else (outputs,)
  target = _values(rng, 1, 2.0, 1e6 * rng.integers(0, 2), shape=shape)
  preds = target if exact else (target + rng.standard_normal(target.shape)).astype(np.float32)
  metric = pe.metrics.R2Score(
    num_outputs=outputs, multioutput="raw_values", force_finite=force_finite
  )
  fields = _fields(_weights(rng, 1, weighted), preds=preds, target=target)
  got = evaluate_randomly(metric, fields, rng)
  with pytest.warns(sklearn.exceptions.UndefinedMetricWarning, match="less than two samples"):
    expected = sklearn.metrics.r2_score(
      _seen(target), _seen(preds), multioutput="raw_values", force_finite=force_finite
    )
  assert np.isnan(expected)
  np.testing.assert_array_equal(np.asarray(got), np.full(shape, np.nan, np.float32))


def test_r2_of_one_row_of_several_elements_is_defined():
  """With ``num_outputs=1`` every element is an observation: one row of 3 real elements is three
  samples for scikit-learn (the flattened values), and scores."""
  target = np.array([[1.0, 2.0, 4.0], [np.nan, 7.0, -1e30]], np.float32)
  preds = np.array([[1.5, 2.0, 3.0], [np.inf, 0.0, 1e30]], np.float32)
  mask = np.array([True, False])
  got = pe.metrics.R2Score().update(preds=preds, target=target, mask=mask).compute()
  expected = sklearn.metrics.r2_score(target[0].astype(np.float64), preds[0].astype(np.float64))
  assert_close(got, expected, atol=1e-6)


@given(
  seed=SEEDS,
  n=st.integers(2, 40),
  multioutput=st.sampled_from(["raw_values", "uniform_average", "variance_weighted"]),
)
def test_r2_multioutput_matches_sklearn(seed, n, multioutput):
  rng = np.random.default_rng(seed)
  target = _values(rng, n, 1.0, 3.0, shape=(3,))
  preds = (target + rng.standard_normal((n, 3))).astype(np.float32)
  t, p = _seen(target), _seen(preds)
  metric = pe.metrics.R2Score(num_outputs=3, multioutput=multioutput)
  got = evaluate_randomly(metric, {"preds": preds, "target": target}, rng)
  expected = sklearn.metrics.r2_score(t, p, multioutput=multioutput)
  assert_close(got, expected, atol=max(_r2_tolerance(t[:, j], p[:, j], None) for j in range(3)))


@given(seed=SEEDS, n=st.integers(8, 40), scale=st.sampled_from([1e-25, 1e18]))
def test_r2_is_scale_invariant(seed, n, scale):
  rng = np.random.default_rng(seed)
  target = (scale * rng.standard_normal(n)).astype(np.float32)
  preds = (scale * rng.standard_normal(n)).astype(np.float32)
  got = evaluate_randomly(pe.metrics.R2Score(), {"preds": preds, "target": target}, rng)
  t, p = _seen(target), _seen(preds)
  assert_close(got, sklearn.metrics.r2_score(t, p), atol=_r2_tolerance(t, p, None))


# --- PearsonCorrelation ------------------------------------------------------------------------


def _correlated(rng, n, scale, offset, correlation):
  x = rng.standard_normal(n)
  y = correlation * x + np.sqrt(1 - correlation**2) * rng.standard_normal(n)
  return (scale * (offset + x)).astype(np.float32), (scale * (offset - 2 + y)).astype(np.float32)


def _pearson(x, y, w=None):
  if w is None:
    with np.errstate(invalid="ignore", divide="ignore"):
      return scipy.stats.pearsonr(x, y)[0] if np.ptp(x) > 0 and np.ptp(y) > 0 else np.nan
  mx, my = np.sum(w * x) / np.sum(w), np.sum(w * y) / np.sum(w)
  cxy = np.sum(w * (x - mx) * (y - my))
  return cxy / np.sqrt(np.sum(w * (x - mx) ** 2) * np.sum(w * (y - my) ** 2))


@given(
  seed=SEEDS,
  n=st.integers(3, 40),
  scale=MODERATE_SCALES,
  offset=st.sampled_from([0.0, 3.0]),
  correlation=st.sampled_from([-1.0, -0.5, 0.0, 0.9, 1.0]),
  weighted=st.booleans(),
)
def test_pearson_matches_scipy(seed, n, scale, offset, correlation, weighted):
  rng = np.random.default_rng(seed)
  preds, target = _correlated(rng, n, scale, offset, correlation)
  weights = _weights(rng, n, weighted)
  metric = pe.metrics.PearsonCorrelation()
  got = evaluate_randomly(metric, _fields(weights, preds=preds, target=target), rng)
  w = None if weights is None else _seen(weights)
  assert_close(got, _pearson(_seen(preds), _seen(target), w), atol=64 * EPS)


@given(seed=SEEDS, n=st.integers(100, 200), correlation=st.sampled_from([-1.0, 0.5]))
def test_pearson_at_offset_1e6(seed, n, correlation):
  """Batches of 50 or 64 rows (64-term float32 batch sums: 64 EPS still covers them)."""
  rng = np.random.default_rng(seed)
  preds, target = _correlated(rng, n, 1.0, 1e6, correlation)
  metric = pe.metrics.PearsonCorrelation()
  got = evaluate_randomly(metric, {"preds": preds, "target": target}, rng, batch_sizes=(50, 64))
  assert_close(got, _pearson(_seen(preds), _seen(target)), atol=64 * EPS)


@given(
  seed=SEEDS,
  n=st.integers(41, 64),
  level=st.sampled_from([1 / 3, 3.7, 1234.567, 1e6 + 0.3]),
  both=st.booleans(),
)
def test_pearson_constant_variable_is_nan(seed, n, level, both):
  """Batches of up to 64 rows: the float32 batch mean of a constant need not be exact."""
  rng = np.random.default_rng(seed)
  preds = np.full(n, level, np.float32)
  target = preds if both else rng.standard_normal(n).astype(np.float32)
  metric = pe.metrics.PearsonCorrelation()
  got = evaluate_randomly(metric, {"preds": preds, "target": target}, rng, batch_sizes=(64,))
  assert_close(got, np.nan, atol=0.0)


@given(seed=SEEDS, n=st.integers(8, 40), scale=st.sampled_from([1e-25, 1e18]))
def test_pearson_is_scale_invariant(seed, n, scale):
  rng = np.random.default_rng(seed)
  preds, target = _correlated(rng, n, scale, 0.0, 0.9)
  got = evaluate_randomly(pe.metrics.PearsonCorrelation(), {"preds": preds, "target": target}, rng)
  assert_close(got, _pearson(_seen(preds), _seen(target)), atol=64 * EPS)


# --- issue 31: per-output MSE / MAE / RMSE (multioutput="raw_values") -------------------------

_PER_OUTPUT = {
  "mse": (pe.metrics.MSE, sklearn.metrics.mean_squared_error),
  "mae": (pe.metrics.MAE, sklearn.metrics.mean_absolute_error),
  "rmse": (pe.metrics.RMSE, sklearn.metrics.root_mean_squared_error),
}


@given(
  seed=SEEDS,
  n=ROWS,
  name=st.sampled_from(sorted(_PER_OUTPUT)),
  scale=st.sampled_from([1e-25, 1.0, 1e18]),
  offset=st.sampled_from([0.0, 1e6]),
  weighted=st.booleans(),
)
def test_per_output_errors_any_scale_offset_and_weights(seed, n, name, scale, offset, weighted):
  rng = np.random.default_rng(seed)
  cls, reference = _PER_OUTPUT[name]
  preds = _values(rng, n, scale, offset, shape=(3,))
  target = _values(rng, n, scale, offset, shape=(3,))
  weights = _weights(rng, n, weighted)
  metric = cls(num_outputs=3, multioutput="raw_values")
  got = evaluate_randomly(metric, _fields(weights, preds=preds, target=target), rng)
  want = reference(_seen(target), _seen(preds), sample_weight=weights, multioutput="raw_values")
  # MSE of scale 1e-25 is ~1e-50: below float32, it rounds to 0 (atol: the smallest normal).
  assert_close(got, want, rtol=64 * EPS, atol=float(np.finfo(np.float32).tiny))
