"""float32 arithmetic that stays exact under XLA: error-free transformations, power-of-two scaling.

Error-free transformations and XLA: at its default optimisation level XLA contracts a
multiply feeding an add into one FMA, which uses the *unrounded* product. An error term
that refers to the rounded product is then wrong (this made PearsonCorrelation depend
on the batch size far from zero: ``x - total * (1/n)`` was fused, the shift's product
was not). So here every multiplication that feeds an error-free transformation is
exact -- a power of two (:func:`ldexp`) or a partial product of operands split from
their bits (:func:`two_prod`) -- and contracting it changes nothing. An
``optimization_barrier`` does not prevent the contraction on CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# The exponent of zero: below every real one, so a zero never sets a common scale.
ZERO_EXPONENT = -(1 << 20)


def select(condition, on_true, on_false):
  """``jnp.where(condition, on_true, on_false)`` for the exact core, as one ``select``.

  ``jnp.where`` is a jitted function: every call is a nested ``jit`` that is traced and lowered
  on its own (the exact sums of one step called it some sixty times, a good part of the
  step's tracing and lowering). Here a Python scalar takes the array operand's dtype and
  every operand is broadcast to the common shape, without type promotion: the operands
  that are arrays must share one dtype.
  """
  if hasattr(condition, "dtype") and condition.dtype != jnp.bool_:
    condition = condition.astype(jnp.bool_)
  arrays = [x for x in (on_true, on_false) if hasattr(x, "dtype")]
  dtype = arrays[0].dtype if arrays else jnp.result_type(on_true, on_false)
  shape = np.broadcast_shapes(np.shape(condition), np.shape(on_true), np.shape(on_false))
  return lax.select(
    _broadcast(condition, shape, jnp.bool_),
    _broadcast(on_true, shape, dtype),
    _broadcast(on_false, shape, dtype),
  )


def _broadcast(x, shape: tuple, dtype):
  """``x`` (an array of ``dtype`` or a Python scalar) as an array of ``shape``."""
  if not hasattr(x, "dtype"):
    return lax.full(shape, x, dtype)
  if x.dtype != dtype:
    raise TypeError(f"select: operands of dtypes {x.dtype} and {dtype}")
  if np.shape(x) == shape:
    return x
  return lax.broadcast_in_dim(x, shape, tuple(range(len(shape) - np.ndim(x), len(shape))))


def clamp(x, low: int, high: int):
  """``jnp.clip(x, low, high)`` for int32 ``x`` and Python int bounds, as one ``clamp``
  (``jnp.clip`` is a nested ``jit``, see :func:`select`)."""
  return lax.clamp(np.int32(low), x, np.int32(high))


def two_sum(a, b):
  """Error-free sum (Knuth): ``(s, e)`` with ``s = fl(a + b)`` and ``a + b = s + e`` exactly.

  Additions only, so it holds under ``jax.jit`` at XLA's default optimisation level for
  operands that are rounded values: inputs, results of reductions or additions, or exact
  products (powers of two, :func:`two_prod`'s pieces). An *inexact* product computed in
  the same program may be fused into the addition as an FMA (the backends contract a
  multiply feeding an add), and ``a`` would then not be the value ``s`` was rounded from.
  """
  a, b = lax_operands(a, b)
  s = lax.add(a, b)
  b_virtual = lax.sub(s, a)
  a_virtual = lax.sub(s, b_virtual)
  return s, lax.add(lax.sub(a, a_virtual), lax.sub(b, b_virtual))


def lax_operands(a, b):
  """``a`` and ``b`` as arrays of one shape and dtype, for ``lax``'s arithmetic.

  The exact core's arithmetic is ``lax``'s, not ``jnp``'s operators: each ``jnp`` operator is a
  nested ``jit``, traced on its own for every new combination of shapes (a step's exact sums
  traced some hundred of them, about a third of its tracing). Operands that differ in shape
  or dtype are broadcast and promoted as ``jnp`` would.
  """
  a, b = jnp.asarray(a), jnp.asarray(b)
  if a.shape == b.shape and a.dtype == b.dtype:
    return a, b
  dtype = jnp.result_type(a, b)
  return jnp.broadcast_arrays(a.astype(dtype), b.astype(dtype))


def _add_pairs(first, second):
  """The combiner of :func:`compensated_sum`: two ``(sum, error)`` pairs added error-free."""
  (a, a_error), (b, b_error) = first, second
  total, error = two_sum(a, b)
  return total, error + (a_error + b_error)


def compensated_sum(x, axis=None, keepdims: bool = False):
  """``(hi, lo)``: the float32 sum of ``x`` over ``axis`` as an unevaluated pair.

  One variadic reduction whose combiner is :func:`two_sum` (additions only, so XLA cannot
  contract it into an FMA, and it is error-free in whatever order XLA combines the
  elements, across devices included): ``hi + lo`` is the sum with an error of about
  ``n * 2**-48 * sum |x|`` (the rounding of the summed error terms) instead of a plain
  float32 sum's ``log2(n) * 2**-24 * sum |x|``. With inf or NaN in ``x``, ``hi`` is the
  plain sum's inf or NaN (``lo`` then is NaN; :class:`~padded_eval.exact.accumulate.ExactSum`
  ignores it).

  Args:
    x: float32 array ``[...]``.
    axis: None (all axes), an int or a tuple of ints.
    keepdims: keep the summed axes with size 1.

  Returns:
    Two float32 arrays of the reduced shape.
  """
  x = jnp.asarray(x, jnp.float32)
  if axis is None:
    axes = tuple(range(x.ndim))
  else:
    axes = tuple(sorted(a % x.ndim for a in ((axis,) if isinstance(axis, int) else axis)))
  zero = jnp.zeros((), jnp.float32)
  hi, lo = jax.lax.reduce((x, jnp.zeros_like(x)), (zero, zero), _add_pairs, axes)
  if keepdims:
    hi, lo = jnp.expand_dims(hi, axes), jnp.expand_dims(lo, axes)
  return hi, lo


def compensated_suffix_sums(hi, lo=None):
  """``(hi, lo)``: the suffix sums ``sum_{j >= k} (hi + lo)[..., j]`` along the last axis,
  each an unevaluated float32 pair.

  One associative scan whose combiner is :func:`two_sum` (additions only, as in
  :func:`compensated_sum`): each suffix sum is within about ``n * 2**-48 * sum |x|`` of the
  exact one, where a float32 ``cumsum`` may be ``n * 2**-24`` off.

  Args:
    hi, lo: float32 arrays ``[..., n]`` (``lo`` None: zeros), the values as pairs.

  Returns:
    Two float32 arrays ``[..., n]``.
  """
  hi = jnp.asarray(hi, jnp.float32)
  lo = jnp.zeros_like(hi) if lo is None else jnp.asarray(lo, jnp.float32)
  return jax.lax.associative_scan(_add_pairs, (hi, lo), reverse=True, axis=hi.ndim - 1)


def _split(x):
  """``x = hi + lo`` exactly, read from ``x``'s bits (no float arithmetic on ``x``).

  ``hi`` is ``x`` rounded to 12 significant bits; ``lo = x - hi`` is at most ``2**11``
  units in the last place of ``x``, formed as (int units) * (power of two): exact.
  ``lo`` is 0 (and the split inexact) for ``|x| < 2**-103``.
  """
  bits = jax.lax.bitcast_convert_type(x, jnp.int32)
  hi = jax.lax.bitcast_convert_type((bits + 0x800) & jnp.int32(-0x1000), jnp.float32)
  low_bits = bits & 0xFFF
  units = low_bits - ((low_bits & 0x800) << 1)  # in [-2048, 2047] ulps: x - hi
  field = (bits >> 23) & 0xFF
  ulp = select(field > 23, _power_of_two(field - 150), 0.0)
  sign = select(bits < 0, -1.0, 1.0)
  return hi, sign * units.astype(jnp.float32) * ulp


def two_prod(a, b):
  """Error-free product: ``(p, e)`` with ``p + e = a * b`` exactly and ``|e| <= ulp(p)``.

  The operands are split from their bits (:func:`_split`) into 12-bit halves, so the four
  partial products are exact, and they are added with :func:`two_sum`. Every float
  multiplication is exact, so XLA fusing it into an FMA cannot change anything, and the
  operands' bits are the rounded values whatever computed them: this holds under
  ``jax.jit`` at the default optimisation level for any operands with
  ``2**-100 < |a|, |b|`` whose product and error stay in float32's normal range (callers
  pass mantissas in ``[0.5, 1)``, see :meth:`ExactSum.of_product`).
  """
  a_hi, a_lo = _split(jnp.asarray(a, jnp.float32))
  b_hi, b_lo = _split(jnp.asarray(b, jnp.float32))
  middle, middle_error = two_sum(a_hi * b_lo, a_lo * b_hi)
  product, product_error = two_sum(a_hi * b_hi, middle)
  # The rest is a multiple of ulp(a) ulp(b) below 2**24 of them: these additions are exact.
  return product, (product_error + middle_error) + a_lo * b_lo


def exact_product(a, b):
  """``(hi, lo)`` with ``hi + lo = a * b`` exactly, ``hi`` the rounded float32 product.

  The mantissas of ``a`` and ``b`` (:func:`frexp`) are multiplied by :func:`two_prod`, its two
  terms renormalized by :func:`two_sum` (so that ``hi`` is the product rounded to nearest, as
  ``a * b`` gives it, and ``|lo|`` at most half its spacing), and both scaled back by powers of
  two. Every multiplication is exact, so XLA contracting one into an FMA changes nothing, as it
  would for a plain ``a * b`` feeding an add (the rounded product then never formed). Where ``a * b`` is not finite: ``(a * b, 0)``. Below ``2**-78`` the error
  may fall under float32's normal range, where the backend's flushing of subnormals applies
  (XLA's CPU backend flushes them: ``hi + lo`` is then within ``2**-126`` of the product).

  Args:
    a: float32 array.
    b: float32 array of ``a``'s shape.

  Returns:
    ``(hi, lo)``, float32 of ``a``'s shape.
  """
  a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
  (a_mantissa, a_exponent), (b_mantissa, b_exponent) = frexp(a), frexp(b)
  product, error = two_sum(*two_prod(a_mantissa, b_mantissa))  # the rounded product, its error
  k = lax.add(a_exponent, b_exponent)
  plain = lax.mul(a, b)  # only where it is not finite (inf, NaN): no add reads it
  finite = lax.is_finite(plain)
  return select(finite, ldexp(product, k), plain), select(finite, ldexp(error, k), 0.0)


def int_parts(x):
  """float32 ``(hi, lo)`` with ``hi + lo = x`` exactly, for an int32 or uint32 array ``x``.

  float32 holds integers up to ``2**24`` exactly; ``x`` may need 32 bits. ``hi`` keeps the bits
  above the lowest 12 (at most 20 significant bits, a multiple of ``2**12``), ``lo`` the lowest
  12 (``0 <= lo < 4096``): both convert exactly, and summed apart they keep every digit.

  Args:
    x: int32 or uint32 array.

  Returns:
    ``(hi, lo)``, float32 of ``x``'s shape.
  """
  x = jnp.asarray(x)
  low = lax.bitwise_and(x, np.array(4095, x.dtype))
  return lax.convert_element_type(lax.sub(x, low), jnp.float32), lax.convert_element_type(
    low, jnp.float32
  )


def rounded_difference(a, b):
  """float32 ``a - b`` rounded once from the exact difference, for int32/uint32 or float arrays.

  float32 holds integers up to ``2**24`` exactly: converting int32 values beyond it before
  subtracting rounds each (``16777217 - 16777216`` would read 0). Integer operands are split by
  `int_parts`; the high parts' difference is exact (a multiple of ``2**12`` below ``2**33``), and
  so is the low parts'; the sum of the two rounds once. A float operand enters whole (with
  `two_sum` against the other's high part), so a mixed difference is within one unit in the
  last place of the exact one. Float-only operands are subtracted as they are.

  Args:
    a: int or float array (ints other than int32/uint32, float16, bfloat16 upcast exactly).
    b: int or float array (broadcast with ``a``).

  Returns:
    float32 ``a - b``.
  """
  a, b = jnp.broadcast_arrays(jnp.asarray(a), jnp.asarray(b))
  wide = (jnp.int32, jnp.uint32)
  if a.dtype not in wide and b.dtype not in wide:
    return lax.sub(*lax_operands(_as_float32(a), _as_float32(b)))
  (a_high, a_low), (b_high, b_low) = _float_parts(a), _float_parts(b)
  high, error = two_sum(a_high, lax.neg(b_high))
  return lax.add(high, lax.sub(lax.add(error, a_low), b_low))


def _as_float32(x):
  return x if x.dtype == jnp.float32 else lax.convert_element_type(x, jnp.float32)


def _float_parts(x):
  """``(high, low)`` float32 with ``high + low = x``: `int_parts` for int32/uint32, else
  ``(x as float32, 0)``."""
  if x.dtype in (jnp.int32, jnp.uint32):
    return int_parts(x)
  x = _as_float32(x)
  return x, jnp.zeros_like(x)


def _power_of_two(k):
  """float32 ``2**k`` for int32 ``k`` in ``[-126, 127]`` (built from its bits: exact)."""
  return lax.bitcast_convert_type(
    lax.shift_left(lax.add(k, np.int32(127)), np.int32(23)), jnp.float32
  )


def power_of_two_factors(k):
  """Two float32 powers of two whose product is ``2**k``, for int ``k`` in ``[-252, 254]``."""
  k = clamp(jnp.asarray(k, jnp.int32), -252, 254)
  first = clamp(k, -126, 127)
  return _power_of_two(first), _power_of_two(lax.sub(k, first))


def ldexp(x, k):
  """``x * 2**k`` for float32 ``x`` and int ``k``: exact unless the result leaves float32's range.

  Unlike ``jnp.ldexp``, right for subnormal results and for any ``k`` (two exact steps,
  monotone, so nothing underflows early). Inputs that are subnormal stay as the backend
  treats them (XLA's CPU backend flushes them to zero).
  """
  first, second = power_of_two_factors(k)
  return times_powers(jnp.asarray(x, jnp.float32), first, second)


def times_powers(x, first, second):
  """``x * first * second`` for float32 ``x`` and two powers of two (both products exact)."""
  x, first = lax_operands(x, first)
  x, second = lax_operands(x, second)
  return lax.mul(lax.mul(x, first), second)


def scale_down(x, shift):
  """``x * 2**shift`` for ``shift <= 0``, one step: 0 below ``2**-126`` (inf and NaN kept)."""
  x, shift = jnp.asarray(x), jnp.asarray(shift, jnp.int32)
  x, factor = lax_operands(x, _power_of_two(lax.max(shift, np.int32(-126))))
  kept = lax.bitwise_or(lax.ge(shift, np.int32(-126)), lax.bitwise_not(lax.is_finite(x)))
  return select(kept, lax.mul(x, factor), 0.0)


def exponent(x):
  """int32 ``e`` with ``2**(e-1) <= |x| < 2**e`` (``frexp``'s exponent), subnormals included.

  ``ZERO_EXPONENT`` where ``x == 0`` and 0 where ``x`` is inf or NaN.
  """
  x = jnp.asarray(x, jnp.float32)
  small = lax.lt(lax.abs(x), np.float32(2.0**-126))
  bits = lax.bitcast_convert_type(select(small, lax.mul(x, np.float32(2.0**64)), x), jnp.int32)
  field = lax.bitwise_and(lax.shift_right_arithmetic(bits, np.int32(23)), np.int32(0xFF))
  e = lax.sub(lax.sub(field, np.int32(126)), select(small, np.int32(64), np.int32(0)))
  return select(lax.eq(x, np.float32(0)), ZERO_EXPONENT, select(lax.is_finite(x), e, 0))


def scale_exponent(magnitude):
  """The exponent that brings ``magnitude`` (>= 0) into ``[0.5, 1)``; 0 for 0, inf or NaN."""
  e = exponent(magnitude)
  return select(lax.eq(e, np.int32(ZERO_EXPONENT)), 0, e)


def scaled_to_unit(x, axis):
  """``(x * 2**-e, e)``: ``x`` times the power of two that brings its largest magnitude along
  ``axis`` into ``[0.5, 1)`` (exact, unlike a division by it, which XLA's CPU backend makes a
  multiply by the reciprocal, 0 for magnitudes above 2**126); ``e`` keeps ``axis`` with size 1."""
  _, e = frexp(jnp.max(jnp.abs(x), axis=axis, keepdims=True))
  return ldexp(x, -e), e


def frexp(x):
  """``(m, e)`` with ``x = m * 2**e`` and ``0.5 <= |m| < 1`` (``m = x``, ``e = 0`` for 0/inf/NaN)."""
  e = scale_exponent(jnp.abs(x))
  return ldexp(x, -e), e
