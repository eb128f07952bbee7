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

from padded_eval.exact._floats import compensated_sum, ldexp, scale_exponent
from padded_eval.exact.accumulate import ExactCount, ExactSum, upcast
from padded_eval.masking import element_weights
from padded_eval.metrics.averages import WeightedMean, weighted_totals, zero_total
from padded_eval.metrics.base import Metric, empty_count, invalid_state, state
from padded_eval.metrics.moments import Moments

OUTSIDE = "outside the domain of power"
_SERIES_TERMS = 16


def check_power(power) -> float:
  """``power`` as a float; ValueError unless a finite number ``<= 0`` or ``>= 1``."""
  if isinstance(power, bool) or not isinstance(power, (int, float)) or not math.isfinite(power):
    raise ValueError(f"power must be a finite number <= 0 or >= 1; got {power!r}")
  if 0 < power < 1:
    raise ValueError(
      f"the Tweedie deviance is defined for power <= 0 or >= 1 (scikit-learn); got power={power}"
    )
  return float(power)


def _pair(preds, target) -> tuple[jax.Array, jax.Array]:
  preds, target = upcast(jnp.asarray(preds)), upcast(jnp.asarray(target))
  if preds.shape != target.shape:
    raise ValueError(
      f"preds has shape {preds.shape} but target has shape {target.shape}; expected equal shapes"
    )
  return preds, target


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


def unit_deviance(preds, target, power: float) -> jax.Array:
  """float32 elementwise Tweedie deviance ``d(target, preds)`` (garbage outside the domain)."""
  if power == 0:
    return (target - preds) ** 2
  positive = target > 0
  y = jnp.where(positive, target, 1.0)
  mu = jnp.where(preds > 0, preds, 1.0)
  log_ratio = jnp.log1p((mu - y) / y)
  stable = 2.0 * y ** (2.0 - power) * _h(log_ratio, power)
  # target <= 0 (p < 2 only; 0 when p >= 1): scikit-learn's form, max(y, 0)**(2 - p) = 0
  a, b = 2.0 - power, 1.0 - power
  textbook = jnp.zeros_like(mu)
  if power < 2:
    textbook = 2.0 * mu**a / a - (2.0 * target * mu**b / b if power < 1 else 0.0)
  return jnp.where(positive, stable, textbook)


