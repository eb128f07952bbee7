"""The exact accumulators (`padded_eval.exact.accumulate`) against exact integer / float64 references.

Unit tests; ``Accumulator.segment_sum`` (the exact sums behind Sliced); and the scale tests of
DESIGN.md "Exactness" (marked slow): 2**31+ counts and sums, 2**25 updates, stable Std, with inputs
generated on the device inside jitted loops (nothing of size 2**31 is materialised) and references
exact (closed forms in Python integers) or float64 numpy over the same float32 inputs.
"""

import math
from fractions import Fraction

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


# --- the accumulator API (issue 12) -----------------------------------------------------------------


def test_exact_sum_keeps_inf_and_nan():
  """An overflowed batch sum stays inf through merges with larger totals (was NaN)."""
  big = ExactSum.of(np.float32(3e38)).merge(ExactSum.of(np.float32(3e38)))  # exponent 129
  assert float(big.merge(ExactSum.of(np.float32(np.inf))).total()) == np.inf
  assert float(ExactSum.of(np.float32(-np.inf)).merge(big).to_numpy()) == -np.inf
  assert np.isnan(float(big.merge(ExactSum.of(np.float32(np.nan))).total()))


def test_exact_sum_of_sum_ratio_and_of_product():
  values = np.array([3e38, 3e38, 1e38, np.nan], np.float32)
  total = ExactSum.of(values[0]).merge(ExactSum.of(values[1])).merge(ExactSum.of(values[2]))
  assert float(total.to_numpy()) == math.fsum(values[:3].astype(np.float64))
  assert not np.isfinite(float(total.total()))  # 7e38 does not fit float32 ...
  np.testing.assert_allclose(float(total.ratio(3.0)), 7e38 / 3, rtol=1e-6)  # ... its mean does
  real = np.array([True, True, True, False])
  squares = ExactSum.of_sum(values, where=real, power=2)
  np.testing.assert_allclose(
    float(squares.to_numpy()), math.fsum(values[:3].astype(np.float64) ** 2), rtol=1e-6
  )
  squares = ExactSum.of_sum(np.float32([1e-30, 2e-30]), power=2)
  np.testing.assert_allclose(float(squares.to_numpy()), 5e-60, rtol=1e-6)
  np.testing.assert_allclose(float(squares.ratio(2.0, sqrt=True)), math.sqrt(2.5e-60), rtol=1e-6)
  a, b = np.float32(1.0000001e30), np.float32(3.0000003e30)
  exact = np.float64(a) * np.float64(b)  # ~3e60, exact in float64
  assert float(ExactSum.of_product(a, b).to_numpy()) == exact


def test_accumulators_expose_totals_the_same_way():
  counts = ExactCount.of(jnp.array([[3, 0, 2**30 + 5]], jnp.int32)).merge(
    ExactCount.of(jnp.array([[1, 7, 2**31 - 1]], jnp.int32))
  )
  exact_counts = np.array([[4, 7, 2**30 + 5 + 2**31 - 1]])
  sums = ExactSum.of(jnp.array([1.5, -2.0, 0.0]))
  for acc, exact in ((counts, exact_counts), (sums, np.array([1.5, -2.0, 0.0]))):
    np.testing.assert_array_equal(acc.to_numpy(), exact)
    np.testing.assert_allclose(np.asarray(acc.total(), np.float64), exact, rtol=1e-7)
    assert acc.total().dtype == jnp.float32
  suffix = np.cumsum(exact_counts[..., ::-1], -1)[..., ::-1]
  np.testing.assert_allclose(counts.suffix_totals(), suffix, rtol=1e-7)
  np.testing.assert_allclose(
    counts.suffix_totals(inclusive=False), suffix - exact_counts, rtol=1e-7
  )


# --- segment_sum --------------------------------------------------------------------------------


def test_exact_sum_segments_equal_float64_and_drop_out_of_range_ids():
  rng = np.random.default_rng(0)
  values = rng.normal(size=(301, 3)).astype(np.float32) * np.float32(10.0) ** rng.integers(
    -6, 6, (301, 1)
  )
  ids = rng.integers(-2, 9, 301)  # 7 segments; -2, -1, 7 and 8 are dropped; segment 6 rare
  summed = ExactSum.of(values).segment_sum(ids, 7).to_numpy()
  expected = np.zeros((7, 3))
  for s in range(7):
    expected[s] = values[ids == s].astype(np.float64).sum(0)
  # The combination of aggregate (a psum's): high parts exact, low parts summed in float32, so
  # within a float32 plain sum's bound of the largest part; equal to aggregate per segment.
  scale = np.abs(values.astype(np.float64)).max()
  np.testing.assert_allclose(summed, expected, rtol=0, atol=scale * len(values) * 2**-24)
  for s in range(7):
    alone = ExactSum.of(values[ids == s]).aggregate().to_numpy()
    np.testing.assert_allclose(summed[s], alone, rtol=1e-7)
  empty = ExactSum.of(values[:0]).segment_sum(ids[:0], 3)
  np.testing.assert_array_equal(empty.to_numpy(), np.zeros((3, 3)))


def test_exact_count_segments_are_exact_beyond_int32():
  rng = np.random.default_rng(1)
  counts = rng.integers(0, 2**31 - 1, 40_000)
  ids = rng.integers(0, 5, 40_000)
  summed = ExactCount.of(counts).segment_sum(ids, 5).to_numpy()
  np.testing.assert_array_equal(
    summed, np.bincount(ids, None, 5) * 0 + [counts[ids == s].sum() for s in range(5)]
  )


