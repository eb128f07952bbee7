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

import ast
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _xla_defaults import XLA_DEFAULTS
from hypothesis import given, settings
from hypothesis import strategies as st

import padded_eval as pe
from padded_eval.exact._floats import (
  exact_product,
  int_parts,
  rounded_difference,
  two_prod,
  two_sum,
)
from padded_eval.exact.accumulate import ExactSum

OPTIONS = {"suite": None, "xla_defaults": XLA_DEFAULTS}  # the suite's jax.jit (conftest.py)
F64 = np.float64
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


# --- error-free transformations under XLA's default optimisation level -----------------


def _random_floats(rng, n, spread=8):
  """float32 values of random sign, magnitude 10**[-spread, spread] and random mantissa bits."""
  mantissa = rng.integers(0, 1 << 23, n).astype(np.int32)
  values = (mantissa | (127 << 23)).view(np.float32).astype(F64)  # [1, 2), all bit patterns
  values *= 10.0 ** rng.uniform(-spread, spread, n) * rng.choice([-1.0, 1.0], n)
  return values.astype(np.float32)


# Where the operands come from, in the same jitted program as the transformation.
_CONTEXTS = {
  "operands": lambda a, b, c: (a, b),
  "sums_in": lambda a, b, c: (a + c, b - c),
  "powers_of_two_in": lambda a, b, c: (a * 0.25, b * 1024.0),
  "reductions_in": lambda a, b, c: (jnp.sum(a.reshape(-1, 2), 1), jnp.max(b.reshape(-1, 2), 1)),
  # Inexact products and a quotient (XLA makes it a reciprocal multiply): two_prod reads
  # its operands' bits, so a fused FMA cannot hand it an unrounded value. two_sum's
  # contract excludes these (see its docstring).
  "products_in": lambda a, b, c: (a * c, b * c),
  "quotient_in": lambda a, b, c: (a / c[0], jnp.broadcast_to(c[0], a.shape)),
}
_TWO_SUM_CONTEXTS = ("operands", "sums_in", "powers_of_two_in", "reductions_in")


@pytest.mark.parametrize("options", sorted(OPTIONS))
@pytest.mark.parametrize(
  "transform, context",
  [("two_sum", c) for c in _TWO_SUM_CONTEXTS] + [("two_prod", c) for c in sorted(_CONTEXTS)],
)
def test_error_free_transformations_under_jit(transform, context, options):
  """``a + b == s + e`` / ``a * b == p + e`` exactly in float64, at default optimisation.

  The operands are computed in the same program as the transformation, so that XLA may
  fuse their producers into it; the operands it was given are returned from the same
  program (as the rounded values they are) and the identity is checked on them. Compiled
  by ``jax.jit`` at XLA's defaults, and with the suite's fusion emitters off (conftest.py).
  """
  rng = np.random.default_rng(sorted(_CONTEXTS).index(context) + 10 * (transform == "two_sum"))
  n = 50_000
  a, b = _random_floats(rng, n, 6), _random_floats(rng, n, 6)
  c = (1.0 + rng.random(n)).astype(np.float32)
  fn = {"two_sum": two_sum, "two_prod": two_prod}[transform]

  def run(a, b, c):
    x, y = _CONTEXTS[context](a, b, c)
    head, tail = fn(x, y)
    return head, tail, x, y

  run = jax.jit(run, compiler_options=OPTIONS[options])

  head, tail, x, y = (np.asarray(v, F64) for v in run(a, b, c))
  exact = x + y if transform == "two_sum" else x * y  # exact in float64 (<= 48 bits)
  assert np.all(np.isfinite(exact))
  np.testing.assert_array_equal(head + tail, exact)
  if transform == "two_sum":
    np.testing.assert_array_equal(head, (x.astype(np.float32) + y.astype(np.float32)))
  else:
    assert np.all(np.abs(tail) <= np.spacing(np.abs(head).astype(np.float32)))


# --- exact sums of scaled values --------------------------------------------------------------


def test_exact_sum_scaling_by_powers_of_two_is_bit_for_bit():
  """Totals of ``x * 2**k`` are exactly ``2**k`` times the totals of ``x`` (no drift from scaling)."""
  rng = np.random.default_rng(8)
  values = _random_floats(rng, 4000, 3)
  scan = jax.jit(
    lambda xs: jax.lax.scan(lambda t, x: (t.merge(ExactSum.of(x)), None), ExactSum.zeros(4), xs)[0]
  )
  base = scan(values.reshape(-1, 4)).to_numpy()
  for k in (-100, -20, 20, 60):
    scaled = np.ldexp(values.astype(F64), k).astype(np.float32)
    np.testing.assert_array_equal(scan(scaled.reshape(-1, 4)).to_numpy(), np.ldexp(base, k))


