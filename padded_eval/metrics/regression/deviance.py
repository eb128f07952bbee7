"""Tweedie deviances: TweedieDevianceScore and D2TweedieScore (scikit-learn, torchmetrics).

The unit deviance of power ``p`` (``p <= 0`` or ``p >= 1``; scikit-learn refuses ``0 < p <
1``) is, for ``target = y > 0`` and ``L = log(preds / y)``,

    d(y, mu) = 2 y**(2 - p) h(L),   h(L) = expm1((2 - p) L) / (2 - p) - expm1((1 - p) L) / (1 - p),

(a ``0`` denominator meaning its limit ``L``), which is scikit-learn's formula rearranged so
nothing cancels: for small ``|L|`` the series ``sum_k L**k / k! ((2-p)**(k-1) - (1-p)**(k-1))``
is summed, so a prediction close to its target keeps float32's relative precision (the
textbook form loses it all); far from it the two terms and ``y**(2 - p)`` cost about ``|2 - p|``
times a few float32 roundings (relative error up to 3e-6 measured at ``p = -1.5``). ``p = 0`` is ``(y - mu)**2``; ``y <= 0`` (allowed for ``p < 2``)
uses the textbook form.

Domains (scikit-learn): ``p < 0``: ``preds > 0``; ``p = 0``: any; ``1 <= p < 2``: ``target
>= 0`` and ``preds > 0``; ``p >= 2``: both ``> 0``. A real element of nonzero weight outside
the domain (or NaN) is counted in ``invalid`` (``"outside the domain of power"``, reported by
``masked_eval``) and left out (scikit-learn raises); an element of weight 0 is not seen.

Update keywords: ``preds``, ``target`` float of equal shape ``[B, ...]``; ``mask`` and
``weights`` a prefix of their shape.
"""

from __future__ import annotations

import math
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval import validation
from padded_eval.exact._floats import compensated_sum, ldexp, rounded_difference, scale_exponent
from padded_eval.exact.accumulate import Accumulator, ExactCount, ExactSum
from padded_eval.masking import element_weights
from padded_eval.metrics.averages import WeightedMean, pair_and_error, weighted_totals, zero_total
from padded_eval.metrics.base import Metric, empty_count, invalid_state, state
from padded_eval.metrics.regression.moments import Moments

OUTSIDE = "outside the domain of power"
_SERIES_TERMS = 16


def check_power(power) -> float:
  """``power`` as a float; ValueError unless a finite number ``<= 0`` or ``>= 1``."""
  if not validation.is_number(power) or not math.isfinite(power):
    raise ValueError(f"power must be a finite number <= 0 or >= 1; got {power!r}")
  if 0 < power < 1:
    raise ValueError(
      f"the Tweedie deviance is defined for power <= 0 or >= 1 (scikit-learn); got power={power}"
    )
  return float(power)


def in_domain(preds, target, power: float) -> jax.Array:
  """bool: the elements where the deviance of ``power`` is defined (NaN never is)."""
  finite = ~(jnp.isnan(preds) | jnp.isnan(target))
  if power == 0:
    return finite
  if power < 0:
    return finite & (preds > 0)
  if power < 2:
    return finite & (preds > 0) & (target >= 0)
  return finite & (preds > 0) & (target > 0)


def _expm1_over(a: float, x):
  """``expm1(a x) / a`` (``x`` at ``a = 0``)."""
  return x if a == 0 else jnp.expm1(a * x) / a


def _h(log_ratio, power: float):
  a, b = 2.0 - power, 1.0 - power
  scale = max(abs(a), abs(b), 1.0)
  small = jnp.abs(log_ratio) * scale < 0.5
  x = jnp.where(small, log_ratio, 0.0)
  series, term = jnp.zeros_like(x), x
  for k in range(2, _SERIES_TERMS + 2):
    term = term * x / k  # x**k / k!
    series = series + term * (a ** (k - 1) - b ** (k - 1))
  direct = _expm1_over(a, log_ratio) - _expm1_over(b, log_ratio)
  return jnp.where(small, series, direct)


def unit_deviance(preds, target, power: float, difference=None) -> jax.Array:
  """float32 elementwise Tweedie deviance ``d(target, preds)`` (garbage outside the domain);
  ``difference``: ``preds - target`` to more precision than the float32 values (int32 inputs
  beyond ``2**24``), default their difference."""
  difference = preds - target if difference is None else difference
  if power == 0:
    return difference**2
  return deviance_to(target, preds, difference, power)


