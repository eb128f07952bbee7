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

from padded_eval.caches import registry
from padded_eval.exact.accumulate import ExactCount

DIGIT_BITS = 12
NUM_DIGITS = 11  # 132 bits: a product of two counts below 2**61, or a sum below 2**132
_DIGIT_MASK = (1 << DIGIT_BITS) - 1
_SCALES = np.array([2.0 ** (DIGIT_BITS * m) for m in range(NUM_DIGITS)], np.float32)


def digits(count: ExactCount) -> jax.Array:
  """int32 ``[..., NUM_DIGITS]`` base-``2**12`` digits of an exact count (lowest first)."""
  low = count.digits12()
  zero = jnp.zeros(low.shape[:-1] + (NUM_DIGITS - low.shape[-1],), jnp.int32)
  return jnp.concatenate([low, zero], axis=-1)


def normalize(values: jax.Array) -> jax.Array:
  """Carries propagated: every digit in ``[0, 2**12)`` but the top one, which keeps the
  sign and any excess (digits may be negative on entry, ``|digit| < 2**30``).

  One ``lax.scan`` over the digits (the carry ripples lowest first), so a program
  holds one small loop instead of a chain of ``NUM_DIGITS`` steps.
  """
  by_digit = jnp.moveaxis(values, -1, 0)

  def step(carry, digit):
    value = digit + carry
    return value >> DIGIT_BITS, value & _DIGIT_MASK  # arithmetic shift: floor, also below 0

  carry, low = jax.lax.scan(step, jnp.zeros(values.shape[:-1], jnp.int32), by_digit[:-1])
  return jnp.moveaxis(jnp.concatenate([low, (by_digit[-1] + carry)[None]]), 0, -1)


_COUNT_DIGITS = 6  # nonzero digits of a count below 2**72
# _PLACE[i * 6 + j, m] = 1 where i + j = m: digit products to their column of the product.
_PLACE = np.zeros((_COUNT_DIGITS * _COUNT_DIGITS, NUM_DIGITS), np.int32)
for _i in range(_COUNT_DIGITS):
  for _j in range(_COUNT_DIGITS):
    _PLACE[_i * _COUNT_DIGITS + _j, _i + _j] = 1


def times(a: jax.Array, b: jax.Array) -> jax.Array:
  """Digits of ``a * b`` for two arrays of count digits (values below ``2**61``; exact).

  Every digit product is below ``2**24`` and a column sums at most 6 of them.
  """
  a, b = a[..., :_COUNT_DIGITS], b[..., :_COUNT_DIGITS]
  products = a[..., :, None] * b[..., None, :]
  flat = products.reshape(products.shape[:-2] + (_COUNT_DIGITS * _COUNT_DIGITS,))
  return normalize(jnp.matmul(flat, jnp.asarray(_PLACE)))


def total(values: jax.Array, axis: int = 0) -> jax.Array:
  """Digits of the sum over ``axis`` (at most ``2**16`` normalized numbers; exact)."""
  return normalize(jnp.sum(values, axis=axis))


def difference(a: jax.Array, b: jax.Array) -> jax.Array:
  """float32 ``a - b`` of two normalized digit arrays, rounded only at the end."""
  both = normalize(jnp.stack([a - b, b - a]))
  negative = both[0, ..., -1] < 0
  magnitude = jnp.where(negative[..., None], both[1], both[0])
  value = jnp.sum(
    magnitude.astype(jnp.float32) * jnp.broadcast_to(_SCALES, magnitude.shape), axis=-1
  )
  return jnp.where(negative, -value, value)


def constant_digits(values: np.ndarray) -> jax.Array:
  """int32 ``[..., NUM_DIGITS]`` digits of a non-negative integer numpy array (below ``2**61``)."""
  values = np.asarray(values, np.int64)
  shifts = DIGIT_BITS * np.arange(NUM_DIGITS)
  return jnp.asarray((values[..., None] >> shifts) & _DIGIT_MASK, jnp.int32)