@pytest.mark.parametrize("options", sorted(OPTIONS))
@pytest.mark.parametrize("context", sorted(_CONTEXTS))
def test_exact_product_under_jit(context, options):
  """``hi + lo == a * b`` exactly in float64 and ``hi`` numpy's rounded float32 product, for
  operands from 1e-20 to 1e20 (products beyond float32's range both ways): where the product
  overflows, ``hi`` is inf and ``lo`` 0; below ``2**-78`` the error may fall under float32's
  normal range and be flushed: ``hi + lo`` is then within ``2**-126`` of the product. Operands computed in the same program, compiled at XLA's defaults and with the
  suite's options (see `test_error_free_transformations_under_jit`)."""
  rng = np.random.default_rng(100 + sorted(_CONTEXTS).index(context))
  n = 50_000
  a, b = _random_floats(rng, n, 20), _random_floats(rng, n, 20)
  c = (1.0 + rng.random(n)).astype(np.float32)

  def run(a, b, c):
    x, y = _CONTEXTS[context](a, b, c)
    return (*exact_product(x, y), x, y)

  run = jax.jit(run, compiler_options=OPTIONS[options])
  hi, lo, x, y = (np.asarray(v, F64) for v in run(a, b, c))
  exact = x * y  # exact in float64 (48 bits, exponents within float64's range)
  with np.errstate(over="ignore", under="ignore"):
    rounded = (x.astype(np.float32) * y.astype(np.float32)).astype(F64)
  normal = np.abs(exact) >= 2.0**-78
  finite = np.isfinite(rounded)
  both = normal & finite
  assert both.sum() > len(exact) // 2  # (the reductions context halves the operands)
  np.testing.assert_array_equal(hi[both] + lo[both], exact[both])
  np.testing.assert_array_equal(hi[both], rounded[both])
  assert np.all(np.abs(lo[both]) <= np.spacing(np.abs(hi[both]).astype(np.float32)) / 2)
  np.testing.assert_array_equal(hi[~finite], rounded[~finite])
  np.testing.assert_array_equal(lo[~finite], 0.0)
  tiny = ~normal
  assert np.all(np.abs(hi[tiny] + lo[tiny] - exact[tiny]) <= 2.0**-126)


@pytest.mark.parametrize("options", sorted(OPTIONS))
@pytest.mark.parametrize("dtype", ("int32", "uint32"))
def test_int_parts_are_exact_under_jit(dtype, options):
  """``hi + lo`` equals the integer (float64), both parts exact in float32, ``0 <= lo < 4096``,
  over the dtype's whole range (its extremes included) and for integers computed in the same
  program, compiled at XLA's defaults and with the suite's options."""
  info = np.iinfo(dtype)
  rng = np.random.default_rng(7)
  x = rng.integers(info.min, int(info.max) + 1, 20_000, dtype=np.int64)
  x[:6] = [info.min, info.max, info.max - 1, 0, 2**24 + 1, 4095]
  x = x.astype(dtype)

  def run(x):
    y = x // 3 + x // 2  # computed here: no constant folding of the parts
    return (*int_parts(x), *int_parts(y), y)

  run = jax.jit(run, compiler_options=OPTIONS[options])
  hi, lo, hi_y, lo_y, y = (np.asarray(v) for v in run(x))
  for h, low, ints in ((hi, lo, x), (hi_y, lo_y, y)):
    assert h.dtype == low.dtype == np.float32
    np.testing.assert_array_equal(h.astype(F64) + low.astype(F64), ints.astype(F64))
    assert np.all((low >= 0) & (low < 4096)) and np.all(np.mod(h.astype(F64), 4096) == 0)


@pytest.mark.parametrize("options", sorted(OPTIONS))
@pytest.mark.parametrize("dtypes", (("int32", "int32"), ("uint32", "uint32"), ("float32", "int32")))
def test_rounded_difference_is_the_exact_difference_rounded_once_under_jit(dtypes, options):
  """``rounded_difference(a, b)`` is ``a - b`` (exact in float64 for these ranges) rounded once
  to float32, for int32 / uint32 pairs over their whole range and integers computed in the same
  program (XLA may not reassociate its error-free sum); within one unit in the last place for a
  float32 ``a`` against an int32 ``b``."""
  rng = np.random.default_rng(11)

  def draw(dtype):
    info = np.iinfo(dtype) if dtype != "float32" else np.iinfo("int32")
    x = rng.integers(info.min, int(info.max) + 1, 20_000, dtype=np.int64)
    x[:4] = [info.min, info.max, 2**24 + 1, 2**24]
    return x.astype(dtype)

  a, b = draw(dtypes[0]), draw(dtypes[1])
  b[4000:] = (
    (a[4000:].astype(np.int64) + rng.integers(-99, 100, 16_000))
    .clip(*(lambda i: (i.min, i.max))(np.iinfo(dtypes[1])))
    .astype(dtypes[1])
  )  # mostly near-equal pairs: the differences cancel

  def run(a, b):
    computed = b // 2 + b // 2 + b % 2  # b again, computed here: no constant folding
    return rounded_difference(a, b), rounded_difference(a, computed)

  run = jax.jit(run, compiler_options=OPTIONS[options])
  exact = a.astype(F64) - b.astype(F64)
  for got in run(a, b):
    got = np.asarray(got)
    assert got.dtype == np.float32
    if dtypes[0] == "float32":
      ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(F64)
      assert np.all(np.abs(got.astype(F64) - exact) <= ulp)
    else:
      np.testing.assert_array_equal(got, exact.astype(np.float32))


def test_numerics_modules_import_no_private_name_from_another_module():
  root = pathlib.Path(pe.__file__).parent
  for path in (
    "exact/accumulate.py",
    "exact/_floats.py",
    "metrics/regression/moments.py",
    "metrics/averages.py",
    "metrics/text/perplexity.py",
  ):
    tree = ast.parse((root / path).read_text())
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("padded_eval"):
        private = [a.name for a in node.names if a.name.startswith("_")]
        assert not private, f"{path} imports {private} from {node.module}"
