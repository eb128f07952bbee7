"""Scale tests of DESIGN.md "Exactness": 2**31+ counts and sums, 2**25 updates, stable Std.

Inputs are generated on the device inside jitted loops (nothing of size 2**31 is
materialised); references are exact (closed forms in Python integers) or float64
numpy over the same float32 inputs.
"""

from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import padded_eval as pe
from padded_eval.exact.accumulate import ExactCount

pytestmark = pytest.mark.slow

AXIS = "devices"
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
