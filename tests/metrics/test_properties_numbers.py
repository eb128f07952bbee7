"""Property suite, issue 26's numbers: weight-0 outliers, int64 inputs and
cancellation, through random padded batchings, merge trees and device counts, against numpy
float64 (see ``metric_checks.evaluate_randomly``; padded rows hold NaN, inf and garbage).

Tolerances (``EPS = 2**-24``): means of non-cancelling values ``32 EPS`` relative (products,
squares, the final division); cancellation: in-batch sums are compensated, so the error is the
rounding of the result, ``1e-6`` relative is the contract; int64 values are rounded to float32
once on the host (``EPS`` relative each).
"""

from __future__ import annotations

import decimal

import numpy as np
import pytest
import scipy.stats
import sklearn.metrics
from hypothesis import given
from hypothesis import strategies as st
from metric_checks import assert_close, evaluate_randomly, merge_randomly, random_batches

import padded_eval as pe

EPS = 2.0**-24
SEEDS = st.integers(0, 2**32 - 1)
F64 = np.float64


def _kept(w, *arrays):
  keep = w != 0
  return [np.asarray(a)[keep].astype(F64) for a in arrays] + [w[keep].astype(F64)]


def _weighted_mean(v, w):
  return np.sum(w * v) / np.sum(w)


def _reference(name, x, y, w):
  x, y, w = _kept(w, x, y)
  if name == "mse":
    return _weighted_mean((x - y) ** 2, w)
  if name == "mean":
    return _weighted_mean(x, w)
  if name == "std":
    return np.sqrt(_weighted_mean((x - _weighted_mean(x, w)) ** 2, w))
  if name == "r2":
    return 1.0 - np.sum(w * (x - y) ** 2) / np.sum(w * (y - _weighted_mean(y, w)) ** 2)
  dx, dy = x - _weighted_mean(x, w), y - _weighted_mean(y, w)
  return np.sum(w * dx * dy) / np.sqrt(np.sum(w * dx**2) * np.sum(w * dy**2))


_METRICS = {
  "mean": lambda: pe.metrics.Mean(),
  "mse": lambda: pe.metrics.MSE(),
  "std": lambda: pe.metrics.Std(),
  "r2": lambda: pe.metrics.R2Score(),
  "pearson": lambda: pe.metrics.PearsonCorrelation(),
}


@pytest.mark.parametrize("name", sorted(_METRICS))
@given(
  seed=SEEDS,
  n=st.integers(3, 40),
  outlier=st.sampled_from([1e20, -3e38, np.inf, -np.inf, np.nan]),
  zeros=st.integers(1, 6),
)
def test_zero_weights_with_outliers_change_nothing(name, seed, n, outlier, zeros):
  rng = np.random.default_rng(seed)
  x = (1.0 + rng.standard_normal(n)).astype(np.float32)
  y = (0.5 * x + rng.standard_normal(n)).astype(np.float32)
  w = rng.uniform(0.5, 2.0, n).astype(np.float32)
  zero = rng.choice(n, min(zeros, n - 2), replace=False)
  w[zero] = 0.0
  x[zero] = outlier
  y[zero[::2]] = outlier
  fields = {"values": x} if name in ("mean", "std") else {"preds": x, "target": y}
  got = evaluate_randomly(_METRICS[name](), {**fields, "weights": w}, rng)
  expected = _reference(name, x, y, w)
  assert_close(got, expected, rtol=1e-5, atol=1e-5 * (name in ("r2", "pearson")))


def _eager(metric, fields, rng, batch_size=16):
  """Eager updates (a jit boundary would cast int64 to int32 before the metric sees it)."""
  parts = [metric.batch_updates(**b) for b in random_batches(fields, rng, batch_size)]
  return merge_randomly(parts, rng)


@given(
  seed=SEEDS,
  n=st.integers(1, 40),
  offset=st.sampled_from([2**31, 2**40, 1_700_000_000_000_000_000]),
  spread=st.sampled_from([1, 10**6, 10**12]),
)
def test_int64_values_are_averaged_not_wrapped(seed, n, offset, spread):
  rng = np.random.default_rng(seed)
  values = offset + rng.integers(0, spread, n, dtype=np.int64)
  got = float(_eager(pe.metrics.Mean(), {"values": values}, rng).compute())
  assert_close(got, np.mean(values.astype(F64)), rtol=4 * EPS, atol=0.0)