class TweedieDevianceScore(WeightedMean):
  """Mean Tweedie deviance of ``power`` (scikit-learn ``mean_tweedie_deviance``).

  ``power`` 0 is the mean squared error, 1 the Poisson, 2 the Gamma deviance; any
  ``p <= 0`` or ``p >= 1`` (see the module docstring: the deviance is formed so that a
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

  power: float = 0.0
  invalid: ExactCount = state(invalid_state)
  invalid_kinds: ClassVar[tuple[str, ...]] = (OUTSIDE,)

  def _check_config(self):
    object.__setattr__(self, "power", check_power(self.power))

  def _values(self, *, preds, target, **_):
    preds, target = _pair(preds, target)
    return unit_deviance(preds, target, self.power), "preds"

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    preds, target = _pair(preds, target)
    real, w = element_weights(mask, weights, preds.shape, "preds")
    good = in_domain(preds, target, self.power)
    invalid = self.count_invalid(**{OUTSIDE: real & ~good & (w != 0)})  # weight 0: not seen
    if self.power == 0:  # the squared error, squared on scaled errors as MSE (no overflow)
      totals = weighted_totals(preds - target, real & good, weights, "preds", power=2)
    else:
      totals = weighted_totals(
        unit_deviance(preds, target, self.power), real & good, weights, "preds"
      )
    return totals.then(lambda pair: {"total": pair[0], "weight": pair[1], "invalid": invalid})


def _null_statistic(target, power: float):
  """``A(y)`` with ``sum w d(y, c) = 2 (sum w A(y) - W B(c))`` for the weighted mean ``c``."""
  if power == 1:
    return jnp.where(target > 0, target * jnp.log(jnp.where(target > 0, target, 1.0)), 0.0)
  if power == 2:
    return -jnp.log(target)
  return jnp.maximum(target, 0.0) ** (2.0 - power) / ((1.0 - power) * (2.0 - power))


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


def _in_frame(total: ExactSum, k, a: float) -> jax.Array:
  """float32 ``total * 2**-(k a)`` formed on the mantissa (in range where ``total`` is not)."""
  n, m = _power_of_two(k, a)
  mantissa, exp = total.frexp()
  return ldexp(mantissa / m, exp - n)


class D2TweedieScore(Metric):
  """D² of the Tweedie deviance: ``1 - D(target, preds) / D(target, mean(target))``
  (scikit-learn ``d2_tweedie_score``), the fraction of deviance explained.

  Psum-able: the null deviance around the dataset's (weighted) mean ``c`` is a function of
  sums, ``D(y, c) = 2 (sum w A(y) - W B(c))`` (``p = 1``: ``A = y log y``, ``B = c log c``;
  ``p = 2``: ``A = -log y``, ``B = -log c``; in general ``A = y**(2-p) / ((1-p)(2-p))``,
  ``B = A(c)``), kept as exact totals. ``p = 0`` is kept as exact moments (Chan; it is
  :class:`R2Score`). For ``p != 0`` the two terms cancel by the Jensen gap: the relative
  error of the null deviance is about ``2**-24 * |2 - p| * sum w A(y) / D(y, c)`` (1e-6 for
  targets spread over a factor of a few; poor for nearly constant targets, where ``p = 0``
  is exact). For ``p`` other than 0, 1 and 2 the deviance is homogeneous of degree ``2 - p``
  (``d(s y, s mu) = s**(2-p) d(y, mu)``): each batch forms it on data scaled by a power of two
  and ``compute`` on the totals scaled by the dataset's, so data near 1e18 or 1e-25 (whose
  deviances leave float32's range for ``p < 0``) scores as at scale 1. Elements outside the
  power's domain are counted in ``invalid`` and left out. NaN when empty or when the null
  deviance is 0.

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
  weight: ExactSum = state(zero_total)
  target_total: ExactSum = state(zero_total)
  target_statistic: ExactSum = state(zero_total)
  target_moments: Moments = state(lambda self: Moments.zeros((), 1))
  example_rows: ExactCount = state(empty_count)
  invalid: ExactCount = state(invalid_state)
  invalid_kinds: ClassVar[tuple[str, ...]] = (OUTSIDE,)

  def number_inputs(self) -> tuple[str, ...]:
    return self.required_inputs()

  def _check_config(self):
    object.__setattr__(self, "power", check_power(self.power))

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    preds, target = _pair(preds, target)
    real, w = element_weights(mask, weights, preds.shape, "preds")
    good = in_domain(preds, target, self.power)
    weighed = real & (w != 0)  # a weight-0 element is not seen, not even as invalid
    used = weighed & good
    w = jnp.where(used, w, 0.0)
    y = jnp.where(used, target, 1.0)
    total = lambda x: ExactSum.of_sum(jnp.where(used, x, 0.0), where=used, weights=w)
    mu = jnp.where(used, preds, 1.0)
    statistic = total(_null_statistic(y, self.power))
    if self.power == 0:  # squared on scaled errors (R2Score's residual): no over- or underflow
      deviance = ExactSum.of_sum(mu - y, where=used, weights=w, power=2)
    elif self.power in (1.0, 2.0):
      deviance = total(unit_deviance(mu, y, self.power))
    else:  # homogeneous of degree 2 - p: formed on the batch scaled into [0.5, 1)
      magnitude = jnp.where(used, jnp.maximum(jnp.abs(y), jnp.abs(mu)), 0.0)
      k, a = scale_exponent(jnp.max(magnitude, initial=0.0)), 2.0 - self.power
      y_k, mu_k = ldexp(y, -k), ldexp(mu, -k)
      deviance = _scaled_total(unit_deviance(mu_k, y_k, self.power), used, w, k, a)
      statistic = _scaled_total(_null_statistic(y_k, self.power), used, w, k, a)
    return {
      "deviance": deviance,
      "weight": ExactSum.of_sum(w),
      "target_total": total(y),
      "target_statistic": statistic,
      "target_moments": Moments.of(y[..., None], used, w, tuple(range(y.ndim))),
      "invalid": self.count_invalid(**{OUTSIDE: weighed & ~good}),
    }

  def _frame(self):
    """The exponent that brings the largest ``|target|`` seen into ``[0.5, 1)``."""
    low, high = self.target_moments.low[0], self.target_moments.high[0]
    return scale_exponent(jnp.maximum(jnp.abs(low), jnp.abs(high)))

  def _null_deviance(self) -> jax.Array:
    """The null deviance for ``p != 0`` (``p = 0``: the moments' co-moment, in ``compute``);
    for ``p`` other than 1 and 2 that of the data scaled by `_frame` (see the docstring)."""
    p = self.power
    weight = self.weight.total()
    c = self.target_total.ratio(self.weight)
    if p == 1:
      return 2.0 * (self.target_statistic.total() - weight * (c * jnp.log(c)))
    if p == 2:
      return 2.0 * (self.target_statistic.total() - weight * -jnp.log(c))
    k, a = self._frame(), 2.0 - p
    term = ldexp(c, -k) ** a / ((1.0 - p) * a)
    return 2.0 * (_in_frame(self.target_statistic, k, a) - weight * term)

  def compute(self) -> jax.Array:
    """float32 scalar; NaN when empty or when the null deviance is not positive."""
    seen = self.weight.total() > 0
    if self.power == 0:  # R2Score's form: a ratio of the scaled totals (finite if it fits)
      null = self.target_moments.comoment[0, 0]
      varies = (null.frexp()[0] > 0) & ~self.target_moments.constant()[0]
      return jnp.where(seen & varies, 1.0 - self.deviance.ratio(null), jnp.nan)
    # a constant target's null deviance is exactly 0 (the sums' difference only rounds)
    null = jnp.where(self.target_moments.constant()[0], 0.0, self._null_deviance())
    if self.power in (1.0, 2.0):
      deviance = self.deviance.total()
    else:
      deviance = _in_frame(self.deviance, self._frame(), 2.0 - self.power)
    fraction = deviance / jnp.where(null > 0, null, 1.0)
    return jnp.where(seen & (null > 0), 1.0 - fraction, jnp.nan)
