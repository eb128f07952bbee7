"""Regression tests of issue 26's numerical findings ("Numbers"), against numpy float64.

Every dataset goes through jitted updates in padded batches whose padding rows hold NaN,
inf or huge garbage; sizes divide neither the batch size nor the device count.
"""

import functools
import math

import jax
import numpy as np
import pytest
import scipy.special
from _xla_defaults import XLA_DEFAULTS

import padded_eval as pe
from padded_eval.exact._floats import compensated_sum

F64 = np.float64
_GARBAGE = np.array([np.nan, np.inf, -np.inf, 3e38], np.float32)

_update = jax.jit(lambda metric, batch: metric.update(**batch))


def _padded(columns, batch_size, seed=0):
  """``columns`` (equal-length arrays) cut into padded batches with garbage padding."""
  rng = np.random.default_rng(seed)
  n = len(next(iter(columns.values())))
  batches = []
  for start in range(0, n, batch_size):
    size = min(batch_size, n - start)
    batch = {}
    for key, column in columns.items():
      if np.issubdtype(column.dtype, np.floating):
        values = rng.choice(_GARBAGE, (batch_size,) + column.shape[1:]).astype(column.dtype)
      else:
        values = rng.integers(-(2**30), 2**30, (batch_size,) + column.shape[1:])
        values = values.astype(column.dtype)
      values[:size] = column[start : start + size]
      batch[key] = values
    batch["mask"] = np.arange(batch_size) < size
    batches.append(batch)
  return batches


def _batched(metric, columns, batch_size, jit=True):
  for batch in _padded(columns, batch_size):
    metric = _update(metric, batch) if jit else metric.update(**batch)
  return metric


# --- a weight-0 element changes nothing -------------------------------------------------

_OUTLIERS = (1e20, -3e38, np.inf, -np.inf, np.nan)


def _weighted_reference(name, x, y, w):
  keep = w != 0
  x, y, w = x[keep].astype(F64), y[keep].astype(F64), w[keep].astype(F64)
  mean = lambda v: np.sum(w * v) / np.sum(w)
  if name == "mse":
    return mean((x - y) ** 2)
  if name == "rmse":
    return np.sqrt(mean((x - y) ** 2))
  if name == "mae":
    return mean(np.abs(x - y))
  if name == "mean":
    return mean(x)
  if name == "std":
    return np.sqrt(mean((x - mean(x)) ** 2))
  if name == "r2":
    return 1.0 - np.sum(w * (x - y) ** 2) / np.sum(w * (y - mean(y)) ** 2)
  cxy = np.sum(w * (x - mean(x)) * (y - mean(y)))
  return cxy / np.sqrt(np.sum(w * (x - mean(x)) ** 2) * np.sum(w * (y - mean(y)) ** 2))


_WEIGHTED = {
  "mse": (pe.metrics.MSE, "pair"),
  "rmse": (pe.metrics.RMSE, "pair"),
  "mae": (pe.metrics.MAE, "pair"),
  "mean": (pe.metrics.Mean, "values"),
  "std": (pe.metrics.Std, "values"),
  "r2": (pe.metrics.R2Score, "pair"),
  "pearson": (pe.metrics.PearsonCorrelation, "pair"),
}


def _weighted_columns(kind, x, y, w):
  if kind == "values":
    return {"values": x, "weights": w}
  return {"preds": x, "target": y, "weights": w}


def test_issue_example_weight_zero_outlier():
  """x = [1, 2, 3, 5, 1e20], w = [1, 1, 1, 1, 0]: MSE 9.75, Std 1.479, Pearson 1 (was 0, 0, NaN)."""
  x = np.array([1, 2, 3, 5, 1e20], np.float32)
  w = np.array([1, 1, 1, 1, 0], np.float32)
  zeros = np.zeros(5, np.float32)
  mse = _batched(pe.metrics.MSE(), {"preds": x, "target": zeros, "weights": w}, 8).compute()
  std = _batched(pe.metrics.Std(), {"values": x, "weights": w}, 8).compute()
  pearson = pe.metrics.PearsonCorrelation()
  pearson = _batched(pearson, {"preds": x, "target": 2 * x + 1, "weights": w}, 8).compute()
  real = x[:4].astype(F64)
  np.testing.assert_allclose(float(mse), np.mean(real**2), rtol=1e-6)
  np.testing.assert_allclose(float(std), np.std(real), rtol=1e-6)
  np.testing.assert_allclose(float(pearson), 1.0, rtol=1e-6)


