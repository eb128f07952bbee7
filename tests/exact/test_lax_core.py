"""The exact core written with ``lax`` (no ``jnp`` operators): the same numbers as the rules it
keeps, on random values of every magnitude, broadcast operands included.

* A batch's totals are normalized as one vector (`padded_eval.metrics.totals.batch_totals`): each
  element must come out bit for bit as if normalized alone.
* ``two_sum`` and ``ExactSum.merge`` take operands of different shapes or dtypes as ``jnp`` did
  (broadcast, promoted): ``two_sum`` stays error-free against numpy float64, and a merge with a
  scalar total equals the merge with that total broadcast.

Each runs compiled by ``jax.jit`` with the suite's options (fusion emitters off: conftest.py) and
with XLA's defaults, at the default optimisation level.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _xla_defaults import XLA_DEFAULTS
from hypothesis import given, settings
from hypothesis import strategies as st

from padded_eval.exact._floats import two_sum
from padded_eval.exact.accumulate import ExactSum

OPTIONS = {"suite": None, "xla_defaults": XLA_DEFAULTS}  # the suite's jax.jit (conftest.py)
SEEDS = st.integers(0, 2**32 - 1)


def _values(rng: np.random.Generator, n: int) -> np.ndarray:
  """float32 ``[n]``: magnitudes from 1e-38 to 1e38 (1e-25 and 1e18 among them), signs, zeros,
  inf and NaN."""
  exponents = rng.uniform(-38, 38, size=n)
  values = rng.choice([-1.0, 1.0], size=n) * 10.0**exponents
  special = rng.random(n)
  values[special < 0.08] = 0.0
  values[(special >= 0.08) & (special < 0.11)] = np.inf
  values[(special >= 0.11) & (special < 0.13)] = np.nan
  values[(special >= 0.13) & (special < 0.2)] = rng.choice([1e-25, 1e18, 1e6, -1e6], size=1)[0]
  return values.astype(np.float32)


def _normal(x) -> np.ndarray:
  """Where ``x`` is 0 or at least ``2**-90``: there the error terms stay normal floats (below,
  XLA's CPU backend flushes subnormal ones to 0, and float64 keeps them)."""
  x = np.abs(np.asarray(x, np.float64))
  return (x == 0) | (x >= 2.0**-90)


def _bits(tree) -> list[bytes]:
  return [np.asarray(leaf).tobytes() for leaf in jax.tree.leaves(tree)]


@pytest.mark.parametrize("options", sorted(OPTIONS))
@settings(max_examples=25, deadline=None)
@given(seed=SEEDS, n=st.integers(1, 9))
def test_totals_normalized_as_a_vector_equal_each_alone(options, seed, n):
  rng = np.random.default_rng(seed)
  hi = _values(rng, n)
  # an error term below half an ulp of hi, as a compensated sum leaves it (any sign)
  lo = (hi * rng.uniform(-(2.0**-25), 2.0**-25, size=n)).astype(np.float32)
  lo[~np.isfinite(lo)] = np.float32(np.nan)

  def vector(hi, lo):
    stacked = ExactSum.of_pair(hi, lo)
    return [stacked[i] for i in range(n)]

  def alone(hi, lo):
    return [ExactSum.of_pair(hi[i], lo[i]) for i in range(n)]

  compile_options = OPTIONS[options]
  got = jax.jit(vector, compiler_options=compile_options)(hi, lo)
  want = jax.jit(alone, compiler_options=compile_options)(hi, lo)
  assert _bits(got) == _bits(want)
  finite = np.isfinite(hi.astype(np.float64) + lo.astype(np.float64))
  finite &= _normal(hi)
  totals = np.array([float(total.total()) for total in got])
  expected = (hi.astype(np.float64) + lo.astype(np.float64)).astype(np.float32)
  np.testing.assert_array_equal(totals[finite], expected[finite])


@pytest.mark.parametrize("options", sorted(OPTIONS))
@settings(max_examples=25, deadline=None)
@given(seed=SEEDS, n=st.integers(1, 9))
def test_two_sum_of_broadcast_operands_is_error_free(options, seed, n):
  rng = np.random.default_rng(seed)
  a = rng.uniform(-1, 1, size=n).astype(np.float32) * np.float32(2.0 ** rng.integers(-60, 60))
  b = np.float32(rng.uniform(-1, 1) * 2.0 ** rng.integers(-60, 60))  # a scalar: broadcast
  s, e = jax.jit(two_sum, compiler_options=OPTIONS[options])(a, b)
  assert s.shape == e.shape == (n,) and s.dtype == e.dtype == jnp.float32
  exact = a.astype(np.float64) + np.float64(b)  # two float32s: their float64 sum is exact
  np.testing.assert_array_equal(np.asarray(s, np.float64) + np.asarray(e, np.float64), exact)
  np.testing.assert_array_equal(np.asarray(s), a + b)  # s is float32's rounded sum


@pytest.mark.parametrize("options", sorted(OPTIONS))
@settings(max_examples=20, deadline=None)
@given(seed=SEEDS, n=st.integers(1, 9))
def test_merge_with_a_scalar_total_equals_merge_with_it_broadcast(options, seed, n):
  rng = np.random.default_rng(seed)
  values, scalar = _values(rng, n), _values(rng, 1)[0]

  def merged(values, scalar):
    vector = ExactSum.of(values)
    return vector.merge(ExactSum.of(scalar)), vector.merge(ExactSum.of(jnp.full((n,), scalar)))

  got, want = jax.jit(merged, compiler_options=OPTIONS[options])(values, scalar)
  assert _bits(got) == _bits(want)
  finite = np.isfinite(values.astype(np.float64) + np.float64(scalar))
  finite &= _normal(values) & _normal(scalar)
  np.testing.assert_array_equal(
    np.asarray(got.total())[finite],
    (values.astype(np.float64) + np.float64(scalar)).astype(np.float32)[finite],
  )
