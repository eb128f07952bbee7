"""Moment metrics (`padded_eval.metrics.regression.moments`): issue 31's options and refusals, and
issue 12's numerical findings.

Issue 31: R2Score's ``adjusted=`` / ``force_finite=`` / ``multioutput`` weights, refusals.

The values themselves are rows of ``tests/metric_cases.py`` (``r2_adjusted*``,
``r2_multioutput_array_weighted``, ``r2_force_finite_false_raw``: scikit-learn float64,
garbage-padded uneven batches, every backend on 8 devices).

Issue 12 (numbers against numpy float64 and scikit-learn): every dataset is fed in padded
batches whose padding rows hold NaN, inf or huge garbage, through jitted updates, and (where it
says so) through ``pmap`` with ``reduce`` (psum) and ``aggregate``. References are float64 over
the same float32 inputs.
"""

import math
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats as scipy_stats
import sklearn.metrics as sklearn_metrics
from sklearn.metrics import r2_score

import padded_eval as pe
from padded_eval.metrics.regression.moments import Moments


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


# --- issue 12: helpers --------------------------------------------------------------------------

F64 = np.float64
AXIS = "devices"
_GARBAGE = np.array([np.nan, np.inf, -np.inf, 3e38], np.float32)


def _padded_batches(columns, batch_size, seed=0):
  """``columns`` (equal-length float32 arrays) cut into padded batches with garbage padding."""
  rng = np.random.default_rng(seed)
  n = len(next(iter(columns.values())))
  batches = []
  for start in range(0, n, batch_size):
    size = min(batch_size, n - start)
    batch = {}
    for key, column in columns.items():
      values = rng.choice(_GARBAGE, batch_size).astype(column.dtype)
      values[:size] = column[start : start + size]
      batch[key] = values
    batch["mask"] = np.arange(batch_size) < size
    batches.append(batch)
  return batches


_update = jax.jit(lambda metric, batch: metric.update(**batch))


def _batched(metric, columns, batch_size):
  for batch in _padded_batches(columns, batch_size):
    metric = _update(metric, batch)
  return metric


def _on_8_devices(metric, columns, batch_size):
  """``(reduced, aggregated)``: the metric after 8 devices each merged a share of batches."""
  batches = _padded_batches(columns, batch_size)
  empty = {
    k: np.zeros_like(v) if k == "mask" else np.full_like(v, np.nan) for k, v in batches[0].items()
  }
  batches += [empty] * (-len(batches) % 8)
  stacked = {k: np.stack([b[k] for b in batches]).reshape(8, -1, batch_size) for k in batches[0]}

  def per_device(device_batches):
    local, _ = jax.lax.scan(lambda m, b: (m.update(**b), None), metric, device_batches)
    return local.reduce(AXIS), local

  reduced, local = jax.pmap(per_device, axis_name=AXIS)(stacked)
  first = jax.tree.map(lambda x: x[0], reduced)
  return first, jax.device_get(local).aggregate()


def _relative(got, want):
  return abs(float(got) - float(want)) / abs(float(want))


# --- issue 12: a batch's total -----------------------------------------------------------------


def test_batch_total_is_exact_far_from_zero():
  """The batch total ``n * shift + sum(x - shift)`` equals fsum: the shift is one value.

  Before, XLA fused ``x - total * (1/n)`` into an FMA (unrounded shift) while the product
  used the rounded shift: batch totals at 1e6 were off by ~1 and Pearson drifted.
  """
  rng = np.random.default_rng(0)
  for size in (50, 64, 163):
    x = (1e6 + rng.standard_normal((1, size))).astype(np.float32)
    pairs = np.stack([x, (2e6 - x.astype(F64)).astype(np.float32)], -1)
    real = np.ones((1, size), bool)
    moments = Moments.of(jnp.asarray(pairs), jnp.asarray(real), jnp.ones((1, size)), (1,))
    exact = [math.fsum(pairs[0, :, j].astype(F64)) for j in range(2)]
    np.testing.assert_array_equal(moments.total.to_numpy()[0], exact)


# --- PearsonCorrelation --------------------------------------------------------------------


def test_pearson_anticorrelated_at_1e6_is_batch_invariant():
  """163 exactly anti-correlated pairs at 1e6: -1 in one pass and in batches (was -0.80/-0.13)."""
  rng = np.random.default_rng(0)
  x = (1e6 + rng.standard_normal(163)).astype(np.float32)
  y = (2e6 - x.astype(F64)).astype(np.float32)
  reference = np.corrcoef(x.astype(F64), y.astype(F64))[0, 1]
  assert reference == pytest.approx(-1.0, abs=1e-12)
  for batch_size in (163, 64, 50, 7):
    got = _batched(pe.metrics.PearsonCorrelation(), {"preds": x, "target": y}, batch_size)
    assert float(got.compute()) == pytest.approx(reference, abs=1e-6), batch_size