@pytest.mark.parametrize("outlier", _OUTLIERS)
@pytest.mark.parametrize("name", sorted(_WEIGHTED))
def test_weight_zero_outlier_changes_nothing(name, outlier):
  """An element of weight 0 holding a huge, infinite or NaN value is not seen at all."""
  rng = np.random.default_rng(3)
  n = 37
  x = (2.0 + rng.standard_normal(n)).astype(np.float32)
  y = (0.5 * x + rng.standard_normal(n)).astype(np.float32)
  w = rng.uniform(0.5, 2.0, n).astype(np.float32)
  zero = rng.choice(n, 5, replace=False)
  w[zero] = 0.0
  x[zero[:3]] = outlier
  y[zero[2:]] = outlier
  make, kind = _WEIGHTED[name]
  got = _batched(make(), _weighted_columns(kind, x, y, w), 16).compute()
  np.testing.assert_allclose(float(got), _weighted_reference(name, x, y, w), rtol=2e-6)


# --- an empty batch is an empty update ----------------------------------------------------
#
# On every row of metric_cases.CASES: ``check_zero_row_update_is_empty`` in
# tests/_metrics_shared.py, run by tests/metrics/test_base.py's grid after the row's other eager
# checks (whose programs for the row's batches it reuses). Under jit:


def test_zero_row_update_under_jit():
  """The same under jit, where a 0-row batch is traced with static zero-size shapes."""
  for metric, empty in (
    (pe.metrics.MSE(), {"preds": np.zeros(0, np.float32), "target": np.zeros(0, np.float32)}),
    (pe.metrics.Std(), {"values": np.zeros((0, 3), np.float32)}),
    (
      pe.metrics.PearsonCorrelation(num_outputs=2),
      {"preds": np.zeros((0, 2), np.float32), "target": np.zeros((0, 2), np.float32)},
    ),
  ):
    empty = {**empty, "mask": np.zeros(0, bool), "weights": np.zeros(0, np.float32)}
    assert np.all(
      np.isnan(np.asarray(jax.jit(lambda m, b: m.update(**b).compute())(metric, empty)))
    )


# --- Perplexity: targets outside the vocabulary are counted as invalid ---------------------


@pytest.mark.parametrize("ignore_index", [None, -100])
def test_perplexity_counts_targets_outside_vocabulary(ignore_index):
  """Ids ``>= V``, ``< 0`` and -100 (without ``ignore_index``) are invalid, not NaN."""
  rng = np.random.default_rng(5)
  rows, length, vocab = 29, 6, 11
  logits = (3.0 * rng.standard_normal((rows, length, vocab))).astype(np.float32)
  target = rng.integers(0, vocab, (rows, length)).astype(np.int32)
  bad = rng.random((rows, length)) < 0.15
  target[bad] = rng.choice([vocab, vocab + 7, -1, -100], bad.sum())
  ignored = target == ignore_index
  keep = ~bad
  log_probs = logits.astype(F64) - scipy.special.logsumexp(logits.astype(F64), -1, keepdims=True)
  picked = np.take_along_axis(log_probs, np.where(keep, target, 0)[..., None], -1)[..., 0]
  reference = np.exp(-np.mean(picked[keep]))
  metric = _batched(
    pe.metrics.Perplexity(ignore_index=ignore_index), {"preds": logits, "target": target}, 8
  )
  np.testing.assert_allclose(float(metric.compute()), reference, rtol=1e-5)
  expected = int((bad & ~ignored).sum())
  assert metric.invalid_counts() == {
    "target out of range": expected,
    "preds look like probabilities, not logits": 0,
    "nan value": 0,
  }
  assert metric.invalid_report() == [("perplexity", "target out of range", expected)]