class TweedieDevianceScore(WeightedMean):
  """Mean Tweedie deviance of ``power`` (scikit-learn ``mean_tweedie_deviance``).

  ``power`` 0 is the mean squared error, 1 the Poisson, 2 the Gamma deviance; any
  ``p <= 0`` or ``p >= 1`` (see [the module docstring][padded_eval.metrics.regression.deviance]: the deviance is formed so that a
  prediction near its target keeps float32's relative precision). Equals torchmetrics
  ``TweedieDevianceScore(power)``. Elements outside the power's domain are counted in
  ``invalid`` and left out. NaN when empty.

  Args:
    power: the Tweedie power ``p`` (``<= 0`` or ``>= 1``).

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> preds, target = np.array([2.0, 1.0]), np.array([1.0, 1.0])
    >>> m = pe.metrics.TweedieDevianceScore(power=1).update(preds=preds, target=target)
    >>> round(float(m.compute()), 4)  # Poisson: 2 (log(1 / 2) - 1 + 2) / 2
    0.3069
  """

  higher_is_better: ClassVar[bool | None] = False

  # a configuration field over WeightedMean's class constant, read the same way
  power: float = 0.0  # pyrefly: ignore[bad-override]
  invalid: ExactCount = state(invalid_state)
  invalid_kinds: ClassVar[tuple[str, ...]] = (OUTSIDE,)

  def _check_config(self):
    object.__setattr__(self, "power", check_power(self.power))

  def _values(self, *, preds, target, **_):
    preds, target, difference = pair_and_error(preds, target)  # int32: exact, rounded once
    return unit_deviance(preds, target, self.power, difference), "preds"

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    preds, target, difference = pair_and_error(preds, target)  # int32: exact, rounded once
    real, w = element_weights(mask, weights, preds.shape, "preds")
    good = in_domain(preds, target, self.power)
    invalid = self.count_invalid(**{OUTSIDE: real & ~good & (w != 0)})  # weight 0: not seen
    if self.power == 0:  # the squared error, squared on scaled errors as MSE (no overflow)
      totals = weighted_totals(difference, real & good, weights, "preds", power=2)
    else:
      values = unit_deviance(preds, target, self.power, difference)
      totals = weighted_totals(values, real & good, weights, "preds", nonnegative=True)
    return totals.then(lambda pair: {"total": pair[0], "weight": pair[1], "invalid": invalid})


def deviance_to(y, pivot, difference, power: float) -> jax.Array:
  """float32 ``d(y, pivot)``: the deviance of target ``y`` from the prediction ``pivot``, with
  ``difference = pivot - y`` given to more precision than ``pivot`` itself.

  The stable form (module docstring) on ``log1p(difference / y)``, so the deviance of two close
  values keeps float32's relative precision even where ``pivot - y`` would not (the means of a
  state, known as float32 pairs); ``y <= 0`` (``p < 2`` only) takes scikit-learn's form, where
  ``max(y, 0)**(2 - p) = 0``. The Tweedie deviance is the Bregman divergence of
  ``A(y) = max(y, 0)**(2-p) / ((1-p) (2-p))`` (``y log y - y`` at ``p = 1``, ``-log y - 1`` at
  ``p = 2``); for ``p < 0`` a ``pivot <= 0`` has ``A(pivot) = A'(pivot) = 0``, so ``d = 2 A(y)``.
  """
  a, b = 2.0 - power, 1.0 - power
  positive, defined = y > 0, pivot > 0
  safe_y, safe_mu = jnp.where(positive, y, 1.0), jnp.where(defined, pivot, 1.0)
  ratio = jnp.where(positive & defined, difference, 0.0) / safe_y
  far = ratio < -0.5  # a pivot below half of y: the ratio may round to -1 (log1p: -inf)
  log_ratio = jnp.where(
    far, jnp.log(safe_mu) - jnp.log(safe_y), jnp.log1p(jnp.where(far, 0.0, ratio))
  )
  stable = 2.0 * safe_y**a * _h(log_ratio, power)
  textbook = jnp.zeros_like(safe_mu)  # y <= 0 (p < 2 only)
  if power < 2:
    textbook = 2.0 * safe_mu**a / a - (2.0 * y * safe_mu**b / b if power < 1 else 0.0)
  value = jnp.where(positive, stable, textbook)
  if power < 1:  # pivot <= 0: 2 A(y)
    value = jnp.where(defined, value, 2.0 * jnp.maximum(y, 0.0) ** a / (a * b))
  return jnp.where(defined | (power < 1), value, 0.0)  # p >= 1: pivot 0 only when every y is 0


