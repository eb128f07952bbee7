"""compare: the paired bootstrap of two runs, against float64 numpy and for calibration.

The Poisson counts are checked against the documented hash in tests/metrics/resampling/test_bootstrap.py;
here they only drive the float64 reference of the replicas.
"""

import jax
import numpy as np
import pytest

import padded_eval as pe
from padded_eval.metrics.resampling._poisson_counts import poisson_counts

R = 400


def correctness(rng, n):
  """0/1 correctness of models A and B on ``n`` examples sharing a difficulty ``u``.

  P(A right) = 0.70, P(B right) = 0.72 + 0.03 - 0.02: the true difference is 0.03, and the two
  models agree on most examples (what pairing exploits).
  """
  u, w = rng.random(n), rng.random(n)
  a = u < 0.70
  b = ((u < 0.72) | ((u > 0.9) & (w < 0.3))) & ~((u < 0.1) & (w < 0.2))
  return a.astype(np.float32), b.astype(np.float32)


TRUE_DIFFERENCE = 0.03


def evaluate(values, ids, boot, slices=None, batch=512):
  """``results.metric`` of a jit masked_eval of ``boot`` (sliced when ``slices`` is given)."""
  data = {"v": values, "id": ids} | ({} if slices is None else {"slice": slices})
  metric = boot if slices is None else pe.metrics.Sliced(boot, int(slices.max()) + 1)

  def step(params, batch):
    extra = {} if slices is None else {"slice": batch["slice"]}
    return metric.batch_updates(values=batch["v"], index=batch["id"], mask=batch["mask"], **extra)

  pad = {"v": np.nan, "id": -1} | ({} if slices is None else {"slice": -2})
  batches = pe.pad_batches(data, batch, num_devices=8, pad_value=pad)
  return pe.masked_eval(step, None, batches, backend="jit").metric


def test_difference_interval_and_p_value_equal_float64_numpy():
  rng = np.random.default_rng(0)
  n = 301
  a, b = correctness(rng, n)
  ids = rng.permutation(10 * n)[:n].astype(np.int32)
  boot = pe.metrics.Bootstrap(pe.metrics.Mean(), num_replicas=R, seed=7)
  result = pe.metrics.compare(evaluate(a, ids, boot), evaluate(b, ids, boot), confidence=0.9)
  counts = np.asarray(poisson_counts(7, R, ids)).astype(np.float64)  # [R, n]
  deltas = counts @ b / counts.sum(1) - counts @ a / counts.sum(1)
  below, above = (np.sum(deltas <= 0) + 1) / (R + 1), (np.sum(deltas >= 0) + 1) / (R + 1)
  np.testing.assert_allclose(result["difference"], b.mean() - a.mean(), rtol=1e-6)
  np.testing.assert_allclose(result["low"], np.quantile(deltas, 0.05), rtol=1e-5)
  np.testing.assert_allclose(result["high"], np.quantile(deltas, 0.95), rtol=1e-5)
  assert result["p_value"] == pytest.approx(min(1.0, 2 * min(below, above)))


def test_a_model_compared_with_itself_gives_zero_and_p_value_one():
  rng = np.random.default_rng(1)
  a, _ = correctness(rng, 157)
  boot = pe.metrics.Bootstrap(pe.metrics.Accuracy(), num_replicas=100)
  preds = np.stack([1 - a, a], -1)
  target = np.ones(157, np.int32)
  ids = np.arange(157, dtype=np.int32)
  update = jax.jit(lambda m, p, t, i: m.update(preds=p, target=t, index=i))
  first = update(boot, preds, target, ids)
  order = rng.permutation(157)  # the same examples in another order, in two batches
  second = update(boot, preds[order[:80]], target[:80], ids[order[:80]])
  second = update(second, preds[order[80:]], target[80:], ids[order[80:]])
  result = pe.metrics.compare(first, second)
  assert result == {"difference": 0.0, "low": 0.0, "high": 0.0, "p_value": 1.0}


def test_runs_that_are_not_paired_are_refused():
  boot = pe.metrics.Bootstrap(pe.metrics.Mean(), num_replicas=20, seed=1)
  values = np.linspace(0, 1, 50, dtype=np.float32)
  ids = np.arange(50, dtype=np.int32)
  run = boot.update(values=values, index=ids)
  other_seed = pe.metrics.Bootstrap(pe.metrics.Mean(), num_replicas=20, seed=2)
  with pytest.raises(ValueError, match="seed=1 vs 2"):
    pe.metrics.compare(run, other_seed.update(values=values, index=ids))
  with pytest.raises(ValueError, match="num_replicas=20 vs 30"):
    pe.metrics.compare(run, pe.metrics.Bootstrap(pe.metrics.Mean(), 30, seed=1))
  with pytest.raises(ValueError, match="same examples: 50 vs 49 real rows"):
    pe.metrics.compare(run, boot.update(values=values[1:], index=ids[1:]))
  with pytest.raises(ValueError, match="same examples: 50 vs 50"):
    pe.metrics.compare(run, boot.update(values=values, index=ids + 1))
  with pytest.raises(ValueError, match="got a=Mean"):
    pe.metrics.compare(pe.metrics.Mean(), run)
  with pytest.raises(ValueError, match="confidence"):
    pe.metrics.compare(run, run, confidence=1.0)


@pytest.mark.slow
def test_paired_interval_is_calibrated_and_narrower_than_unpaired():
  """200 synthetic test sets of 300 examples, one slice each: one sliced evaluation per model."""
  rng = np.random.default_rng(2)
  reps, n = 200, 300
  a, b = correctness(rng, reps * n)
  slices = np.repeat(np.arange(reps, dtype=np.int32), n)
  ids = np.arange(reps * n, dtype=np.int32)
  boot = pe.metrics.Bootstrap(pe.metrics.Mean(), num_replicas=R, seed=11)
  run_a, run_b = evaluate(a, ids, boot, slices, 2048), evaluate(b, ids, boot, slices, 2048)
  paired = pe.metrics.compare(run_a, run_b)
  covered = (paired["low"] <= TRUE_DIFFERENCE) & (TRUE_DIFFERENCE <= paired["high"])
  # Unpaired: replica r of B against another replica of A (as if the runs were independent).
  ra = np.asarray(jax.vmap(lambda m: m.replicas())(run_a.slices))  # [reps, R]
  rb = np.asarray(jax.vmap(lambda m: m.replicas())(run_b.slices))
  unpaired = rb[:, rng.permutation(R)] - ra
  low, high = np.quantile(unpaired, 0.025, axis=1), np.quantile(unpaired, 0.975, axis=1)
  paired_width = np.mean(paired["high"] - paired["low"])
  unpaired_width = np.mean(high - low)
  unpaired_covered = (low <= TRUE_DIFFERENCE) & (TRUE_DIFFERENCE <= high)
  print(
    f"coverage paired {covered.mean():.3f} unpaired {unpaired_covered.mean():.3f}; mean width "
    f"paired {paired_width:.4f} unpaired {unpaired_width:.4f}"
  )
  assert abs(covered.mean() - 0.95) <= 0.03
  assert paired_width < 0.7 * unpaired_width
  np.testing.assert_allclose(
    paired["difference"], b.reshape(reps, n).mean(1) - a.reshape(reps, n).mean(1), atol=1e-6
  )