def test_perplexity_counts_nan_cross_entropy_of_real_tokens():
  """A real token of nonzero weight whose cross entropy is NaN (a NaN logit, or +inf logits) is
  counted, kind ``"nan value"``, and the perplexity is NaN; padding and weight 0 never count."""
  rng = np.random.default_rng(23)
  rows, length, vocab = 21, 4, 7
  logits = rng.standard_normal((rows, length, vocab)).astype(np.float32)
  target = rng.integers(0, vocab, (rows, length)).astype(np.int32)
  weights = rng.uniform(0.5, 2.0, (rows, length)).astype(np.float32)
  logits[2, 1, 3] = np.nan
  logits[5, 0, :2] = np.inf
  target[5, 0] = 1  # an inf target logit: inf - inf, NaN (another class's inf gives inf)
  logits[9, 3, 0] = np.nan
  weights[9, 3] = 0.0  # not seen
  logits[13, 2, 6] = np.nan
  target[13, 2] = vocab + 2  # out of range: counted as that, not twice
  columns = {"preds": logits, "target": target, "weights": weights}
  metric = _batched(pe.metrics.Perplexity(), columns, 8)
  with np.errstate(invalid="ignore"):
    log_probs = logits.astype(F64) - scipy.special.logsumexp(logits.astype(F64), -1, keepdims=True)
  in_vocabulary = (target >= 0) & (target < vocab)
  picked = np.take_along_axis(log_probs, np.where(in_vocabulary, target, 0)[..., None], -1)[..., 0]
  expected = int(np.count_nonzero(np.isnan(picked) & in_vocabulary & (weights != 0)))
  assert expected == 2
  counts = metric.invalid_counts()
  assert counts["nan value"] == expected and counts["target out of range"] == 1
  assert np.isnan(float(metric.compute()))
  clean = {k: np.delete(v, [2, 5], axis=0) for k, v in columns.items()}  # the seen NaN rows out
  keep = np.delete(in_vocabulary & (weights != 0), [2, 5], axis=0)
  w = clean["weights"].astype(F64)[keep]
  reference = np.exp(-np.sum(w * np.delete(picked, [2, 5], axis=0)[keep]) / np.sum(w))
  clean_metric = _batched(pe.metrics.Perplexity(), clean, 8)
  np.testing.assert_allclose(float(clean_metric.compute()), reference, rtol=1e-5)
  assert clean_metric.invalid_counts()["nan value"] == 0

  def step(params, batch):
    del params
    return pe.metrics.Perplexity().batch_updates(**batch)

  batches = pe.pad_batches(columns, 8, pad_value={"preds": np.nan, "target": -1, "weights": np.nan})
  with pytest.raises(ValueError, match=r"'perplexity': 2 x 'nan value'"):
    pe.masked_eval(step, None, batches, backend="jit")


def test_perplexity_ignore_index_may_be_a_numpy_int():
  """``ignore_index=np.int64(-100)`` ignores -100 like ``-100`` (was refused as not an int)."""
  rng = np.random.default_rng(8)
  logits = rng.standard_normal((5, 4, 6)).astype(np.float32)
  target = rng.integers(0, 6, (5, 4)).astype(np.int32)
  target[rng.random((5, 4)) < 0.3] = -100
  keep = target != -100
  log_probs = logits.astype(F64) - scipy.special.logsumexp(logits.astype(F64), -1, keepdims=True)
  picked = np.take_along_axis(log_probs, np.where(keep, target, 0)[..., None], -1)[..., 0]
  metric = pe.metrics.Perplexity(ignore_index=np.int64(-100))
  got = metric.update(preds=logits, target=target)
  np.testing.assert_allclose(float(got.compute()), np.exp(-np.mean(picked[keep])), rtol=1e-5)
  assert got.invalid_counts()["target out of range"] == 0


@pytest.mark.parametrize(
  "make, match",
  [
    (
      lambda: pe.metrics.Perplexity(ignore_index=2**40),
      r"ignore_index must be .*int32.*1099511627776",
    ),
    (lambda: pe.metrics.Perplexity(ignore_index=1.0), r"ignore_index must be None or an int"),
    (lambda: pe.metrics.Perplexity(ignore_index=True), r"ignore_index must be None or an int"),
  ],
)
def test_perplexity_bad_ignore_index_is_refused_naming_it(make, match):
  with pytest.raises(ValueError, match=match):
    make()


def test_perplexity_logits_over_no_class_are_refused_naming_preds():
  """``preds [B, T, 0]``: no class to pick (was numpy's 'zero-size array to reduction')."""
  batch = {"preds": np.zeros((2, 3, 0), np.float32), "target": np.zeros((2, 3), np.int32)}
  with pytest.raises(ValueError, match=r"preds has shape \(2, 3, 0\).*at least one class"):
    pe.metrics.Perplexity().update(**batch)
  with pytest.raises(ValueError, match=r"preds has shape \(2, 3, 0\).*at least one class"):
    jax.jit(lambda m, b: m.update(**b))(pe.metrics.Perplexity(), batch)


def test_a_missing_keyword_is_named_once():
  """Perplexity reads preds and target in two methods: 'target' was named twice in the error
  and required_inputs() listed ('preds', 'target', 'preds', 'target')."""
  metric = pe.metrics.Perplexity()
  assert metric.required_inputs() == ("preds", "target")
  with pytest.raises(
    ValueError, match=r"needs the keyword\(s\) 'target'; got keywords \['preds'\]"
  ):
    metric.update(preds=np.zeros((1, 2, 4), np.float32))
  for name in dir(pe.metrics):
    cls = getattr(pe.metrics, name)
    if isinstance(cls, type) and issubclass(cls, pe.metrics.Metric):
      for names in (cls._required_inputs, cls._optional_inputs):
        assert len(set(names)) == len(names), (name, names)


