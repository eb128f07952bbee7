"""masked_eval(..., on_invalid=...): invalid values counted in real rows are raised, warned or ignored.

A tiny metric defined here sums its values and counts negative and NaN real values as
invalid. Padded rows hold negative values and NaN on purpose: they must never count.
References are numpy float64 sums and counts over the real rows.
"""

import warnings
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import padded_eval as pe
from padded_eval.eval._evaluate import InvalidValuesWarning
from padded_eval.exact.accumulate import ExactCount, ExactSum
from padded_eval.masking import masked
from padded_eval.metrics.base import Metric, invalid_state, state

BATCH = 32


class SumOfNonNegatives(Metric):
  """The sum of the real values; negative and NaN real values are counted as invalid."""

  invalid_kinds: ClassVar[tuple[str, ...]] = ("negative", "nan")
  total: ExactSum = state(lambda self: ExactSum.zeros())
  invalid: ExactCount = state(invalid_state)

  def _batch_state(self, *, values, mask):
    valid = mask & (values >= 0)
    return {
      "total": ExactSum.of(jnp.sum(masked(values, valid))),
      "invalid": self.count_invalid(negative=mask & (values < 0), nan=mask & jnp.isnan(values)),
    }

  def compute(self):
    return self.total.total()


def step_fn(params, batch):
  del params
  return SumOfNonNegatives(name="sum").batch_updates(values=batch["v"], mask=batch["mask"])


def make_batches(real_values, seed=0):
  """Batches of BATCH rows; padded rows hold negatives and NaN (never to be counted)."""
  rng = np.random.default_rng(seed)
  batches = []
  for start in range(0, len(real_values), BATCH):
    real = real_values[start : start + BATCH]
    pad = rng.choice([-5.0, -1e30, np.nan], BATCH - len(real))
    batches.append(
      {
        "v": np.concatenate([real, pad]).astype(np.float32),
        "mask": np.arange(BATCH) < len(real),
      }
    )
  return batches


def clean_values(n=203, seed=1):
  return np.random.default_rng(seed).integers(0, 100, n).astype(np.float32)


def dirty_values(seed=2):
  """Real rows with some negative and some NaN values; returns (values, negatives, nans)."""
  rng = np.random.default_rng(seed)
  values = clean_values()
  negative = rng.random(len(values)) < 0.1
  nan = ~negative & (rng.random(len(values)) < 0.05)
  values[negative] = -rng.integers(1, 50, negative.sum())
  values[nan] = np.nan
  return values, int(negative.sum()), int(nan.sum())


def reference_sum(values):
  real = values.astype(np.float64)
  return real[real >= 0].sum()  # NaN >= 0 is False: excluded like the negatives


def test_invalid_values_in_padded_rows_never_count(backend):
  values = clean_values()
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # not even a warning
    result = pe.masked_eval(step_fn, None, make_batches(values), backend=backend)
  assert result["num_examples"] == len(values)
  np.testing.assert_allclose(result["sum"], reference_sum(values), rtol=1e-6)


def test_invalid_values_in_real_rows_raise_by_default(backend):
  values, negatives, nans = dirty_values()
  assert negatives > 0 and nans > 0
  with pytest.raises(ValueError) as info:
    pe.masked_eval(step_fn, None, make_batches(values), backend=backend)
  message = str(info.value)
  assert f"'sum': {negatives} x 'negative'" in message
  assert f"'sum': {nans} x 'nan'" in message
  assert "on_invalid='warn'" in message


def test_warn_returns_the_results_with_the_counts(backend):
  values, negatives, nans = dirty_values()
  with pytest.warns(InvalidValuesWarning) as record:
    result = pe.masked_eval(step_fn, None, make_batches(values), backend=backend, on_invalid="warn")
  assert len(record) == 1
  message = str(record[0].message)
  assert f"'sum': {negatives} x 'negative'" in message and f"'sum': {nans} x 'nan'" in message
  assert record[0].filename == __file__  # points at the caller of masked_eval
  assert result["num_examples"] == len(values)
  np.testing.assert_allclose(result["sum"], reference_sum(values), rtol=1e-6)


def test_ignore_returns_the_results_silently():
  values, _, _ = dirty_values()
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    result = pe.masked_eval(step_fn, None, make_batches(values), backend="jit", on_invalid="ignore")
  np.testing.assert_allclose(result["sum"], reference_sum(values), rtol=1e-6)