@pytest.mark.parametrize("seed", [0, 1])
def test_pearson_and_std_at_mean_1e4_merge_to_float64(seed):
  """Mean 1e4 / std 1 through many batches, psum and aggregate: within ~1e-6 of float64."""
  rng = np.random.default_rng(seed)
  x = (1e4 + rng.standard_normal(4000)).astype(np.float32)
  y = (1e4 + 0.6 * (x.astype(F64) - 1e4) + 0.8 * rng.standard_normal(4000)).astype(np.float32)
  reference = np.corrcoef(x.astype(F64), y.astype(F64))[0, 1]
  columns = {"preds": x, "target": y}
  for batch_size in (37, 100):
    got = _batched(pe.metrics.PearsonCorrelation(), columns, batch_size).compute()
    assert _relative(got, reference) <= 1e-6
  for got in _on_8_devices(pe.metrics.PearsonCorrelation(), columns, 16):
    assert _relative(got.compute(), reference) <= 1e-6
  std_reference = np.std(x.astype(F64))
  for got in _on_8_devices(pe.metrics.Std(), {"values": x}, 16):
    assert _relative(got.compute(), std_reference) <= 1e-6


@pytest.mark.parametrize("constant", [0.1, 3.3, 1e4 + 0.1])
@pytest.mark.parametrize("batch_size", [100, 64, 7])
def test_constant_variable_gives_nan_correlation_and_zero_std(constant, batch_size):
  """A constant variable: Pearson NaN (scipy's answer), Std exactly 0 (was +-0.24, 1.0)."""
  rng = np.random.default_rng(1)
  x = np.full(100, constant, np.float32)
  y = rng.standard_normal(100).astype(np.float32)
  for preds, target in ((x, y), (y, x), (x, x)):
    got = _batched(pe.metrics.PearsonCorrelation(), {"preds": preds, "target": target}, batch_size)
    assert np.isnan(float(got.compute()))
  std = _batched(pe.metrics.Std(), {"values": x}, batch_size)
  assert float(std.compute()) == 0.0 == np.std(x.astype(F64))


def test_nan_in_a_real_row_gives_nan_not_zero():
  """The constant / non-positive checks must not turn NaN data into 0 (or 1)."""
  values = np.array([1.0, np.nan, 3.0, 4.0], np.float32)
  other = np.array([2.0, 1.0, 0.0, 5.0], np.float32)
  columns = {"preds": values, "target": other}
  assert np.isnan(float(_batched(pe.metrics.Std(), {"values": values}, 2).compute()))
  assert np.isnan(float(_batched(pe.metrics.PearsonCorrelation(), columns, 2).compute()))
  r2 = _batched(pe.metrics.R2Score(), {"preds": other, "target": values}, 2).compute()
  assert np.isnan(float(r2))


def test_r2_of_constant_target_follows_sklearn():
  """Constant target: SS_tot is exactly 0, so sklearn's rule (1 if perfect, else 0) applies."""
  target = np.full(50, 2.0, np.float32)
  noisy = (2.0 + np.random.default_rng(2).standard_normal(50)).astype(np.float32)
  for preds in (target, noisy):
    got = _batched(pe.metrics.R2Score(), {"preds": preds, "target": target}, 16).compute()
    assert float(got) == r2_score(target.astype(F64), preds.astype(F64))


def test_pearson_of_std_1e8_over_10k_rows_is_one():
  """C_xx * C_yy ~ 1e40 overflowed float32 before the square root: the result was 0."""
  x = (np.random.default_rng(3).standard_normal(10_000) * 1e8).astype(np.float32)
  for batch_size in (10_000, 640):
    got = _batched(pe.metrics.PearsonCorrelation(), {"preds": x, "target": x}, batch_size)
    assert float(got.compute()) == pytest.approx(1.0, abs=1e-6)


# --- float32 range ---------------------------------------------------------------------------