def _row_and_column_sums(table: ExactCount):
  """Digits of the row sums ``t`` ``[K]``, column sums ``p`` ``[K]``, total ``n`` and trace ``c``."""
  true_count = jax.tree.map(lambda limb: limb.T, table).aggregate()
  pred_count = table.aggregate()
  n = true_count.aggregate()
  correct = jax.tree.map(jnp.diagonal, table).aggregate()
  return tuple(map(digits, (true_count, pred_count, n, correct)))


@registry.jit  # compiled once per table shape, also for eager compute()
def matthews_corrcoef(table: ExactCount) -> jax.Array:
  """float32 Matthews correlation of an exact square table ``[K, K]`` (0 where undefined).

  ``(c n - sum t_k p_k) / sqrt((n^2 - sum t_k^2) (n^2 - sum p_k^2))`` with ``n`` the
  total, ``c`` the trace, ``t`` / ``p`` the row / column sums; the three differences are
  exact (formed on digits) and rounded once each.
  """
  true_count, pred_count, n, correct = _row_and_column_sums(table)
  k = table.shape[0]
  products = times(  # one batch: c n, n n, t p, t t, p p
    jnp.concatenate([correct[None], n[None], true_count, true_count, pred_count]),
    jnp.concatenate([n[None], n[None], pred_count, true_count, pred_count]),
  )
  sums = [jnp.sum(products[2 + i * k : 2 + (i + 1) * k], 0) for i in range(3)]
  terms = normalize(jnp.stack([products[0], products[1]] + sums))
  cov_true_pred, cov_true, cov_pred = difference(  # c n - sum t p, n^2 - sum t^2, ...
    jnp.stack([terms[0], terms[1], terms[1]]), terms[2:]
  )
  denominator = jnp.sqrt(cov_true) * jnp.sqrt(cov_pred)
  return jnp.where(
    denominator > 0, cov_true_pred / jnp.where(denominator > 0, denominator, 1.0), 0.0
  )


@registry.jit(static_argnames="weights")
def cohen_kappa(
  table: ExactCount, weights: str | None = None, undefined: jax.typing.ArrayLike = 0.0
) -> jax.Array:
  """float32 Cohen's kappa of an exact square table ``[K, K]`` (``undefined`` where the
  chance disagreement ``D`` is 0, as is every table of one class).

  With disagreement weights ``w`` (``1 - I``, ``|i - j|`` or ``(i - j)**2``), row / column
  sums ``t`` / ``p`` and total ``n``: ``kappa = 1 - n sum w T / sum w t p``, computed as
  ``(D - n sum w T) / D`` with ``D = sum w t p``. Every term is an integer formed exactly on
  digits; the numerator is one exact difference rounded once, so chance agreement gives
  exactly 0. Unweighted this is ``(c n - sum t p) / (n^2 - sum t p)`` (``O(K)``); the
  weighted forms hold ``[K, K]`` digit products (``O(K**2)`` memory in ``compute``).
  """
  true_count, pred_count, n, correct = _row_and_column_sums(table)
  if weights is None:
    products = times(
      jnp.concatenate([correct[None], n[None], true_count]),
      jnp.concatenate([n[None], n[None], pred_count]),
    )
    chance = normalize(jnp.sum(products[2:], 0))  # sum t p
    numerator = difference(products[0], chance)  # c n - sum t p
    denominator = difference(products[1], chance)  # n^2 - sum t p
  else:
    ids = np.arange(table.shape[0])
    distance = np.abs(ids[:, None] - ids[None, :])
    w = constant_digits(distance if weights == "linear" else distance**2)  # [K, K, D]
    weighted_pred = total(times(w, pred_count[None]), axis=1)  # sum_j w_ij p_j, [K, D]
    chance = total(times(true_count, weighted_pred), axis=0)  # D = sum_ij w_ij t_i p_j
    weighted_cells = total(total(times(w, digits(table)), axis=1), axis=0)  # sum w T
    observed = times(n, weighted_cells)  # n sum w T
    numerator = difference(chance, observed)
    denominator = difference(chance, jnp.zeros_like(chance))
  defined = denominator > 0
  return jnp.where(defined, numerator / jnp.where(defined, denominator, 1.0), undefined)