#: The exponents ``k`` `_power_of_two` tabulates: those of float32 magnitudes (subnormals too).
_LOWEST_EXPONENT, _HIGHEST_EXPONENT = -160, 160


def _power_of_two(k, a: float):
  """``(n, m)`` with ``2**(k * a) = m * 2**n``: int32 ``n`` and float32 ``m`` in ``[1, 2)``
  (``m`` rounded once), for int32 ``k`` (an exponent of a float32 magnitude) and a float ``a``.

  Tabulated in float64 over every such ``k``: ``k * a`` in float32 would cost the factor
  ``|k * a| * 2**-24`` of relative precision (1e-5 at ``k = 60``)."""
  exponents = np.arange(_LOWEST_EXPONENT, _HIGHEST_EXPONENT + 1, dtype=np.float64)
  whole = np.floor(exponents * a)
  index = jnp.clip(k, _LOWEST_EXPONENT, _HIGHEST_EXPONENT) - _LOWEST_EXPONENT
  factor = jnp.asarray(np.exp2(exponents * a - whole).astype(np.float32))
  return jnp.asarray(whole.astype(np.int32))[index], factor[index]


def _scaled_total(x, used, w, k, a: float) -> ExactSum:
  """The ExactSum of ``sum w x 2**(k a)`` over ``used`` (``x`` a function of the data scaled by
  ``2**-k``, homogeneous of degree ``a``): the data's own total, formed in range."""
  n, m = _power_of_two(k, a)
  return ExactSum.of_pair(*compensated_sum(jnp.where(used, w * (x * m), 0.0)), n)


def _framed(power: float) -> bool:
  """Whether deviances of ``power`` are formed on data scaled by a power of two (not 0, 1, 2)."""
  return power not in (0.0, 1.0, 2.0)


def _times_weight(weight: ExactSum, value, k, a: float | None) -> ExactSum:
  """``W value 2**(k a)`` (``a`` None: ``W value``) formed on the weight's mantissa, for a total
  weight ``W`` and float32 ``value`` (0 where either is not a finite positive-weight number)."""
  mantissa, exp = weight.frexp()
  n, m = _power_of_two(k, a) if a is not None else (0, 1.0)
  seen = (mantissa > 0) & jnp.isfinite(value)
  return ExactSum.of(jnp.where(seen, mantissa * (value * m), 0.0), jnp.where(seen, exp + n, 0))


def _negated(total: ExactSum) -> ExactSum:
  return ExactSum._make(-total.hi, -total.lo, total.exponent)


def _weighted_deviance(weight: ExactSum, y, pivot, difference, power: float) -> ExactSum:
  """``W d(y, pivot)`` for a total weight ``W`` (scalars), formed in range: on the weight's
  mantissa and, for `_framed` powers, on the values scaled into ``[0.5, 1)``."""
  k = jnp.int32(0)
  if _framed(power):
    k = scale_exponent(jnp.maximum(jnp.abs(y), jnp.abs(pivot)))
    y, pivot, difference = ldexp(y, -k), ldexp(pivot, -k), ldexp(difference, -k)
  value = deviance_to(y, pivot, difference, power)
  return _times_weight(weight, value, k, 2.0 - power if _framed(power) else None)