# --- at scale (slow) ----------------------------------------------------------------------------
BATCH = 1 << 20
PERIOD = 1021  # values 1 + (g mod PERIOD) / 1024 of the global element index g: exact in float32


def _batch_values(step, batch=BATCH):
  """Batch ``step``: ``[batch]`` float32 values and the mask dropping its last ``step % 3``."""
  index = jax.lax.iota(jnp.int32, batch)
  residue = (step * (batch % PERIOD) + index) % PERIOD  # == (step * batch + index) % PERIOD
  values = 1.0 + residue.astype(jnp.float32) * (1.0 / 1024)
  mask = index < batch - step % 3
  return jnp.where(mask, values, jnp.nan), mask


def _residue_sum(start: int, length: int) -> int:
  """``sum((start + t) % PERIOD for t in range(length))`` in closed form."""
  periods, rest = divmod(length, PERIOD)
  total = periods * PERIOD * (PERIOD - 1) // 2
  first = start % PERIOD
  head = min(rest, PERIOD - first)
  total += (first + first + head - 1) * head // 2
  tail = rest - head
  return total + (tail - 1) * tail // 2


@pytest.mark.slow
def test_mean_and_count_over_2_31_values_are_exact():
  steps = (1 << 11) + 2  # 2**31 + 2**21 elements, minus the masked ones

  @jax.jit
  def run():
    def body(step, carry):
      mean, count = carry
      values, mask = _batch_values(step)
      count = count.merge(ExactCount.of(jnp.sum(mask, dtype=jnp.int32)))
      return mean.update(values=values, mask=mask), count

    return jax.lax.fori_loop(0, steps, body, (pe.metrics.Mean(), ExactCount.zeros()))

  mean, count = run()
  lengths = [BATCH - step % 3 for step in range(steps)]
  exact_count = sum(lengths)
  exact_total = sum(
    Fraction(length) + Fraction(_residue_sum(step * BATCH, length), 1024)
    for step, length in enumerate(lengths)
  )
  assert exact_count > 2**31
  assert int(count.to_numpy()) == exact_count
  assert float(mean.weight.to_numpy()) == exact_count
  reference = float(exact_total / exact_count)
  assert abs(float(mean.total.to_numpy()) / exact_count - reference) <= 1e-6 * reference
  assert abs(float(mean.compute()) - reference) <= 1e-6 * reference


@pytest.mark.slow
def test_one_element_updates_past_2_24_do_not_saturate():
  steps = (1 << 24) + 4  # a float32 count or total stops at 2**24: 1 is below its spacing there

  @jax.jit
  def run():
    def body(step, metrics):
      mean, accuracy = metrics
      value = jnp.reshape(0.5 + (step % 2).astype(jnp.float32), (1,))  # 0.5, 1.5, 0.5, ...
      hit = jnp.reshape(step % 4 != 0, (1,)).astype(jnp.int32)  # 3 of every 4
      return mean.update(values=value), accuracy.update(preds=hit, target=jnp.ones(1, jnp.int32))

    return jax.lax.fori_loop(0, steps, body, (pe.metrics.Mean(), pe.metrics.Accuracy()))

  mean, accuracy = run()
  assert float(mean.weight.to_numpy()) == steps  # a float32 count would stop at 2**24
  assert float(mean.total.to_numpy()) == steps  # sum of steps/2 pairs 0.5 + 1.5
  assert float(mean.compute()) == 1.0
  assert float(accuracy.correct.to_numpy()) == 3 * steps // 4
  assert float(accuracy.compute()) == 0.75


def _normal_batch(key, index, size):
  """1e4 + N(0, 1) float32 values (NaN where masked out) and a ~90% mask."""
  value_key, mask_key = jax.random.split(jax.random.fold_in(key, index))
  values = 1e4 + jax.random.normal(value_key, (size,), jnp.float32)
  mask = jax.random.uniform(mask_key, (size,)) < 0.9
  return jnp.where(mask, values, jnp.nan), mask


def _host_std(indices, size):
  key = jax.random.key(0)
  values, mask = jax.jit(lambda i: jax.lax.map(lambda j: _normal_batch(key, j, size), i))(
    jnp.asarray(indices)
  )
  values, mask = np.asarray(values), np.asarray(mask)
  return np.std(values[mask].astype(np.float64))


@pytest.mark.slow
def test_std_mean_1e4_many_steps_single_device():
  steps, size = 2000, 256

  @jax.jit
  def run():
    key = jax.random.key(0)

    def body(step, std):
      values, mask = _normal_batch(key, step, size)
      return std.update(values=values, mask=mask)

    return jax.lax.fori_loop(0, steps, body, pe.metrics.Std())

  reference = _host_std(np.arange(steps), size)
  assert abs(float(run().compute()) - reference) <= 1e-3 * reference


@pytest.mark.slow
def test_std_mean_1e4_many_steps_across_8_devices():
  n, steps, size = jax.local_device_count(), 250, 256
  assert n == 8

  def per_device(device):
    key = jax.random.key(0)

    def body(step, std):
      values, mask = _normal_batch(key, device * steps + step, size)
      return std.update(values=values, mask=mask)

    local = jax.lax.fori_loop(0, steps, body, pe.metrics.Std())
    return local.reduce(AXIS), local

  reduced, local = jax.pmap(per_device, axis_name=AXIS)(jnp.arange(n))
  reference = _host_std(np.arange(n * steps), size)
  for device in range(n):
    got = float(jax.tree.map(lambda x: x[device], reduced).compute())
    assert abs(got - reference) <= 1e-3 * reference
  assert abs(float(local.aggregate().compute()) - reference) <= 1e-3 * reference
