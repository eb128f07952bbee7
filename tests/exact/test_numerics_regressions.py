"""Regression tests of issue 12's numerical findings, against numpy float64 and scikit-learn.

Every dataset is fed in padded batches whose padding rows hold NaN, inf or huge garbage,
through jitted updates, and (where it says so) through ``pmap`` with ``reduce`` (psum) and
``aggregate``. References are float64 over the same float32 inputs.
"""

import ast
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _xla_defaults import XLA_DEFAULTS
from sklearn.metrics import r2_score

import padded_eval as pe
from padded_eval.exact._floats import (
  exact_product,
  int_parts,
  rounded_difference,
  two_prod,
  two_sum,
)
from padded_eval.exact.accumulate import ExactCount, ExactSum
from padded_eval.metrics.regression.moments import Moments

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
_OPTIONS = {  # XLA's defaults; the suite's jax.jit (fusion emitters off: conftest.py)
  "defaults": XLA_DEFAULTS,
  "suite": None,
}


@pytest.mark.parametrize("options", sorted(_OPTIONS))
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

  run = jax.jit(run, compiler_options=_OPTIONS[options])

  head, tail, x, y = (np.asarray(v, F64) for v in run(a, b, c))
  exact = x + y if transform == "two_sum" else x * y  # exact in float64 (<= 48 bits)
  assert np.all(np.isfinite(exact))
  np.testing.assert_array_equal(head + tail, exact)
  if transform == "two_sum":
    np.testing.assert_array_equal(head, (x.astype(np.float32) + y.astype(np.float32)))
  else:
    assert np.all(np.abs(tail) <= np.spacing(np.abs(head).astype(np.float32)))


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


# --- the accumulator API -----------------------------------------------------------------------


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


def test_exact_sum_keeps_inf_and_nan():
  """An overflowed batch sum stays inf through merges with larger totals (was NaN)."""
  big = ExactSum.of(np.float32(3e38)).merge(ExactSum.of(np.float32(3e38)))  # exponent 129
  assert float(big.merge(ExactSum.of(np.float32(np.inf))).total()) == np.inf
  assert float(ExactSum.of(np.float32(-np.inf)).merge(big).to_numpy()) == -np.inf
  assert np.isnan(float(big.merge(ExactSum.of(np.float32(np.nan))).total()))


def test_exact_sum_of_sum_ratio_and_of_product():
  values = np.array([3e38, 3e38, 1e38, np.nan], np.float32)
  total = ExactSum.of(values[0]).merge(ExactSum.of(values[1])).merge(ExactSum.of(values[2]))
  assert float(total.to_numpy()) == math.fsum(values[:3].astype(F64))
  assert not np.isfinite(float(total.total()))  # 7e38 does not fit float32 ...
  assert _relative(total.ratio(3.0), 7e38 / 3) <= 1e-6  # ... its mean does
  real = np.array([True, True, True, False])
  squares = ExactSum.of_sum(values, where=real, power=2)
  assert _relative(squares.to_numpy(), math.fsum(values[:3].astype(F64) ** 2)) <= 1e-6
  squares = ExactSum.of_sum(np.float32([1e-30, 2e-30]), power=2)
  assert _relative(squares.to_numpy(), 5e-60) <= 1e-6
  assert _relative(squares.ratio(2.0, sqrt=True), math.sqrt(2.5e-60)) <= 1e-6
  a, b = np.float32(1.0000001e30), np.float32(3.0000003e30)
  assert float(ExactSum.of_product(a, b).to_numpy()) == F64(a) * F64(b)  # exact, ~3e60


def test_accumulators_expose_totals_the_same_way():
  counts = ExactCount.of(jnp.array([[3, 0, 2**30 + 5]], jnp.int32)).merge(
    ExactCount.of(jnp.array([[1, 7, 2**31 - 1]], jnp.int32))
  )
  exact_counts = np.array([[4, 7, 2**30 + 5 + 2**31 - 1]])
  sums = ExactSum.of(jnp.array([1.5, -2.0, 0.0]))
  for acc, exact in ((counts, exact_counts), (sums, np.array([1.5, -2.0, 0.0]))):
    np.testing.assert_array_equal(acc.to_numpy(), exact)
    np.testing.assert_allclose(np.asarray(acc.total(), F64), exact, rtol=1e-7)
    assert acc.total().dtype == jnp.float32
  suffix = np.cumsum(exact_counts[..., ::-1], -1)[..., ::-1]
  np.testing.assert_allclose(counts.suffix_totals(), suffix, rtol=1e-7)
  np.testing.assert_allclose(
    counts.suffix_totals(inclusive=False), suffix - exact_counts, rtol=1e-7
  )


@pytest.mark.parametrize("options", sorted(_OPTIONS))
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

  run = jax.jit(run, compiler_options=_OPTIONS[options])
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


@pytest.mark.parametrize("options", sorted(_OPTIONS))
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

  run = jax.jit(run, compiler_options=_OPTIONS[options])
  hi, lo, hi_y, lo_y, y = (np.asarray(v) for v in run(x))
  for h, low, ints in ((hi, lo, x), (hi_y, lo_y, y)):
    assert h.dtype == low.dtype == np.float32
    np.testing.assert_array_equal(h.astype(F64) + low.astype(F64), ints.astype(F64))
    assert np.all((low >= 0) & (low < 4096)) and np.all(np.mod(h.astype(F64), 4096) == 0)


@pytest.mark.parametrize("options", sorted(_OPTIONS))
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

  run = jax.jit(run, compiler_options=_OPTIONS[options])
  exact = a.astype(F64) - b.astype(F64)
  for got in run(a, b):
    got = np.asarray(got)
    assert got.dtype == np.float32
    if dtypes[0] == "float32":
      ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(F64)
      assert np.all(np.abs(got.astype(F64) - exact) <= ulp)
    else:
      np.testing.assert_array_equal(got, exact.astype(np.float32))


def test_weighted_means_share_the_public_base():
  base = pe.metrics.averages.WeightedMean
  for metric in ("Mean", "MSE", "MAE", "RMSE", "Perplexity"):
    assert issubclass(getattr(pe.metrics, metric), base), metric


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
