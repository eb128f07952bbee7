"""Unit tests of the exact accumulators against exact integer / float64 references."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import padded_eval as pe
from padded_eval.exact._floats import two_prod
from padded_eval.exact.accumulate import ExactCount, ExactSum

AXIS = "devices"


def _counts_near_limbs(rng, shape):
  """Random ExactCounts whose limbs sit near their carry points."""
  lo = rng.integers((1 << 30) - 64, 1 << 30, size=shape).astype(np.int32)
  hi = rng.integers(0, 1 << 27, size=shape).astype(np.int32)
  return ExactCount._make(jnp.asarray(lo), jnp.asarray(hi)), (hi.astype(np.int64) << 30) + lo


def test_count_past_2_31_by_merging():
  near_max = ExactCount.of(jnp.int32(2**31 - 1))
  total = jax.jit(lambda c: jax.lax.fori_loop(0, 999, lambda _, t: t.merge(c), c))(near_max)
  assert int(total.to_numpy()) == 1000 * (2**31 - 1)
  assert float(total.total()) == pytest.approx(1000 * (2**31 - 1), rel=1e-7)


def test_count_rejects_floats():
  with pytest.raises(ValueError, match="counts"):
    ExactCount.of(jnp.ones(3))


def test_count_psum_and_aggregate_on_8_devices():
  n = jax.local_device_count()
  assert n == 8
  counts, exact = _counts_near_limbs(np.random.default_rng(0), (n, 5))
  reduced = jax.pmap(lambda c: c.reduce(AXIS), axis_name=AXIS)(counts)
  for device in range(n):
    np.testing.assert_array_equal(
      jax.tree.map(lambda x: x[device], reduced).to_numpy(), exact.sum(axis=0)
    )
  np.testing.assert_array_equal(counts.aggregate().to_numpy(), exact.sum(axis=0))
  gathered = jax.pmap(lambda c: jax.lax.all_gather(c, AXIS).aggregate(), axis_name=AXIS)(counts)
  np.testing.assert_array_equal(
    jax.tree.map(lambda x: x[0], gathered).to_numpy(), exact.sum(axis=0)
  )
  assert exact.sum() > 2**31 * n


def test_sum_matches_fsum_over_many_merges():
  rng = np.random.default_rng(0)
  values = (rng.standard_normal(20000) * 10.0 ** rng.uniform(-4, 4, 20000)).astype(np.float32)
  scan = jax.jit(
    lambda xs: jax.lax.scan(lambda t, x: (t.merge(ExactSum.of(x)), None), ExactSum.zeros(), xs)[0]
  )
  total = float(scan(values).to_numpy())
  exact = math.fsum(values.astype(np.float64))
  assert abs(total - exact) <= 1e-12 * np.sum(np.abs(values.astype(np.float64)))
  plain = float(jnp.cumsum(jnp.asarray(values))[-1])  # what a float32 running total gives
  assert abs(plain - exact) > 100 * abs(total - exact)


def test_sum_does_not_stall_where_float32_does():
  start = ExactSum.of(jnp.float32(2**24))
  total = jax.lax.fori_loop(0, 1000, lambda _, t: t.merge(ExactSum.of(jnp.float32(1.0))), start)
  assert float(total.to_numpy()) == 2**24 + 1000
  assert float(jnp.float32(2**24) + jnp.float32(1.0)) == 2**24  # the stall it avoids


def test_sum_psum_exact_across_devices():
  n = jax.local_device_count()
  rng = np.random.default_rng(1)
  parts = (rng.standard_normal((n, 4)) * 10.0 ** rng.integers(-6, 9, (n, 4))).astype(np.float32)
  sums = jax.pmap(lambda x: ExactSum.of(x).reduce(AXIS), axis_name=AXIS)(parts)
  exact = np.array([math.fsum(parts[:, j].astype(np.float64)) for j in range(4)])
  scale = np.sum(np.abs(parts.astype(np.float64)), axis=0)
  for device in range(n):
    got = jax.tree.map(lambda x: x[device], sums).to_numpy()
    assert np.all(np.abs(got - exact) <= 1e-12 * scale)
  assert np.all(
    np.abs(ExactSum.of(jnp.asarray(parts)).aggregate().to_numpy() - exact) <= 1e-12 * scale
  )


@pytest.mark.parametrize("dtype, ones", [(jnp.bfloat16, 1000), (jnp.float16, 5000)])
def test_low_precision_inputs_are_upcast(dtype, ones):
  values = jnp.ones(ones, dtype)
  stall = 256 if dtype == jnp.bfloat16 else 2048  # where a running total in dtype stops
  assert float(jnp.asarray(stall, dtype) + jnp.asarray(1, dtype)) == stall
  assert ExactSum.of(values).hi.dtype == jnp.float32
  mean = pe.metrics.Mean().update(values=values * 3)
  assert mean.total.hi.dtype == jnp.float32
  assert float(mean.total.to_numpy()) == 3 * ones
  assert float(mean.compute()) == 3.0


def test_bfloat16_logits_perplexity_and_std():
  rng = np.random.default_rng(2)
  logits = jnp.asarray(rng.standard_normal((4, 8, 50)) * 3, jnp.bfloat16)
  target = rng.integers(0, 50, (4, 8))
  exact_logits = np.asarray(logits.astype(jnp.float32), np.float64)
  shifted = exact_logits - exact_logits.max(-1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  reference = np.exp(-np.mean(np.take_along_axis(log_probs, target[..., None], -1)))
  got = pe.metrics.Perplexity().update(preds=logits, target=jnp.asarray(target)).compute()
  assert float(got) == pytest.approx(reference, rel=1e-5)
  values = jnp.asarray(100 + rng.standard_normal(512), jnp.bfloat16)
  std = pe.metrics.Std().update(values=values).compute()
  assert float(std) == pytest.approx(
    np.std(np.asarray(values.astype(jnp.float32), np.float64)), rel=1e-5
  )


def test_two_prod_is_error_free_under_jit():
  rng = np.random.default_rng(3)
  a = (rng.standard_normal(1000) * 10.0 ** rng.uniform(-5, 5, 1000)).astype(np.float32)
  b = (rng.standard_normal(1000) * 10.0 ** rng.uniform(-5, 5, 1000)).astype(np.float32)
  product, error = jax.jit(two_prod)(a, b)
  exact = a.astype(np.float64) * b.astype(np.float64)  # exact: 48 significant bits
  np.testing.assert_array_equal(
    np.asarray(product, np.float64) + np.asarray(error, np.float64), exact
  )


@pytest.mark.parametrize("magnitude", [1e-30, 1e-36, 3e-38, 1e30])
def test_sum_psum_of_tiny_values_is_not_nan(magnitude):
  """Regression: the split quantum underflowed to 0 below ~1e-31: totals were NaN."""
  n = jax.local_device_count()
  parts = (magnitude * np.linspace(1.0, 2.0, n)).astype(np.float32)
  exact = math.fsum(parts.astype(np.float64))
  reduced = jax.pmap(lambda x: ExactSum.of(x).reduce(AXIS), axis_name=AXIS)(parts)
  assert float(reduced.to_numpy()[0]) == pytest.approx(exact, rel=1e-6)
  assert float(ExactSum.of(jnp.asarray(parts)).aggregate().to_numpy()) == pytest.approx(
    exact, rel=1e-6
  )


def test_merge_refuses_differently_configured_metrics():
  import padded_eval as pe

  with pytest.raises(ValueError, match="top_k=1 vs 3"):
    pe.metrics.Accuracy().merge(pe.metrics.Accuracy(top_k=3))
  renamed = pe.metrics.Accuracy(name="acc").map_arg(preds="logits")
  assert renamed.merge(pe.metrics.Accuracy()).name == "acc"


@pytest.mark.parametrize("shape", [(1,), (3,), (2, 3)])
def test_aggregate_of_stacked_array_totals_under_rank_promotion_raise(shape):
  """A stacked state whose totals are arrays (Moments' ``[dims]``, per-class sums) aggregates
  over its leading axis without an implicit rank promotion (the benchmark and demo subprocesses
  run with ``jax_numpy_rank_promotion="raise"``: ``[8, 1] - [1]`` raised there), and exactly."""
  with jax.numpy_rank_promotion("raise"):
    _check_stacked_array_totals(shape)


def _check_stacked_array_totals(shape):
  rng = np.random.default_rng(7)
  parts = rng.normal(size=(8, 5, *shape)) * 10.0 ** rng.integers(-6, 7, size=(8, 5, *shape))
  stacked = jax.tree.map(
    lambda *xs: jnp.stack(xs),
    *[ExactSum.of(jnp.asarray(p, jnp.float32)).merge(ExactSum.zeros(shape)) for p in parts.sum(1)],
  )
  total = stacked.aggregate().total()
  expected = parts.sum(1).astype(np.float32).astype(np.float64).sum(0)
  np.testing.assert_allclose(np.asarray(total, np.float64), expected, rtol=1e-6)
  stats = pe.metrics.Std().batch_updates(values=jnp.asarray(rng.normal(size=11), jnp.float32))
  stacked_std = jax.tree.map(lambda *xs: jnp.stack(xs), *[stats] * 8)
  np.testing.assert_allclose(
    float(stacked_std.aggregate().compute()), float(stats.compute()), rtol=1e-6
  )