def test_r2_and_rmse_at_scale_1e_25_match_sklearn():
  """Squares of 1e-25 underflow float32: R2 was 1.0 (sklearn about -1), RMSE 0."""
  rng = np.random.default_rng(4)
  target = (rng.standard_normal(200) * 1e-25).astype(np.float32)
  preds = (rng.standard_normal(200) * 1e-25).astype(np.float32)
  columns = {"preds": preds, "target": target}
  t64, p64 = target.astype(F64), preds.astype(F64)
  for batch_size in (200, 32):
    r2 = _batched(pe.metrics.R2Score(), columns, batch_size).compute()
    assert _relative(r2, r2_score(t64, p64)) <= 1e-5
    rmse = _batched(pe.metrics.RMSE(), columns, batch_size).compute()
    assert _relative(rmse, np.sqrt(np.mean((p64 - t64) ** 2))) <= 1e-6


def test_mse_std_r2_at_scale_1e18_fit_float32():
  """Values near 1e18: MSE ~1e35 and Std ~1e18 fit float32; sums of squares do not."""
  rng = np.random.default_rng(5)
  target = (1e18 + rng.standard_normal(2000) * 1e18).astype(np.float32)
  preds = (target.astype(F64) + rng.standard_normal(2000) * 3e17).astype(np.float32)
  t64, p64 = target.astype(F64), preds.astype(F64)
  columns = {"preds": preds, "target": target}
  for batch_size in (2000, 64):
    mse = _batched(pe.metrics.MSE(), columns, batch_size).compute()
    assert _relative(mse, np.mean((p64 - t64) ** 2)) <= 1e-6
    r2 = _batched(pe.metrics.R2Score(), columns, batch_size).compute()
    assert _relative(r2, r2_score(t64, p64)) <= 1e-5
    std = _batched(pe.metrics.Std(), {"values": target}, batch_size).compute()
    assert _relative(std, np.std(t64)) <= 1e-6
  for got in _on_8_devices(pe.metrics.Std(), {"values": target}, 64):
    assert _relative(got.compute(), np.std(t64)) <= 1e-6
  errors = (rng.standard_normal(2000) * 1e18).astype(np.float32)  # squares ~1e36: sums overflow
  zeros = np.zeros_like(errors)
  for batch_size in (2000, 64):
    mse = _batched(pe.metrics.MSE(), {"preds": errors, "target": zeros}, batch_size).compute()
    assert _relative(mse, np.mean(errors.astype(F64) ** 2)) <= 1e-6  # was NaN


def test_mean_whose_total_exceeds_float32_and_rmse_beyond_it():
  """A Mean over many batches whose total passes 3.4e38 (it was inf); RMSE of 1e20s."""
  rng = np.random.default_rng(6)
  values = (rng.uniform(1.0, 3.0, 20_000) * 1e36).astype(np.float32)  # total ~4e40
  for batch_size in (64, 50):  # a batch's own float32 sum must fit (see ExactSum.of_sum)
    got = _batched(pe.metrics.Mean(), {"values": values}, batch_size).compute()
    assert _relative(got, np.mean(values.astype(F64))) <= 1e-6
  errors = (rng.standard_normal(500) * 1e20).astype(np.float32)
  zeros = np.zeros_like(errors)
  rmse = _batched(pe.metrics.RMSE(), {"preds": errors, "target": zeros}, 64).compute()
  assert _relative(rmse, np.sqrt(np.mean(errors.astype(F64) ** 2))) <= 1e-6


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_inputs_are_upcast_before_reducing(dtype):
  """Std, MSE, Pearson, R2 of bf16/f16 inputs equal float64 over the upcast values."""
  rng = np.random.default_rng(7)
  x = jnp.asarray(100 + rng.standard_normal(3000), dtype)
  y = jnp.asarray(100 + rng.standard_normal(3000), dtype)
  x64, y64 = (np.asarray(v.astype(jnp.float32), F64) for v in (x, y))
  cases = [
    (pe.metrics.Std(), {"values": x}, np.std(x64)),
    (pe.metrics.MSE(), {"preds": x, "target": y}, np.mean((x64 - y64) ** 2)),
    (pe.metrics.PearsonCorrelation(), {"preds": x, "target": y}, np.corrcoef(x64, y64)[0, 1]),
    (pe.metrics.R2Score(), {"preds": x, "target": y}, r2_score(y64, x64)),
  ]
  for metric, inputs, reference in cases:
    got = metric.update(**inputs).compute()
    assert _relative(got, reference) <= 1e-5, type(metric).__name__


def test_weighted_means_share_the_public_base():
  base = pe.metrics.averages.WeightedMean
  for metric in ("Mean", "MSE", "MAE", "RMSE", "Perplexity"):
    assert issubclass(getattr(pe.metrics, metric), base), metric