def test_collection_member_is_named_by_its_key():
  values, negatives, _ = dirty_values()

  def collection_step(params, batch):
    del params
    metrics = pe.Metrics({"clean": SumOfNonNegatives()})
    return metrics.batch_updates(values=batch["v"], mask=batch["mask"])

  with pytest.raises(ValueError, match=f"'clean': {negatives} x 'negative'"):
    pe.masked_eval(collection_step, None, make_batches(values), backend="pmap")


def test_invalid_values_warning_is_a_runtime_warning():
  assert issubclass(InvalidValuesWarning, RuntimeWarning)


def test_bad_on_invalid():
  with pytest.raises(
    ValueError, match="on_invalid must be one of 'raise', 'warn', 'ignore'; got 'loud'"
  ):
    pe.masked_eval(step_fn, None, make_batches(clean_values()), on_invalid="loud")


# --- the weighted means count NaN in real elements (as MAPE and the other metrics do) ------------

_MEANS = {
  "mean": lambda: pe.metrics.Mean(),
  "mse": lambda: pe.metrics.MSE(),
  "mae": lambda: pe.metrics.MAE(),
  "rmse": lambda: pe.metrics.RMSE(),
  "mse_two_outputs": lambda: pe.metrics.MSE(num_outputs=2, multioutput="raw_values"),
  "mape": lambda: pe.metrics.MAPE(),  # a weighted mean too: a NaN of weight 0 is not seen
}


def _nan_rows(rng, n, shape=()):
  """preds, target with NaN in some real elements, weights with some zeros (a NaN there unseen)."""
  preds = rng.normal(size=(n, *shape)).astype(np.float32)
  target = rng.normal(size=(n, *shape)).astype(np.float32)
  preds[rng.random(preds.shape) < 0.15] = np.nan
  target[rng.random(target.shape) < 0.1] = np.nan
  weights = np.where(rng.random(n) < 0.2, 0.0, rng.uniform(0.5, 2.0, n)).astype(np.float32)
  preds[np.flatnonzero(weights == 0)[:2]] = np.nan  # NaN nobody sees
  return preds, target, weights


@pytest.mark.parametrize("name", _MEANS)
def test_weighted_means_count_nan_in_real_elements(name):
  rng = np.random.default_rng(5)
  shape = (2,) if name == "mse_two_outputs" else ()
  preds, target, weights = _nan_rows(rng, 21, shape)
  pad = 5  # padded rows: NaN and inf, never counted
  garbage = np.full((pad, *shape), np.nan, np.float32)
  mask = np.r_[np.ones(21, bool), np.zeros(pad, bool)]
  metric = _MEANS[name]()
  args = {
    "preds": np.concatenate([preds, garbage]),
    "target": np.concatenate([target, np.full_like(garbage, np.inf)]),
    "weights": np.r_[weights, np.ones(pad, np.float32)],
    "mask": mask,
  }
  if name == "mean":  # Mean averages one keyword: the errors, NaN where either side is NaN
    args = {"values": args["preds"] - args["target"], "weights": args["weights"], "mask": mask}
  first = {k: v[:13] for k, v in args.items()}
  second = {k: v[13:] for k, v in args.items()}
  parts = [jax.jit(lambda m, b: m.batch_updates(**b))(metric, b) for b in (first, second)]
  merged = parts[0].merge(parts[1])
  error = preds.astype(np.float64) - target
  seen = np.broadcast_to((weights != 0).reshape(-1, *([1] * len(shape))), error.shape)
  want = int(np.count_nonzero(np.isnan(error) & seen))
  assert want > 0
  assert merged.invalid_counts() == {"nan value": want}
  assert np.all(np.isnan(np.asarray(merged.compute())))


def test_a_nan_loss_in_a_real_row_is_reported_by_masked_eval():
  values = np.arange(10, dtype=np.float32)
  values[[3, 7]] = np.nan
  batches = pe.pad_batches({"loss": values}, 8, pad_value=np.nan)

  def step(params, batch):
    del params
    return pe.metrics.Mean("loss").batch_updates(loss=batch["loss"], mask=batch["mask"])

  with pytest.raises(ValueError, match=r"'mean': 2 x 'nan value'"):
    pe.masked_eval(step, None, batches, backend="jit")
  ignored = pe.masked_eval(step, None, batches, backend="jit", on_invalid="ignore")
  assert np.isnan(ignored["mean"]) and ignored["num_examples"] == 10
