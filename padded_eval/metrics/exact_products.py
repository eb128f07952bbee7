"""Exact sums of products of counts, for ratios that would cancel in float32.

``c * n - sum_k t_k * p_k`` (the Matthews numerator) subtracts two numbers of order
``n**2`` whose difference can be tiny: in float32 the products round (``n`` past
``2**12``) and the difference keeps only the rounding error. Here each count is split
into base-``2**12`` int32 digits, products and sums are formed exactly on the digits
(every digit product is below ``2**24``, every column sum below ``2**31``), carries are
propagated with integer shifts, and only the final, exact difference is converted to
float32 (one rounding per digit of a sum of non-negative terms: a few ulps). Nothing
here is floating-point arithmetic that XLA could contract or reassociate.

Exact for counts below ``2**61`` and results below ``2**122`` (float32's range); the
sums have at most ``2**16`` terms.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval.accumulate import ExactCount

DIGIT_BITS = 12
NUM_DIGITS = 11  # 132 bits: a product of two counts below 2**61, or a sum below 2**132
_DIGIT_MASK = (1 << DIGIT_BITS) - 1
_SCALES = np.array([2.0 ** (DIGIT_BITS * m) for m in range(NUM_DIGITS)], np.float32)


def digits(count: ExactCount) -> jax.Array:
  """int32 ``[..., NUM_DIGITS]`` base-``2**12`` digits of an exact count (lowest first)."""
  lo, hi = count.lo, count.hi  # count = hi * 2**30 + lo, lo < 2**30
  upper = hi >> 6  # the bits of hi above its lowest 6, from bit 36 of the count
  parts = [
    lo & _DIGIT_MASK,
    (lo >> DIGIT_BITS) & _DIGIT_MASK,
    (lo >> 2 * DIGIT_BITS) | ((hi & 63) << 6),
    upper & _DIGIT_MASK,
    (upper >> DIGIT_BITS) & _DIGIT_MASK,
    upper >> 2 * DIGIT_BITS,
  ]
  zero = jnp.zeros_like(lo)
  return jnp.stack(parts + [zero] * (NUM_DIGITS - len(parts)), axis=-1)


def normalize(values: jax.Array) -> jax.Array:
  """Carries propagated: every digit in ``[0, 2**12)`` but the top one, which keeps the
  sign and any excess (digits may be negative on entry, ``|digit| < 2**30``)."""
  out, carry = [], jnp.zeros(values.shape[:-1], jnp.int32)
  for m in range(NUM_DIGITS):
    value = values[..., m] + carry
    if m == NUM_DIGITS - 1:
      out.append(value)
    else:
      out.append(value & _DIGIT_MASK)
      carry = value >> DIGIT_BITS  # arithmetic shift: floor division, also below 0
  return jnp.stack(out, axis=-1)


def times(a: jax.Array, b: jax.Array) -> jax.Array:
  """Digits of ``a * b`` (normalized digits in, normalized digits out; exact)."""
  width = 6  # nonzero digits of a count; products of wider sums are never needed
  columns = jnp.zeros(a.shape[:-1] + (NUM_DIGITS,), jnp.int32)
  for i in range(width):
    term = a[..., i : i + 1] * b[..., :width]  # < 2**24 each; <= 6 per column
    columns = columns + jnp.pad(term, [(0, 0)] * (term.ndim - 1) + [(i, NUM_DIGITS - width - i)])
  return normalize(columns)


def total(values: jax.Array, axis: int = 0) -> jax.Array:
  """Digits of the sum over ``axis`` (at most ``2**16`` normalized numbers; exact)."""
  return normalize(jnp.sum(values, axis=axis))


def difference(a: jax.Array, b: jax.Array) -> jax.Array:
  """float32 ``a - b`` of two normalized digit arrays, rounded only at the end."""
  forward, backward = normalize(a - b), normalize(b - a)
  negative = forward[..., -1] < 0
  magnitude = jnp.where(negative[..., None], backward, forward)
  value = jnp.sum(magnitude.astype(jnp.float32) * _SCALES, axis=-1)
  return jnp.where(negative, -value, value)