def _batch_deviances(power: float, y, mu, used, w, moments: Moments, exact=None):
  """``(deviance, null)``: one batch's ``sum w d(y, mu)`` (an ExactSum) and its `_NullDeviance`
  part, for ``p != 0``; both deviances in one elementwise pass (``d(y, mu)`` and ``d(y, c)``).

  ``y``, ``mu`` are 1 where not ``used`` and ``w`` 0 there; ``moments`` are the targets'
  `Moments`, whose total ``W s + sum w (y - s)`` rounds only the products of the deviations
  (``sum w y`` would round each product: 0.06 for a target near 1e6). The batch's mean ``c`` is
  the pair ``(pivot, offset)``: deviances from it, not from its float32 rounding (which would cost
  ``W d(c, fl(c))``, 1% of the spread of targets near 1e6 spread by 1). ``exact``: None, or
  ``(mu - y, y)`` with the difference formed exactly and ``y`` the targets as given (int32 ones
  beyond ``2**24``: each difference from the pivot formed from the integer)."""
  weight, total = moments.count, moments.total[..., 0]
  low, high = moments.low[..., 0], moments.high[..., 0]
  mean_hi, mean_lo = total.quotient(weight)
  seen = weight.frexp()[0] > 0
  pivot = jnp.where(seen, jnp.clip(mean_hi, low, high), 1.0)
  offset = jnp.where(seen, (mean_hi - pivot) + mean_lo, 0.0)
  pivot = jnp.broadcast_to(pivot, y.shape)
  if exact is None:
    difference, from_pivot = mu - y, pivot - y
  else:  # (mu - y, integer targets y): the differences formed exactly, rounded once
    difference, from_pivot = exact[0], rounded_difference(pivot, exact[1])
  k = None
  if _framed(power):  # homogeneous of degree 2 - p: formed on the batch scaled into [0.5, 1)
    magnitude = jnp.where(used, jnp.maximum(jnp.abs(y), jnp.abs(mu)), 0.0)
    k = scale_exponent(jnp.max(magnitude, initial=0.0))
    y, mu, pivot, offset = ldexp(y, -k), ldexp(mu, -k), ldexp(pivot, -k), ldexp(offset, -k)
    difference, from_pivot = ldexp(difference, -k), ldexp(from_pivot, -k)
  values = deviance_to(
    jnp.stack([y, y]), jnp.stack([mu, pivot]), jnp.stack([difference, from_pivot + offset]), power
  )
  # both summed in one reduction: summed apart, XLA's CPU backend fused the elementwise chain
  # into each of the two reductions (about 0.3 s more to compile)
  axes = tuple(range(1, values.ndim))
  used, w = jnp.broadcast_to(used, values.shape), jnp.broadcast_to(w, values.shape)
  if k is None:
    totals = ExactSum.of_sum(jnp.where(used, values, 0.0), axis=axes, where=used, weights=w)
  else:
    n, m = _power_of_two(k, 2.0 - power)
    totals = ExactSum.of_pair(*compensated_sum(jnp.where(used, w * (values * m), 0.0), axes), n)
  return totals[0], _NullDeviance(power, weight, total, totals[1])


class _NullDeviance(Accumulator):
  """The null deviance ``sum w d(y, c)`` of the targets around their weighted mean ``c``, kept
  so that it merges without cancelling (Chan's formula, generalized to Bregman divergences).

  Each part holds its total weight ``W_i``, its total ``sum w y`` (exact sums) and ``spread``,
  the deviance of its targets around its own mean ``c_i``. Parts combine as

      D = sum_i D_i + sum_i W_i d(c_i, c),   c = sum_i total_i / sum_i W_i,

  which holds for any Bregman divergence (the Tweedie deviance is one), every term >= 0: the
  nearly constant targets (1e6 + N(0, 1)) whose sums ``sum w A(y) - W A(c)`` cancel to noise
  keep float32's relative precision. The means are float32 pairs (``quotient``) and ``d(c_i, c)``
  is formed from their difference (`deviance_to`). A batch forms its spread around its float32
  mean ``c``, known as a float32 pair (its rounding would cost ``W d(c, fl(c))``).

  ``power`` is static (the pytree's auxiliary data).
  """

  _fields = ("weight", "total", "spread")
  power: float  # static
  weight: ExactSum
  total: ExactSum
  spread: ExactSum

  def __init__(self, power: float, weight: ExactSum, total: ExactSum, spread: ExactSum):
    object.__setattr__(self, "power", float(power))
    for name, value in zip(self._fields, (weight, total, spread), strict=True):
      object.__setattr__(self, name, value)

  @classmethod
  def zeros(cls, power: float) -> _NullDeviance:
    return cls(power, ExactSum.zeros(), ExactSum.zeros(), ExactSum.zeros())

  def _make_like(self, weight, total, spread) -> _NullDeviance:
    return _NullDeviance(self.power, weight, total, spread)

  def mean(self) -> tuple[jax.Array, jax.Array]:
    """The weighted mean of the targets as a float32 pair (NaN when empty)."""
    return self.total.quotient(self.weight)

  def _around(self, mean_hi, mean_lo) -> ExactSum:
    """This part's deviance around the mean ``mean_hi + mean_lo``: ``D_i + W_i d(c_i, c)``."""
    if self.power == 0:
      return self.spread
    own_hi, own_lo = self.mean()
    difference = (mean_hi - own_hi) + (mean_lo - own_lo)  # c - c_i
    difference = jnp.where(jnp.isfinite(difference), difference, 0.0)
    own = jnp.where(jnp.isfinite(own_hi), own_hi + own_lo, 1.0)
    return self.spread.merge(
      _weighted_deviance(self.weight, own, own + difference, difference, self.power)
    )

  def merge(self, other: _NullDeviance) -> _NullDeviance:
    weight, total = self.weight.merge(other.weight), self.total.merge(other.total)
    mean_hi, mean_lo = total.quotient(weight)
    both = jax.tree.map(lambda a, b: jnp.stack([a, b]), self, other)  # one program for the two
    around = both._around(mean_hi[None], mean_lo[None])
    return self._make_like(weight, total, around[0].merge(around[1]))

  def _combine(self, total, maximum, n, spread=None):
    combine = lambda acc: acc._combine(total, maximum, n, spread)  # noqa: E731
    weight, sums = combine(self.weight), combine(self.total)
    mean_hi, mean_lo = sums.quotient(weight)
    back = spread or (lambda x: jnp.broadcast_to(x, self.weight.hi.shape))
    return self._make_like(weight, sums, combine(self._around(back(mean_hi), back(mean_lo))))

  def null(self) -> ExactSum:
    """``sum w d(y, c)``: the deviance of the targets around their mean."""
    return self.spread