@given(
  seed=SEEDS,
  n=st.integers(2, 120),
  weighted=st.booleans(),
  dtype=st.sampled_from(["int32", "uint32"]),
)
def test_wide_int32_values_keep_every_digit(seed, n, weighted, dtype):
  """int32 / uint32 values beyond ``2**24`` are not rounded to float32 one by one: before, a
  Mean of ``[16777217, -16777216]`` gave 0.0 for 0.5. Cancelling pairs (the mean is small
  against the values) through random batchings, devices and garbage padded rows: 1e-6 of
  float64."""
  rng = np.random.default_rng(seed)
  if dtype == "int32":
    big = rng.integers(2**24, 2**31 - 2**12, (n + 1) // 2, dtype=np.int64)
    values = np.concatenate([big + 1, -big + rng.integers(-3, 4, big.size)])[:n]
  else:
    values = rng.integers(2**31, 2**32, n, dtype=np.int64) | 1  # odd: none rounds exactly
  values = values.astype(dtype)
  fields = {"values": values}
  w = np.ones(n, np.float32)
  if weighted:
    w = rng.uniform(0.1, 2.0, n).astype(np.float32)
    fields["weights"] = w
  got = evaluate_randomly(pe.metrics.Mean(), fields, rng, batch_sizes=(5, 16, 64))
  expected = _weighted_mean(values.astype(F64), w.astype(F64))
  assert_close(got, expected, rtol=1e-6, atol=1e-6 * np.mean(np.abs(values.astype(F64))) * EPS)


_ERRORS = {
  "mse": (lambda: pe.metrics.MSE(), lambda e, t: e**2),
  "rmse": (lambda: pe.metrics.RMSE(), lambda e, t: e**2),
  "mae": (lambda: pe.metrics.MAE(), lambda e, t: np.abs(e)),
  "mape": (lambda: pe.metrics.MAPE(), lambda e, t: np.abs(e) / np.maximum(np.abs(t), 2.0**-52)),
}


@pytest.mark.parametrize("name", sorted(_ERRORS))
@given(
  seed=SEEDS,
  n=st.integers(1, 60),
  weighted=st.booleans(),
  dtype=st.sampled_from(["int32", "uint32", "mixed"]),
)
def test_errors_of_wide_int32_values_keep_every_digit(name, seed, n, weighted, dtype):
  """``preds - target`` of int32 / uint32 values beyond ``2**24`` is formed exactly, then rounded
  once: before, each was rounded to float32 first, and MSE of ``16777217`` against ``16777216``
  read 0.0 for 1.0. Small errors on large values (and a float32 ``preds`` against int32
  ``target``), random batchings, devices and garbage padded rows: 1e-6 of float64 on the exact
  integer differences."""
  rng = np.random.default_rng(seed)
  low, high = (2**31, 2**32 - 2**12) if dtype == "uint32" else (2**24, 2**31 - 2**12)
  target = rng.integers(low, high, n, dtype=np.int64) * rng.choice([1, -1], n) ** (
    dtype != "uint32"
  )
  preds = target + rng.integers(-40, 41, n)
  target = target.astype("uint32" if dtype == "uint32" else "int32")
  preds = preds.astype(np.float32 if dtype == "mixed" else target.dtype)  # mixed: a float rounds
  error = preds.astype(F64) - target.astype(F64)
  metric, per_element = _ERRORS[name]
  fields = {"preds": preds, "target": target}
  w = np.ones(n, np.float32)
  if weighted:
    w = rng.uniform(0.1, 2.0, n).astype(np.float32)
    fields["weights"] = w
  got = evaluate_randomly(metric(), fields, rng, batch_sizes=(5, 16, 64))
  expected = _weighted_mean(per_element(error, target.astype(F64)), w.astype(F64))
  expected = np.sqrt(expected) if name == "rmse" else expected
  assert_close(got, expected, rtol=1e-6, atol=0.0)


def _explained_variance(e, t, w):
  mean = lambda v: _weighted_mean(v, w)
  return 1.0 - mean((e - mean(e)) ** 2) / mean((t - mean(t)) ** 2)


def _pearson(p, t, w):
  dp, dt = p - _weighted_mean(p, w), t - _weighted_mean(t, w)
  return np.sum(w * dp * dt) / np.sqrt(np.sum(w * dp**2) * np.sum(w * dt**2))


def _decimal_deviance(power, p, t, w):
  """The mean Tweedie deviance in 60-digit decimals (float64 cancels for targets near 1e9)."""
  decimal.getcontext().prec = 60
  total = weight = decimal.Decimal(0)
  for y, mu, wi in zip(t.tolist(), p.tolist(), w.tolist()):
    y, mu, wi = decimal.Decimal(y), decimal.Decimal(mu), decimal.Decimal(wi)
    if power == 0:
      d = (y - mu) ** 2
    elif power == 1:
      d = 2 * (y * (y / mu).ln() - y + mu)
    else:
      d = 2 * ((mu / y).ln() + y / mu - 1)
    total, weight = total + wi * d, weight + wi
  return total / weight


def _decimal_d2(power, p, t, w):
  decimal.getcontext().prec = 60
  weights = [decimal.Decimal(wi) for wi in w.tolist()]
  mean = sum(wi * decimal.Decimal(y) for wi, y in zip(weights, t.tolist())) / sum(weights)
  if power == 1:  # from the mean itself, not its float64 rounding
    null = sum(
      wi * 2 * (decimal.Decimal(y) * (decimal.Decimal(y) / mean).ln() - decimal.Decimal(y) + mean)
      for wi, y in zip(weights, t.tolist())
    ) / sum(weights)
  else:
    null = sum(wi * (decimal.Decimal(y) - mean) ** 2 for wi, y in zip(weights, t.tolist())) / sum(
      weights
    )
  return float(_decimal_deviance(power, p, t, w) / null)  # 1 - D2


_WIDE_INT_METRICS = {
  "std": (
    lambda: pe.metrics.Std(argname="values"),
    lambda p, t, w: np.sqrt(_weighted_mean((p - _weighted_mean(p, w)) ** 2, w)),  # off the grid
  ),
  "pearson": (pe.metrics.PearsonCorrelation, lambda p, t, w: 1.0 - _pearson(p, t, w)),
  "tweedie0": (
    lambda: pe.metrics.TweedieDevianceScore(power=0),
    lambda p, t, w: float(_decimal_deviance(0, p, t, w)),
  ),
  "tweedie1": (
    lambda: pe.metrics.TweedieDevianceScore(power=1),
    lambda p, t, w: float(_decimal_deviance(1, p, t, w)),
  ),
  "tweedie2": (
    lambda: pe.metrics.TweedieDevianceScore(power=2),
    lambda p, t, w: float(_decimal_deviance(2, p, t, w)),
  ),
  "msle": (
    pe.metrics.MSLE,
    lambda p, t, w: sklearn.metrics.mean_squared_log_error(t, p, sample_weight=w),
  ),
  "d2_0": (lambda: pe.metrics.D2TweedieScore(power=0), lambda p, t, w: _decimal_d2(0, p, t, w)),
  "d2_1": (lambda: pe.metrics.D2TweedieScore(power=1), lambda p, t, w: _decimal_d2(1, p, t, w)),
  "r2": (
    pe.metrics.R2Score,
    lambda p, t, w: (
      _weighted_mean((t - p) ** 2, w) / _weighted_mean((t - _weighted_mean(t, w)) ** 2, w)
    ),
  ),
  "explained_variance": (
    pe.metrics.ExplainedVariance,
    lambda p, t, w: 1.0 - _explained_variance(t - p, t, w),
  ),
}


@pytest.mark.parametrize("name", sorted(_WIDE_INT_METRICS))
@given(
  seed=SEEDS,
  n=st.integers(3, 60),
  weighted=st.booleans(),
  dtype=st.sampled_from(["int32", "uint32"]),
)
def test_moments_and_deviances_of_wide_int32_values_keep_every_digit(
  name, seed, n, weighted, dtype
):
  """Std, Pearson, R2, ExplainedVariance, the Tweedie deviances, MSLE and D2 of int32 / uint32
  values beyond ``2**24`` (before, even R2's residual was formed from rounded values):
  deviations and differences are formed from the integers, then rounded once. Targets near
  ``2**30`` (``2**31``) on a grid of 128 (256), exact in float32, ``preds`` off by up to 1000,
  which float32 would round by up to 64 (128) each (TweedieDevianceScore(power=1) read 1.94
  times its value). 1e-5 of references in float64 (60-digit decimals for the deviances, where
  float64 itself cancels), on ``1 - score`` for the scores."""
  rng = np.random.default_rng(seed)
  base, step = (2**30, 128) if dtype == "int32" else (2**31, 256)
  target = base + step * rng.integers(0, 20, n)
  target[:2] = base, base + step  # never constant
  preds = target + rng.integers(-1000, 1001, n)
  w = rng.uniform(0.1, 2.0, n).astype(np.float32) if weighted else np.ones(n, np.float32)
  metric, reference = _WIDE_INT_METRICS[name]
  fields = (
    {"values": preds.astype(dtype)}
    if name == "std"
    else {"preds": preds.astype(dtype), "target": target.astype(dtype)}
  )
  if weighted:
    fields["weights"] = w
  got = evaluate_randomly(metric(), fields, rng, batch_sizes=(5, 16, 64))
  want = reference(preds.astype(F64), target.astype(F64), w.astype(F64))
  if name in ("pearson", "d2_0", "d2_1", "r2", "explained_variance"):  # references: 1 - score
    got = 1.0 - got
  assert_close(got, want, rtol=1e-5, atol=0.0)


@given(seed=SEEDS, n=st.integers(1, 30), dtype=st.sampled_from(["int64", "uint32", "uint64"]))
def test_host_wide_integers_that_fit_int32_keep_every_digit(seed, n, dtype):
  """A host int64 / uint32 / uint64 number array whose values fit int32 becomes int32, not
  float32: its digits beyond ``2**24`` survive into an error (eager updates)."""
  rng = np.random.default_rng(seed)
  target = rng.integers(2**24, 2**31 - 64, n, dtype=np.int64)
  preds = target + rng.integers(0, 41, n)
  got = float(
    _eager(pe.metrics.MAE(), {"preds": preds.astype(dtype), "target": target}, rng).compute()
  )
  assert_close(got, np.mean((preds - target).astype(F64)), rtol=1e-6, atol=0.0)


@given(seed=SEEDS, n=st.integers(1, 20), high=st.sampled_from([2**31, 2**32, 2**40]))
def test_int64_class_ids_beyond_int32_are_refused(seed, n, high):
  rng = np.random.default_rng(seed)
  target = rng.integers(0, 3, n, dtype=np.int64)
  target[rng.integers(n)] = high
  with pytest.raises(ValueError, match="target holds integers"):
    pe.metrics.Accuracy().update(preds=np.zeros(n, np.int64), target=target)


@given(
  seed=SEEDS,
  n=st.integers(20, 200),
  offset=st.sampled_from([1e4, 1e5, 1e6]),
)
def test_cancelling_means_in_any_batching(seed, n, offset):
  """Values ``offset + 1e6 N(0, 1)`` shifted so that their mean is small: 1e-6 of float64."""
  rng = np.random.default_rng(seed)
  values = (offset + 1e6 * rng.standard_normal(n)).astype(np.float32)
  values = values - np.float32(np.mean(values.astype(F64)) - offset * rng.uniform(-0.1, 0.1))
  got = evaluate_randomly(pe.metrics.Mean(), {"values": values}, rng, batch_sizes=(5, 16, 64))
  reference = np.mean(values.astype(F64))
  assert_close(got, reference, rtol=1e-6, atol=0.0)


@given(seed=SEEDS, n=st.integers(20, 200), offset=st.sampled_from([1e4, 1e5, 1e6]))
def test_cancelling_weighted_means_in_any_batching(seed, n, offset):
  """Weighted, each product ``w * x`` rounds to float32, and its rounding errors (up to
  ``2**-24 |w x|`` each, about 0.03 for a value near 1e6) do not cancel with the values: before,
  a weighted Mean of such values was off by up to 24 times its value. Now 1e-6 of float64."""
  rng = np.random.default_rng(seed)
  w = rng.uniform(0.1, 2.0, n).astype(np.float32)
  values = (offset + 1e6 * rng.standard_normal(n)).astype(np.float32)
  mean = np.sum(w.astype(F64) * values) / np.sum(w.astype(F64))
  values = values - np.float32(mean - offset * rng.uniform(-1e-3, 1e-3))
  fields = {"values": values, "weights": w}
  got = evaluate_randomly(pe.metrics.Mean(), fields, rng, batch_sizes=(5, 16, 64))
  assert_close(got, _weighted_mean(values.astype(F64), w.astype(F64)), rtol=1e-6, atol=0.0)


@given(
  seed=SEEDS,
  n=st.integers(1, 30),
  classes=st.integers(2, 12),
  closeness=st.sampled_from([1e-1, 1e-2, 1e-3, 1e-4, 1e-5]),
  scale=st.sampled_from([1.0, 1e9, 1e-9]),
)
def test_kl_divergence_of_nearly_equal_distributions(seed, n, classes, closeness, scale):
  """``preds = target * exp(closeness N(0, 1))``, some entries 0 (in both or in ``target``
  only), rows unnormalised: before, the first-order terms (which cancel) kept the rounding of
  the normalised rows, and KL of 5e-5 was off by 0.5%, of 5e-9 by 180 times. Now 1e-5 of
  scipy's ``entropy`` in float64 over the same float32 inputs, in any batching."""
  rng = np.random.default_rng(seed)
  target = rng.random((n, classes)) * (rng.random((n, classes)) > 0.2)
  target[:, 0] += 0.1
  preds = target * np.exp(closeness * rng.standard_normal(target.shape))
  preds[target == 0] = closeness * rng.random() * (rng.random() < 0.5)
  target, preds = (scale * target).astype(np.float32), (scale * preds).astype(np.float32)
  fields = {"preds": preds, "target": target}
  got = evaluate_randomly(pe.metrics.KLDivergence(), fields, rng, batch_sizes=(4, 16))
  expected = np.mean(
    [scipy.stats.entropy(t.astype(F64), p.astype(F64)) for t, p in zip(target, preds)]
  )
  assert_close(got, expected, rtol=1e-5, atol=0.0)


def test_kl_divergence_with_entries_below_float32s_normal_range_after_normalising():
  """An entry that normalises below float32's normal range (1e-37 in a row summing to 1000) is
  flushed to 0 on CPU: its term is then ``q'``, not ``0 * log(0)`` (NaN)."""
  target = np.ones((2, 1000), np.float32)
  target[:, 1] = 1e-37
  preds = np.ones((2, 1000), np.float32)
  preds[:, 1] = [1e-3, 1e-30]
  got = float(pe.metrics.KLDivergence().update(preds=preds, target=target).compute())
  expected = np.mean(
    [scipy.stats.entropy(t.astype(F64), p.astype(F64)) for t, p in zip(target, preds)]
  )
  assert_close(got, expected, rtol=1e-5, atol=0.0)


@pytest.mark.parametrize("power", [None, 1.0, 1.5, 2.0, 3.0])
@given(seed=SEEDS, n=st.integers(1, 30), scale=st.sampled_from([1e4, 1e8, 2.0**30]))
def test_predictions_far_below_their_targets_give_finite_deviances(power, seed, n, scale):
  """``(preds - target) / target`` rounds to -1 when ``preds`` is far below ``target``: before,
  MSLE and the Tweedie deviances of ``p >= 1`` read inf or NaN for ``preds`` 1-3 against targets
  near 1e8 (scikit-learn: 389.6, 4.1e10). The plain form there, 1e-5 of scikit-learn in float64
  (nothing cancels)."""
  rng = np.random.default_rng(seed)
  target = (scale * rng.uniform(1.0, 2.0, n)).astype(np.float32)
  preds = rng.uniform(0.5, 3.0, n).astype(np.float32)
  if power is None:
    metric, want = pe.metrics.MSLE(), sklearn.metrics.mean_squared_log_error(target, preds)
  else:
    metric = pe.metrics.TweedieDevianceScore(power=power)
    want = sklearn.metrics.mean_tweedie_deviance(target, preds, power=power)
  got = evaluate_randomly(metric, {"preds": preds, "target": target}, rng, batch_sizes=(5, 16))
  assert np.isfinite(got)
  assert_close(got, want, rtol=1e-5, atol=0.0)


def _std64(preds, target):
  return np.std(target.astype(np.float64))


def _pearson64(preds, target):
  return np.corrcoef(preds.astype(np.float64), target.astype(np.float64))[0, 1]


@pytest.mark.parametrize(
  ("metric", "reference"),
  [
    (lambda: pe.metrics.Std(argname="target"), _std64),
    (pe.metrics.R2Score, lambda preds, target: sklearn.metrics.r2_score(target, preds)),
    (pe.metrics.ExplainedVariance, lambda p, t: sklearn.metrics.explained_variance_score(t, p)),
    (pe.metrics.PearsonCorrelation, _pearson64),
    (
      lambda: pe.metrics.D2TweedieScore(power=0),
      lambda p, t: sklearn.metrics.d2_tweedie_score(t, p, power=0),
    ),
  ],
)
@given(seed=SEEDS, n=st.integers(4, 40), base=st.sampled_from([2**27, 2**30, 2**31 - 64]))
def test_integers_that_round_to_one_float32_are_not_constant(metric, reference, seed, n, base):
  """int32 values that all round to one float32 (``2**30 + {0, 3, 6, 9}``) differ: their
  deviations are formed from the integers. Before, a variable whose extremes rounded to one
  float32 read as constant (Std 0, R2 0, Pearson NaN); now the float64 values of the integers,
  within 1e-6, in every batching (the predictions too, offset by small integers)."""
  rng = np.random.default_rng(seed)
  target = (base + rng.integers(0, 10, n)).astype(np.int32)
  target[:2] = base, base + 9
  preds = (target.astype(np.int64) + rng.integers(-2, 3, n)).clip(None, 2**31 - 1).astype(np.int32)
  want = reference(preds, target)
  got = evaluate_randomly(metric(), {"preds": preds, "target": target}, rng, batch_sizes=(2, 3, 5))
  assert_close(got, want, rtol=1e-6, atol=1e-6)