# --- int64 inputs beyond int32: exact or refused, never wrapped ----------------------------


def test_int64_values_are_averaged_not_wrapped():
  """int64 nanosecond timestamps (~1.7e18) and [2**40, 3]: float64's mean (was 9.1e8, 1.5)."""
  rng = np.random.default_rng(7)
  stamps = 1_700_000_000_000_000_000 + rng.integers(0, 10**15, 37, dtype=np.int64)
  for values in (stamps, np.array([2**40, 3], np.int64)):
    got = _batched(pe.metrics.Mean(), {"values": values}, 16, jit=False).compute()
    np.testing.assert_allclose(float(got), np.mean(values.astype(F64)), rtol=1e-7)
  errors = np.array([2**40, -(2**33), 5], np.int64)
  got = _batched(pe.metrics.MSE(), {"preds": errors, "target": np.zeros(3, np.int64)}, 8, jit=False)
  np.testing.assert_allclose(float(got.compute()), np.mean(errors.astype(F64) ** 2), rtol=1e-6)
  got = _batched(
    pe.metrics.Std(), {"values": np.array([2**40, 2**40 + 2**20], np.uint64)}, 8, False
  )
  np.testing.assert_allclose(float(got.compute()), 2.0**19, rtol=1e-6)


@pytest.mark.parametrize(
  "make, key, batch",
  [
    (pe.metrics.Accuracy, "target", {"preds": np.array([0, 1]), "target": np.array([2**32, 1])}),
    (pe.metrics.Accuracy, "preds", {"preds": np.array([2**32, 1]), "target": np.array([0, 1])}),
    (
      pe.metrics.Perplexity,
      "target",
      {"preds": np.zeros((1, 2, 4), np.float32), "target": np.array([[1, -(2**40)]])},
    ),
  ],
)
def test_int64_ids_beyond_int32_are_refused(make, key, batch):
  """A class or token id outside int32 is refused naming the argument (Accuracy was 1.0)."""
  batch = {
    k: np.asarray(v, np.int64) if k != "preds" or v.dtype.kind == "i" else v
    for k, v in batch.items()
  }
  with pytest.raises(ValueError, match=rf"{key} holds integers .* outside int32"):
    make().update(**batch)


# --- in-batch sums are compensated: cancelling values, any batching ------------------------


@pytest.mark.parametrize("seed", [0, 2, 11])
@pytest.mark.parametrize("batch_size", [7, 16, 64, 208, 256])
def test_mean_of_cancelling_values_in_any_batching(seed, batch_size):
  """203 values 1e4 + 1e6 N(0, 1): within 1e-6 of float64 (was 4.3e-6, batch-dependent)."""
  rng = np.random.default_rng(seed)
  values = (1e4 + 1e6 * rng.standard_normal(203)).astype(np.float32)
  values -= np.float32(np.mean(values.astype(F64)) - 1e4 * rng.uniform(-1, 1))  # near 0
  reference = np.mean(values.astype(F64))
  got = _batched(pe.metrics.Mean(), {"values": values}, batch_size).compute()
  assert abs(float(got) - reference) <= 1e-6 * abs(reference)


@pytest.mark.parametrize("sharded", [False, True])
def test_compensated_sum_is_error_free_under_jit(sharded):
  """``hi + lo`` is float64's sum within ``n 2**-48 sum|x|`` at XLA's default optimisation
  level, with the operands computed in the same program and over 8 devices' shards."""
  rng = np.random.default_rng(1)
  n = 8 * 1021
  x = (rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 6, n)).astype(np.float32)
  shift = np.float32(0.75)

  @functools.partial(jax.jit, compiler_options=XLA_DEFAULTS)
  def run(x):
    operands = x * shift + 1e3  # products and sums that XLA may fuse into the reduction
    return compensated_sum(operands), operands

  if sharded:
    mesh = jax.make_mesh((8,), ("data",))
    x = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
  (hi, lo), operands = run(x)
  operands = np.asarray(operands, F64)
  exact = math.fsum(operands)
  assert abs(float(hi) + float(lo) - exact) <= n * 2.0**-48 * np.sum(np.abs(operands))
  assert abs(float(np.sum(operands.astype(np.float32))) - exact) > abs(
    float(hi) + float(lo) - exact
  )