jax.tree_util.register_pytree_with_keys(
  _NullDeviance,
  lambda acc: ([(jax.tree_util.GetAttrKey(f), getattr(acc, f)) for f in acc._fields], acc.power),
  lambda power, children: _NullDeviance(power, *children),
  flatten_func=lambda acc: ([getattr(acc, f) for f in acc._fields], acc.power),
)


class D2TweedieScore(Metric):
  """D² of the Tweedie deviance: ``1 - D(target, preds) / D(target, mean(target))``
  (scikit-learn ``d2_tweedie_score``), the fraction of deviance explained.

  Psum-able without cancelling: the null deviance ``D(y, c) = sum w d(y, c)`` around the
  dataset's (weighted) mean ``c`` is kept as each part's deviance around its own mean, and parts
  merge by ``D = sum_i D_i + sum_i W_i d(c_i, c)`` (Chan's formula; it holds for every Bregman
  divergence, the Tweedie deviance among them), so nearly constant targets (``1e6 + N(0, 1)``)
  keep float32's relative precision at every power. ``p = 0`` is kept as exact moments (it is
  :class:`R2Score`). For ``p`` other than 0, 1 and 2 the deviance is homogeneous of degree
  ``2 - p`` (``d(s y, s mu) = s**(2-p) d(y, mu)``): each batch forms it on data scaled by a power
  of two and keeps the totals with that power, so data near 1e18 or 1e-25 (whose deviances leave
  float32's range for ``p < 0``) scores as at scale 1. Elements outside the power's domain are
  counted in ``invalid`` and left out. NaN when empty and when the null deviance is 0 (constant
  targets). A mean target ``c <= 0`` (possible for ``p < 0`` only) is outside the deviance's
  domain; there the null deviance is scikit-learn's textbook form ``2 (sum w A(y) - W c**(2-p) /
  ((1-p)(2-p)))`` with ``A(y) = max(y, 0)**(2-p) / ((1-p)(2-p))`` (a number for integer ``p``,
  NaN otherwise, as scikit-learn).

  Not offered: ``d2_absolute_error_score`` and ``d2_pinball_score``: their null model is the
  dataset's median / ``alpha``-quantile of ``target``, which no sum over batches gives (it
  needs every target kept, as the rank correlations do).

  Args:
    power: the Tweedie power ``p`` (``<= 0`` or ``>= 1``).

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> preds, target = np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 4.0])
    >>> m = pe.metrics.D2TweedieScore(power=0).update(preds=preds, target=target)
    >>> round(float(m.compute()), 4)  # 1 - 1 / (14 / 3)
    0.7857
  """

  higher_is_better: ClassVar[bool | None] = True

  power: float = 0.0
  deviance: ExactSum = state(zero_total)
  null_deviance: _NullDeviance = state(lambda self: _NullDeviance.zeros(self.power))
  target_statistic: ExactSum = state(zero_total)  # p < 0: sum w max(y, 0)**(2-p) / ((1-p)(2-p))
  target_moments: Moments = state(lambda self: Moments.zeros((), 1))
  example_rows: ExactCount = state(empty_count)
  invalid: ExactCount = state(invalid_state)
  invalid_kinds: ClassVar[tuple[str, ...]] = (OUTSIDE,)

  def number_inputs(self) -> tuple[str, ...]:
    return self.required_inputs()

  def _check_config(self):
    object.__setattr__(self, "power", check_power(self.power))

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    raw_target = jnp.asarray(target)  # int32: deviations from the mean formed from the integers
    preds, target, error = pair_and_error(preds, target)
    real, w = element_weights(mask, weights, preds.shape, "preds")
    good = in_domain(preds, target, self.power)
    weighed = real & (w != 0)  # a weight-0 element is not seen, not even as invalid
    used = weighed & good
    w = jnp.where(used, w, 0.0)
    y = jnp.where(used, target, 1.0)
    mu = jnp.where(used, preds, 1.0)
    difference = jnp.where(used, error, 0.0)
    exact_y = jnp.where(used, raw_target, jnp.ones((), raw_target.dtype))
    moments = Moments.of(exact_y[..., None], used, w, tuple(range(y.ndim)))
    if self.power == 0:  # squared on scaled errors (R2Score's residual): no over- or underflow
      deviance = ExactSum.of_sum(difference, where=used, weights=w, power=2)
      null = _NullDeviance.zeros(0.0)  # the moments keep it
    else:
      exact = (difference, exact_y)
      deviance, null = _batch_deviances(self.power, y, mu, used, w, moments, exact)
    statistic = ExactSum.zeros()
    if self.power < 0:  # the null deviance of a mean target <= 0 (scikit-learn's form)
      low, high = moments.low[0], moments.high[0]
      k, a = scale_exponent(jnp.maximum(jnp.abs(low), jnp.abs(high))), 2.0 - self.power
      k = jnp.where(low <= high, k, 0)
      y_k = ldexp(y, -k)
      statistic = _scaled_total(jnp.maximum(y_k, 0.0) ** a / (a * (a - 1.0)), used, w, k, a)
    return {
      "deviance": deviance,
      "null_deviance": null,
      "target_statistic": statistic,
      "target_moments": moments,
      "invalid": self.count_invalid(**{OUTSIDE: weighed & ~good}),
    }

  def compute(self) -> jax.Array:
    """float32 scalar; NaN when empty or when the null deviance is not positive."""
    seen = self.target_moments.count.total() > 0  # the total weight
    if self.power == 0:  # R2Score's form: a ratio of the scaled totals (finite if it fits)
      null = self.target_moments.comoment[0, 0]
      varies = (null.frexp()[0] > 0) & ~self.target_moments.constant()[0]
      return jnp.where(seen & varies, 1.0 - self.deviance.ratio(null), jnp.nan)
    # a constant target's null deviance is exactly 0 (its parts' deviances only round)
    varies = ~self.target_moments.constant()[0]
    null = self.null_deviance.null()
    mean_hi, mean_lo = self.null_deviance.mean()
    score = jnp.where((null.frexp()[0] > 0) & varies, 1.0 - self.deviance.ratio(null), jnp.nan)
    if self.power < 0:  # a mean target <= 0: 2 (sum w A(y) - W c**(2-p) / ((1-p)(2-p)))
      a, c = 2.0 - self.power, mean_hi + mean_lo
      k = scale_exponent(jnp.abs(c))
      value = ldexp(c, -k) ** a / (a * (a - 1.0))  # NaN for c < 0 and p not an integer
      term = _times_weight(self.null_deviance.weight, value, k, a)
      null = self.target_statistic.merge(_negated(term))
      defined = jnp.isfinite(value) & (null.frexp()[0] != 0)  # < 0 too, as scikit-learn
      other = jnp.where(defined, 1.0 - 0.5 * self.deviance.ratio(null), jnp.nan)
      score = jnp.where(mean_hi > 0, score, jnp.where(varies, other, jnp.nan))
    else:
      score = jnp.where(mean_hi > 0, score, jnp.nan)
    return jnp.where(seen, score, jnp.nan)
