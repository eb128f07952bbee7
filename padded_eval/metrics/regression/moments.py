"""Second-moment metrics that merge exactly: Std, R2Score, PearsonCorrelation.

Variances and co-variances do not merge by addition, so they are kept as
:class:`Moments`: per column the weight ``n``, the total ``sum(w * x)`` and the
co-moment matrix ``M[j, k] = sum(w * (x_j - mean_j) * (x_k - mean_k))`` around the
state's own mean. Parts combine with the n-way form of Chan's formula

    M = sum_i M_i + sum_i n_i * (mean_i - mean) (mean_i - mean)^T,

with ``mean = sum_i total_i / sum_i n_i``. Merging two states is the two-part
case; ``reduce`` (``psum``) and ``aggregate`` (a sum over the stacked axis) are
the n-part case, so no gather is needed. Every total is an exact
:class:`~padded_eval.exact.accumulate.ExactSum` and the differences ``mean_i - mean``
are formed from double-float means, so data with mean 1e4 and std 1 keeps its
variance to float32 precision over any number of steps and devices.

Range: within a batch the deviations are scaled by a power of two per variable before
they are multiplied, the totals carry their own power of two, and results are formed on
the mantissas (``C_xy / (sqrt(C_xx) sqrt(C_yy))``, never ``C_xx * C_yy``), so every result
that fits float32 comes out finite (values near 1e18, or of scale 1e-25). Constants: the
range ``low``/``high`` of each variable is kept exactly (int32/uint32 beyond ``2**24`` with
the remainder their float32 rounding loses), and a variable whose extremes are equal is
constant in every batching: Pearson NaN, Std 0, R2 and ExplainedVariance by scikit-learn's
zero-variance rule, whatever rounding the merges left in its co-moment.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import ClassVar

import jax
import jax.numpy as jnp

from padded_eval.caches import registry
from padded_eval.exact._floats import (
  ZERO_EXPONENT,
  compensated_sum,
  exact_product,
  frexp,
  ldexp,
  rounded_difference,
  two_prod,
)
from padded_eval.exact.accumulate import (
  Accumulator,
  ExactCount,
  ExactSum,
  register_accumulator,
  upcast,
)
from padded_eval.masking import element_weights
from padded_eval.metrics.averages import NAN_VALUE
from padded_eval.metrics.base import Metric, empty_count, invalid_state, state
from padded_eval.metrics.regression._multioutput import (
  MULTIOUTPUT_NAMES,
  check_multioutput,
  combine,
)
from padded_eval.validation import (
  check_choice,
  check_nonnegative_int,
  check_positive_int,
  is_number,
)


def _outer(u, v):
  return u[..., :, None] * v[..., None, :]


def _exact_outer(u, v, exponent) -> ExactSum:
  """``u_i v_j 2**exponent_ij`` exactly (`two_prod` of the mantissas)."""
  (u_mantissa, u_exp), (v_mantissa, v_exp) = frexp(u), frexp(v)
  product, error = two_prod(u_mantissa[..., :, None], v_mantissa[..., None, :])
  return ExactSum.of_pair(product, error, u_exp[..., :, None] + v_exp[..., None, :] + exponent)


def _magnitude_exponent(x, axes):
  """Per column, the exponent bringing ``max |x|`` over ``axes`` into ``[0.5, 1)`` (0 if 0)."""
  _, e = frexp(jnp.max(jnp.abs(x), axes, keepdims=True, initial=0.0))  # 0 rows: 0
  return e


@register_accumulator
class Moments(Accumulator):
  """Weight, totals, co-moment matrix and range of ``k`` variables; merges exactly (Chan).

  Attributes:
    count: ExactSum ``[S...]``, the total weight ``n`` (the number of real elements
      when unweighted).
    total: ExactSum ``[S..., k]``, ``sum(w * x)`` per variable.
    comoment: ExactSum ``[S..., k, k]``, ``sum(w * (x - mean) (x - mean)^T)`` around
      this state's own mean ``total / count``.
    low: float32 ``[S..., k]``, the smallest value of weight != 0 rounded to float32
      (+inf if none).
    high: float32 ``[S..., k]``, the largest such value (-inf if none).
    low_rest: float32 ``[S..., k]``, the smallest ``x - float32(x)`` among the values
      ``x`` that round to ``low`` (0 for floats; an int32/uint32 beyond ``2**24`` loses it
      in float32), so ``low + low_rest`` is the exact smallest value.
    high_rest: float32 ``[S..., k]``, the largest such remainder of the values at ``high``.
      A variable whose exact extremes are equal is constant (`constant`).
  """

  _fields = ("count", "total", "comoment", "low", "high", "low_rest", "high_rest")
  count: ExactSum
  total: ExactSum
  comoment: ExactSum
  low: jax.Array
  high: jax.Array
  low_rest: jax.Array
  high_rest: jax.Array

  @classmethod
  def zeros(cls, shape=(), num_vars: int = 1) -> Moments:
    shape = tuple(shape)
    columns = shape + (num_vars,)
    return cls._make(
      ExactSum.zeros(shape),
      ExactSum.zeros(columns),
      ExactSum.zeros(columns + (num_vars,)),
      jnp.full(columns, jnp.inf, jnp.float32),
      jnp.full(columns, -jnp.inf, jnp.float32),
      jnp.full(columns, jnp.inf, jnp.float32),
      jnp.full(columns, -jnp.inf, jnp.float32),
    )

  @classmethod
  def of(
    cls,
    values: jax.Array | Sequence[jax.Array],
    real: jax.Array,
    w: jax.Array,
    axes: tuple[int, ...],
  ) -> Moments:
    """The moments of one batch.

    Args:
      values: ``[X..., k]`` float or int, the ``k`` variables of every element, or a list of
        ``k`` arrays ``[X...]`` (columns of different dtypes); int32/uint32 beyond ``2**24`` keep
        every digit: each deviation from the shift is formed exactly and rounded once
        (`padded_eval.exact._floats.rounded_difference`), so integers that all round to one
        float32 (``2**30`` and ``2**30 + 3``) are not read as constant (`constant`).
      real: ``[X...]`` bool, the real elements; the others never influence the result.
      w: ``[X...]`` float32 weights, 0 where not ``real``.
      axes: the axes of ``X`` to reduce; the state has the shape of the others.

    Returns:
      Moments of shape ``X`` without ``axes``. Within the batch the co-moment is taken
      around a shift (the batch mean) and corrected, ``M = P - s s^T / n``,
      on deviations scaled by a power of two per variable, so nothing over- or underflows.
    """
    if isinstance(values, (list, tuple)):  # columns of their own dtypes (ints kept)
      columns = [jnp.asarray(column) for column in values]
      if any(_wide(column) for column in columns):
        return _batch_moments(columns, real, w, tuple(axes))
      values = jnp.stack([upcast(column) for column in columns], axis=-1)
    values = jnp.asarray(values)
    if _wide(values):
      return _batch_moments([values[..., j] for j in range(values.shape[-1])], real, w, tuple(axes))
    return _batch_moments(upcast(values), real, w, tuple(axes))

  @property
  def shape(self) -> tuple[int, ...]:
    return self.count.shape

  def mean(self) -> jax.Array:
    """``[S..., k]`` float32 means (NaN where the weight is 0)."""
    return self.total.ratio(self.count[..., None])

  def constant(self) -> jax.Array:
    """``[S..., k]`` bool: every element of nonzero weight has the same value.

    The exact extremes are equal: the float32 ones and the remainders (integers that all
    round to one float32, ``2**30`` and ``2**30 + 3``, differ in the remainders). Read from
    the extremes, not from the co-moment: merging parts of a constant variable rounds the
    means (weights 1, 7, 0.3, 1 left ``M_jj`` at ``6e-28``, an ExplainedVariance of
    ``-3e28``), and the extremes merge without rounding."""
    return (self.low == self.high) & (self.low_rest == self.high_rest)

  def _extremes(self, low, high) -> tuple[jax.Array, jax.Array]:
    """``(low_rest, high_rest)`` of this state's parts at the combined extremes
    (``+inf`` / ``-inf`` where a part's extreme is not the combined one)."""
    low_rest = jnp.where(self.low == low, self.low_rest, jnp.inf)
    return low_rest, jnp.where(self.high == high, self.high_rest, -jnp.inf)

  def _spread(self, mean_hi, mean_lo) -> ExactSum:
    """``n_i (mean_i - mean)(mean_i - mean)^T`` of this state's parts, 0 for empty parts."""
    own_hi, own_lo = self.total.quotient(self.count[..., None])
    mantissa, exp = frexp((own_hi - mean_hi) + (own_lo - mean_lo))
    weight = self.count.total()[..., None, None]
    spread = jnp.where(weight > 0, weight * _outer(mantissa, mantissa), 0.0)
    return ExactSum.of(spread, exp[..., :, None] + exp[..., None, :])

  def merge(self, other: Moments) -> Moments:
    return _merge_moments(self, other)

  def _merge(self, other: Moments) -> Moments:
    count = self.count.merge(other.count)
    total = self.total.merge(other.total)
    mean_hi, mean_lo = total.quotient(count[..., None])
    mine = self.comoment.merge(self._spread(mean_hi, mean_lo))
    theirs = other.comoment.merge(other._spread(mean_hi, mean_lo))
    low, high = jnp.minimum(self.low, other.low), jnp.maximum(self.high, other.high)
    (my_low, my_high), (their_low, their_high) = (
      self._extremes(low, high),
      other._extremes(low, high),
    )
    rests = jnp.minimum(my_low, their_low), jnp.maximum(my_high, their_high)
    return self._make(count, total, mine.merge(theirs), low, high, *rests)

  def aggregate(self) -> Moments:
    return _aggregate_moments(self)

  def _combine(
    self, total: Callable, maximum: Callable, n: int, spread: Callable | None = None
  ) -> Moments:
    if spread is not None:  # segment_sum: the means would have to be spread back onto the parts
      raise TypeError("Moments combine over a mapped or stacked axis, not by segments")
    combine = lambda acc: acc._combine(total, maximum, n)
    count, sums = combine(self.count), combine(self.total)
    mean_hi, mean_lo = sums.quotient(count[..., None])
    # the parts' shape (aggregate reduced a leading axis): broadcast explicitly, not by promotion
    parts = self.total.hi.shape
    mean_hi, mean_lo = jnp.broadcast_to(mean_hi, parts), jnp.broadcast_to(mean_lo, parts)
    comoment = combine(self.comoment.merge(self._spread(mean_hi, mean_lo)))
    low, high = -maximum(-self.low), maximum(self.high)
    low_rest, high_rest = self._extremes(
      jnp.broadcast_to(low, parts), jnp.broadcast_to(high, parts)
    )
    rests = -maximum(-low_rest), maximum(high_rest)
    return self._make(count, sums, comoment, low, high, *rests)


# Jitted so that eager use (host-side merges) runs one compiled program, not dozens of ops.
_merge_moments = registry.jit(Moments._merge)
_aggregate_moments = registry.jit(Accumulator.aggregate)


@registry.jit(static_argnums=3)
def _batch_moments(values, real, w, axes) -> Moments:
  """See :meth:`Moments.of`."""
  # An element of weight 0 is not seen: its value sets no scale or shift (1e20 there made
  # the others' squares round to 0), and inf or NaN there never leaks.
  used = (real & (w != 0))[..., None]
  # values: float32 [X..., k], or columns [X...] each with int32/uint32 ones among them (float32
  # rounds those: their deviations are formed from the integers)
  columns = values if isinstance(values, list) else []
  if columns:
    values = jnp.stack([upcast(column) for column in columns], axis=-1)
  values = jnp.where(used, values, 0.0)
  weight = w[..., None]
  count, count_error = compensated_sum(w, axes, keepdims=True)
  count, count_error = count[..., None], count_error[..., None]
  count_error = jnp.where(jnp.isfinite(count), count_error, 0.0)  # inf weights: NaN error
  low = jnp.min(jnp.where(used, values, jnp.inf), axes, keepdims=True, initial=jnp.inf)
  high = jnp.max(jnp.where(used, values, -jnp.inf), axes, keepdims=True, initial=-jnp.inf)
  rest = _deviations(columns, values, values)  # x - float32(x): 0 but for wide integers
  low_rest = jnp.where(used & (values == low), rest, jnp.inf)
  high_rest = jnp.where(used & (values == high), rest, -jnp.inf)
  low_rest = jnp.min(low_rest, axes, initial=jnp.inf)
  high_rest = jnp.max(high_rest, axes, initial=-jnp.inf)
  safe_count = jnp.where(count > 0, count, 1.0)
  scale = _magnitude_exponent(values, axes)
  mean = ldexp(jnp.sum(weight * ldexp(values, -scale), axes, keepdims=True) / safe_count, scale)
  # The shift must be one rounded value in both uses below. ``values - total * (1/n)`` was
  # fused into an FMA (an unrounded shift) while ``n * shift`` used the rounded one; the
  # clip (min/max) and the split from bits in ``of_product`` leave no product to fuse.
  shift = jnp.where(count > 0, jnp.clip(mean, low, high), 0.0)
  deviation = jnp.where(used, _deviations(columns, values, shift), 0.0)
  scale = _magnitude_exponent(deviation, axes)
  scaled = ldexp(deviation, -scale)
  weighted = weight * scaled
  # Compensated sums (error-free additions): the batching changes nothing but the rounding
  # of the deviations and products themselves.
  first, first_error = compensated_sum(weighted, axes, keepdims=True)
  products, products_error = compensated_sum(_outer(weighted, scaled), axes, keepdims=True)
  # M = P - s s^T / n, with s_i (s_j / n) exact: a shift half a float32 spacing from the mean
  # (64 for integers near 2**31 that round to one float32) makes P and s s^T / n cancel, and
  # their rounding was the error (there Std was 6.9e-6 and Pearson 1.2e-5 from float64; 1.5e-7 now).
  quotient = first / safe_count
  n_quotient, n_quotient_error = exact_product(quotient, count)
  rest = ((first - n_quotient) - n_quotient_error) / safe_count  # s / n - quotient, rounded
  squeeze = lambda x: jnp.squeeze(x, axes)
  # total = n * shift + sum(w * (x - shift)): the product exactly, the small rest rounded.
  total = ExactSum.of_product(squeeze(count), squeeze(shift))
  total = total.merge(ExactSum.of_pair(squeeze(first), squeeze(first_error), squeeze(scale)))
  total = total.merge(ExactSum.of_product(squeeze(count_error), squeeze(shift)))
  pair_scale = squeeze(scale[..., :, None] + scale[..., None, :])
  products_error = products_error - _outer(first, rest)
  comoment = ExactSum.of_pair(squeeze(products), squeeze(products_error), pair_scale)
  comoment = comoment.merge(_exact_outer(-squeeze(first), squeeze(quotient), pair_scale))
  weight_total = ExactSum.of_pair(squeeze(count)[..., 0], squeeze(count_error)[..., 0])
  extremes = squeeze(low), squeeze(high), low_rest, high_rest
  return Moments._make(weight_total, total, comoment, *extremes)


def _wide(column) -> bool:
  return column.dtype in (jnp.int32, jnp.uint32)


def _deviations(columns, values, shift):
  """``values - shift`` (``[X..., k]``), each int32/uint32 column's formed from its integers
  exactly and rounded once."""
  if not any(_wide(column) for column in columns):
    return values - shift
  shift = jnp.broadcast_to(shift, values.shape)
  return jnp.stack(
    [
      rounded_difference(column, shift[..., j]) if _wide(column) else values[..., j] - shift[..., j]
      for j, column in enumerate(columns)
    ],
    axis=-1,
  )


def _variance_parts(moments: Moments, column: int):
  """``(M_jj, spread)``: the co-moment of ``column`` and whether the variable varies.

  ``spread`` is False for a constant variable and for ``M_jj <= 0`` (rounding), and True
  for NaN, so that NaN data gives NaN, not 0.
  """
  second = moments.comoment[..., column, column]
  mantissa, _ = second.frexp()
  return second, ~((mantissa <= 0) | moments.constant()[..., column])


def nan_seen(real, w, *values) -> jax.Array:
  """bool: the real elements of nonzero weight where any of ``values`` is NaN (``"nan value"``)."""
  nan = functools.reduce(jnp.logical_or, [jnp.isnan(v) for v in values])
  return real & (w != 0) & nan


def _values_of(kwargs, argname: str, owner: str) -> jax.Array:
  if argname not in kwargs:
    raise ValueError(
      f"{owner} needs the keyword {argname!r} in update(); got keywords {sorted(kwargs)}"
    )
  return jnp.asarray(kwargs[argname])


def _pair(preds, target, num_outputs: int, mask, weights):
  """``(preds, target, real, w, axes)`` for metrics of ``num_outputs`` columns.

  With ``num_outputs == 1`` every element is one observation of one output; else the
  last axis of ``preds``/``target`` must be ``num_outputs`` and the others are reduced.
  """
  preds, target = upcast(jnp.asarray(preds)), upcast(jnp.asarray(target))
  if preds.shape != target.shape:
    raise ValueError(
      f"preds has shape {preds.shape} but target has shape {target.shape}; expected equal shapes"
    )
  if num_outputs > 1 and (preds.ndim < 2 or preds.shape[-1] != num_outputs):
    raise ValueError(
      f"num_outputs={num_outputs} expects preds and target of shape "
      f"[batch, ..., {num_outputs}]; got {preds.shape}"
    )
  real, w = element_weights(mask, weights, preds.shape, "preds")
  axes = tuple(range(preds.ndim - (num_outputs > 1)))
  return preds, target, real, w, axes


class Std(Metric):
  """Weighted standard deviation of the keyword ``argname`` over real elements.

  ``sqrt(M2 / (n - ddof))`` with ``n`` the total weight (weights act as frequency
  weights) and ``M2`` the sum of weighted squared deviations from the dataset mean,
  accumulated with Chan's merge, so large means (1e4 with std 1) lose nothing.

  Args:
    ddof: delta degrees of freedom, as in ``numpy.std``.
    argname: the update keyword whose elements are the data (default ``"values"``).

  Update keywords: ``values`` (``argname``) ``[...]`` float; ``mask`` / ``weights`` a
  prefix of its shape. ``compute()`` is NaN when ``n - ddof <= 0`` (e.g. empty). A real
  element of nonzero weight whose value is NaN is counted in ``invalid`` (``"nan value"``,
  reported by ``masked_eval``) and makes the result NaN.

  Examples:
    >>> import jax.numpy as jnp
    >>> m = Std().update(values=jnp.array([1.0, 3.0, jnp.nan]), mask=jnp.array([True, True, False]))
    >>> float(m.compute())
    1.0
  """

  higher_is_better: ClassVar[bool | None] = None

  ddof: int = 0
  argname: str = "values"
  moments: Moments = state(lambda self: Moments.zeros((), 1))
  example_rows: ExactCount = state(empty_count)
  invalid: ExactCount = state(invalid_state)
  invalid_kinds: ClassVar[tuple[str, ...]] = (NAN_VALUE,)

  def number_inputs(self) -> tuple[str, ...]:
    return self.required_inputs()

  def required_inputs(self) -> tuple[str, ...]:
    return (self.argname,)

  def _check_config(self):
    ddof = self.ddof
    if not is_number(ddof) or not 0 <= ddof < math.inf:
      raise ValueError(f"ddof must be a non-negative finite number; got {ddof!r}")

  def _batch_state(self, *, mask=None, weights=None, **kwargs):
    values = _values_of(kwargs, self.argname, f"Std(argname={self.argname!r})")
    real, w = element_weights(mask, weights, values.shape, self.argname)
    return {
      "moments": Moments.of(values[..., None], real, w, tuple(range(values.ndim))),
      "invalid": self.count_invalid(**{NAN_VALUE: nan_seen(real, w, values)}),
    }

  def _ratio(self, sqrt: bool) -> jax.Array:
    dof = self.moments.count.total() - self.ddof
    second, spread = _variance_parts(self.moments, 0)
    ratio = jnp.where(spread, second.ratio(jnp.where(dof > 0, dof, 1.0), sqrt=sqrt), 0.0)
    return jnp.where(dof > 0, ratio, jnp.nan)

  def variance(self) -> jax.Array:
    """``M2 / (n - ddof)``; NaN when ``n - ddof <= 0``, exactly 0 for constant data."""
    return self._ratio(sqrt=False)

  def compute(self) -> jax.Array:
    """The standard deviation (float32 scalar); NaN when empty.

    Formed from the scaled totals, so it is finite whenever it fits float32 (even when
    the variance does not).
    """
    return self._ratio(sqrt=True)


class R2Score(Metric):
  """Coefficient of determination ``1 - SS_res / SS_tot`` (scikit-learn ``r2_score``).

  ``SS_tot`` is taken around the dataset's (weighted) mean of ``target``, kept as
  mergeable moments, so the result equals one pass over the whole dataset. As in
  scikit-learn (``force_finite=True``), an output with ``SS_tot == 0`` scores 1 if
  ``SS_res == 0`` and else 0. Fewer than two real observations of nonzero weight (elements
  of an output): NaN, as in scikit-learn (torchmetrics raises there); a weight-0 element
  changes nothing, so it is not counted here either (scikit-learn counts every sample it
  is given: weights ``[1, 0, ...]`` score 0.0 or 1.0 there).

  Args:
    num_outputs: 1 (every element of ``preds`` is one observation) or ``D`` for
      ``preds`` / ``target`` ``[batch, ..., D]``, one score per output.
    multioutput: ``"uniform_average"`` (mean of the outputs' scores),
      ``"variance_weighted"`` (weighted by ``SS_tot``), ``"raw_values"`` (``[D]``) or
      ``D`` non-negative weights (scikit-learn's array ``multioutput``).
    adjusted: ``k`` independent regressors: the adjusted score
      ``1 - (1 - r2) * (n - 1) / (n - k - 1)`` (torchmetrics ``adjusted=``), applied to
      the combined score, ``n`` the total weight (the observation count when
      unweighted). NaN when ``n - k - 1 <= 0`` (torchmetrics warns and returns the
      plain score there; inside jit nothing can warn). 0: the plain score.
    force_finite: scikit-learn's ``force_finite``. False: an output with
      ``SS_tot == 0`` scores NaN if ``SS_res == 0`` and else ``-inf``.

  Update keywords: ``preds``, ``target`` float of equal shape; ``mask`` / ``weights``
  a prefix of their shape. A real element of nonzero weight with NaN in ``preds`` or
  ``target`` is counted in ``invalid`` (``"nan value"``, reported by ``masked_eval``) and
  makes its output's score NaN.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> preds, target = np.array([1.0, 2.0, 3.0]), np.array([1.0, 0.0, 5.0])
    >>> round(float(pe.metrics.R2Score().update(preds=preds, target=target).compute()), 4)  # 1 - 8 / 14
    0.4286
  """

  higher_is_better: ClassVar[bool | None] = True

  num_outputs: int = 1
  multioutput: str | tuple[float, ...] = "uniform_average"
  adjusted: int = 0
  force_finite: bool = True
  target_moments: Moments = state(lambda self: Moments.zeros(self._output_shape(), 1))
  residual: ExactSum = state(lambda self: ExactSum.zeros(self._output_shape()))
  observations: ExactCount = state(lambda self: ExactCount.zeros(self._output_shape()))
  example_rows: ExactCount = state(empty_count)
  invalid: ExactCount = state(invalid_state)
  invalid_kinds: ClassVar[tuple[str, ...]] = (NAN_VALUE,)

  def number_inputs(self) -> tuple[str, ...]:
    return self.required_inputs()

  def _output_shape(self) -> tuple[int, ...]:
    return () if self.num_outputs == 1 else (self.num_outputs,)

  def _check_config(self):
    check_positive_int("num_outputs", self.num_outputs)
    check_multioutput(self, self.num_outputs, MULTIOUTPUT_NAMES)
    check_nonnegative_int("adjusted", self.adjusted)
    check_choice("force_finite", self.force_finite, (True, False))

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    raw = jnp.asarray(preds), jnp.asarray(target)
    preds, target, real, w, axes = _pair(preds, target, self.num_outputs, mask, weights)
    error = rounded_difference(*raw)  # int32 beyond 2**24: exact, rounded once
    residual = ExactSum.of_sum(error, axis=axes, where=real, weights=w, power=2)
    return {
      "target_moments": Moments.of(raw[1][..., None], real, w, axes),
      "residual": residual,
      # observations of nonzero weight: a weight-0 element changes nothing
      "observations": ExactCount.of(jnp.sum(real & (w != 0), axis=axes, dtype=jnp.int32)),
      "invalid": self.count_invalid(**{NAN_VALUE: nan_seen(real, w, preds, target)}),
    }

  def compute(self) -> jax.Array:
    """The score: a float32 scalar, or ``[D]`` with ``multioutput="raw_values"``."""
    ss_tot, spread = _variance_parts(self.target_moments, 0)
    residual, _ = self.residual.frexp()
    seen = self.target_moments.count.total() > 0
    ratio = self.residual.ratio(ss_tot)
    constant = jnp.where(residual == 0, 1.0, 0.0)
    if not self.force_finite:
      constant = jnp.where(residual == 0, jnp.nan, -jnp.inf)
    scores = jnp.where(spread, 1.0 - ratio, constant)
    scores = jnp.where(seen & (self.observations.total() >= 2), scores, jnp.nan)
    # SS_tot relative to the largest one (exact powers of two: no overflow).
    mantissa, exp = ss_tot.frexp()
    largest = jnp.max(jnp.where(spread, exp, ZERO_EXPONENT))
    weight = jnp.where(spread, ldexp(mantissa, exp - largest), 0.0)
    r2 = combine(scores, self.multioutput, weight)
    if not self.adjusted:
      return r2
    n = self.target_moments.count.total()
    n = n if jnp.ndim(r2) else jnp.max(n)
    dof = n - self.adjusted - 1.0
    adjusted = 1.0 - (1.0 - r2) * ((n - 1.0) / jnp.where(dof > 0, dof, 1.0))
    return jnp.where(dof > 0, adjusted, jnp.nan)


class PearsonCorrelation(Metric):
  """Pearson correlation of ``preds`` and ``target`` over real elements.

  ``C_xy / sqrt(C_xx C_yy)`` from weighted co-moments around the dataset means,
  merged exactly (Chan). NaN when empty or when either variable is constant. A real
  element of nonzero weight with NaN in ``preds`` or ``target`` is counted in ``invalid``
  (``"nan value"``, reported by ``masked_eval``) and makes its output's correlation NaN.

  Args:
    num_outputs: 1 (all elements one sample) or ``D`` for ``[batch, ..., D]`` inputs,
      giving ``[D]`` correlations.

  Update keywords: ``preds``, ``target`` float of equal shape; ``mask`` / ``weights``
  a prefix of their shape.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> preds, target = np.array([1.0, 2.0, 3.0]), np.array([1.0, 0.0, 5.0])
    >>> m = pe.metrics.PearsonCorrelation().update(preds=preds, target=target)
    >>> round(float(m.compute()), 4)  # 4 / sqrt(2 * 14)
    0.7559
  """

  higher_is_better: ClassVar[bool | None] = True

  num_outputs: int = 1
  moments: Moments = state(
    lambda self: Moments.zeros(() if self.num_outputs == 1 else (self.num_outputs,), 2)
  )
  example_rows: ExactCount = state(empty_count)
  invalid: ExactCount = state(invalid_state)
  invalid_kinds: ClassVar[tuple[str, ...]] = (NAN_VALUE,)

  def number_inputs(self) -> tuple[str, ...]:
    return self.required_inputs()

  def _check_config(self):
    check_positive_int("num_outputs", self.num_outputs)

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    raw = jnp.asarray(preds), jnp.asarray(target)
    preds, target, real, w, axes = _pair(preds, target, self.num_outputs, mask, weights)
    return {
      "moments": Moments.of(list(raw), real, w, axes),  # int columns: deviations formed exactly
      "invalid": self.count_invalid(**{NAN_VALUE: nan_seen(real, w, preds, target)}),
    }

  def compute(self) -> jax.Array:
    """The correlation in ``[-1, 1]`` (float32 scalar or ``[D]``); NaN when undefined.

    ``C_xy / (sqrt(C_xx) sqrt(C_yy))`` on the scaled totals (no overflow of
    ``C_xx * C_yy``); NaN when either variable is constant or no element was seen.
    """
    xx, x_spread = _variance_parts(self.moments, 0)
    yy, y_spread = _variance_parts(self.moments, 1)
    (xx, x_exp), (yy, y_exp) = xx.frexp(), yy.frexp()
    xy, xy_exp = self.moments.comoment[..., 0, 1].frexp()
    both = jnp.where(x_spread & y_spread, x_exp + y_exp, 0)
    odd = both & 1
    root = jnp.sqrt(xx * yy * (1.0 + odd.astype(jnp.float32)))
    correlation = ldexp(xy / root, xy_exp - ((both - odd) >> 1))
    return jnp.where(x_spread & y_spread, jnp.clip(correlation, -1.0, 1.0), jnp.nan)
