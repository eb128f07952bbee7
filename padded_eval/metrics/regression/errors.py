"""Regression metrics beside MSE/MAE/R2: MAPE, MSLE and ExplainedVariance (scikit-learn).

MAPE and MSLE are weighted means of a per-element value (the weighted-mean base of
:mod:`padded_eval.metrics.averages`: two exact totals). ExplainedVariance needs two
variances around the dataset's means, kept as Chan-merged
:class:`~padded_eval.metrics.regression.moments.Moments`, so it equals one pass over the data
whatever the batching, devices and hosts.

Update keywords: ``preds``, ``target`` float of equal shape ``[B, ...]``; ``mask`` and
``weights`` a prefix of their shape. Every element is one observation (as scikit-learn
with ``multioutput="uniform_average"`` when all outputs have the same count).
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval import validation
from padded_eval.exact._floats import ZERO_EXPONENT, ldexp
from padded_eval.exact.accumulate import ExactCount, upcast
from padded_eval.masking import element_weights
from padded_eval.metrics.averages import WeightedMean, pair_and_error, weighted_totals
from padded_eval.metrics.base import Metric, empty_count, invalid_state, state
from padded_eval.metrics.regression._multioutput import (
  MULTIOUTPUT_NAMES,
  check_multioutput,
  combine,
)
from padded_eval.metrics.regression.moments import Moments, nan_seen

#: scikit-learn's floor on ``|target|`` in MAPE (``np.finfo(np.float64).eps``).
MAPE_EPSILON = float(np.finfo(np.float64).eps)


def _pair(preds, target) -> tuple[jax.Array, jax.Array]:
  preds, target = upcast(jnp.asarray(preds)), upcast(jnp.asarray(target))
  if preds.shape != target.shape:
    raise ValueError(
      f"preds has shape {preds.shape} but target has shape {target.shape}; expected equal shapes"
    )
  return preds, target


class MAPE(WeightedMean):
  """Mean absolute percentage error ``mean(|preds - target| / max(|target|, eps))``.

  ``eps`` is float64's machine epsilon, as in scikit-learn's
  ``mean_absolute_percentage_error``: a target of 0 gives a huge error, not inf, while it fits
  float32 (``|preds| / eps`` above 3.4e38, for ``|preds|`` above about 7.6e22, is inf per element
  and in the result, where scikit-learn's float64 mean may be finite). The result is a
  fraction (0.1 is 10%). NaN when empty. A real element of nonzero weight with a NaN error
  (NaN in ``preds`` or ``target``) is counted in ``invalid`` (``"nan value"``) and makes the
  result NaN (one of weight 0 is not seen).

  Example:
    >>> import jax.numpy as jnp
    >>> m = MAPE().update(preds=jnp.array([1.1, 1.8]), target=jnp.array([1.0, 2.0]))
    >>> round(float(m.compute()), 6)
    0.1
  """

  higher_is_better: ClassVar[bool | None] = False
  nonnegative: ClassVar[bool] = True

  def _values(self, *, preds, target, **_):
    preds, target, error = pair_and_error(preds, target)
    return jnp.abs(error) / jnp.maximum(jnp.abs(target), MAPE_EPSILON), "preds"


class MSLE(WeightedMean):
  """Mean squared logarithmic error ``mean((log1p(preds) - log1p(target))**2)``.

  The difference is formed as ``log1p((preds - target) / (1 + target))``, which does
  not cancel when ``preds`` is close to ``target`` (and as ``log1p(preds) - log1p(target)``
  where ``preds + 1`` is below half of ``target + 1``: the ratio would round to -1). Equals scikit-learn's
  ``mean_squared_log_error``, which refuses values ``<= -1``: here a real element of nonzero
  weight with ``preds`` or ``target`` ``<= -1`` (or NaN) is counted in ``invalid``
  (``"value <= -1"``, reported by ``masked_eval``) and left out (an element of weight 0 is not
  seen). NaN when empty.

  Example:
    >>> import jax.numpy as jnp
    >>> m = MSLE().update(preds=jnp.array([0.0, 3.0]), target=jnp.array([0.0, 1.0]))
    >>> round(float(m.compute()), 6)  # log(4 / 2)**2 / 2
    0.240227
  """

  higher_is_better: ClassVar[bool | None] = False

  power = 2
  invalid: ExactCount = state(invalid_state)
  invalid_kinds: ClassVar[tuple[str, ...]] = ("value <= -1",)

  def _values(self, *, preds, target, **_):
    preds, target, error = pair_and_error(preds, target)
    ratio = error / (1.0 + target)  # rounds to -1 for preds far below target: log1p gives -inf
    far = ratio < -0.5  # preds + 1 below half of target + 1: nothing cancels in the plain form
    plain = jnp.log1p(jnp.where(far, preds, 0.0)) - jnp.log1p(jnp.where(far, target, 0.0))
    return jnp.where(far, plain, jnp.log1p(jnp.where(far, 0.0, ratio))), "preds"

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    values, ref = self._values(preds=preds, target=target)
    preds, target = _pair(preds, target)
    real, w = element_weights(mask, weights, values.shape, ref)
    bad = real & ~((preds > -1.0) & (target > -1.0))
    invalid = self.count_invalid(**{"value <= -1": bad & (w != 0)})  # weight 0: not seen
    totals = weighted_totals(values, real & ~bad, weights, ref, self.power)
    return totals.then(lambda pair: {"total": pair[0], "weight": pair[1], "invalid": invalid})


def _second_moment(moments: Moments, column: int):
  """``(M_jj, varies)``: variable ``column``'s co-moment and whether it is not constant
  (False for a constant variable or a rounded ``M_jj <= 0``; True for NaN)."""
  second = moments.comoment[..., column, column]
  mantissa, _ = second.frexp()
  return second, ~((mantissa <= 0) | moments.constant()[..., column])


class ExplainedVariance(Metric):
  """Explained variance ``1 - Var(target - preds) / Var(target)`` (scikit-learn).

  Both variances are (weighted) population variances around the dataset's means, merged
  exactly (Chan). As scikit-learn's ``explained_variance_score`` (``force_finite=True``):
  an output whose residuals do not vary scores 1, and one whose target is constant
  (but residuals vary) scores 0; with ``force_finite=False`` a constant target scores
  NaN if the residuals do not vary either, else ``-inf``. NaN when empty. A real element of
  nonzero weight with NaN in ``preds`` or ``target`` is counted in ``invalid``
  (``"nan value"``) and makes its output's score NaN (one of weight 0 is not seen).
  int32 inputs beyond ``2**24`` keep their digits in the target's variance and in each
  residual, but a residual is one float32: residuals that are themselves beyond ``2**24``
  (``preds`` near ``2**30``, ``target`` near 0) are rounded once each, and a spread of a few
  units among them is lost.

  Args:
    num_outputs: 1 (every element of ``preds`` is one observation) or ``D`` for
      ``preds`` / ``target`` ``[batch, ..., D]``, one score per output.
    multioutput: ``"uniform_average"`` (the mean of the outputs' scores),
      ``"variance_weighted"`` (weighted by each output's target variance),
      ``"raw_values"`` (``[D]``) or ``D`` non-negative weights (scikit-learn's array).
    force_finite: scikit-learn's ``force_finite`` (see above).

  Example:
    >>> import jax.numpy as jnp
    >>> m = ExplainedVariance().update(preds=jnp.array([2.5, 0.0, 2.0, 8.0]),
    ...                                target=jnp.array([3.0, -0.5, 2.0, 7.0]))
    >>> round(float(m.compute()), 4)  # sklearn's docstring example
    0.9572
  """

  higher_is_better: ClassVar[bool | None] = True

  num_outputs: int = 1
  multioutput: str | tuple[float, ...] = "uniform_average"
  force_finite: bool = True
  moments: Moments = state(
    lambda self: Moments.zeros(() if self.num_outputs == 1 else (self.num_outputs,), 2)
  )
  example_rows: ExactCount = state(empty_count)
  invalid: ExactCount = state(invalid_state)
  invalid_kinds: ClassVar[tuple[str, ...]] = ("nan value",)

  def _check_config(self):
    validation.check_positive_int("num_outputs", self.num_outputs)
    check_multioutput(self, self.num_outputs, MULTIOUTPUT_NAMES)
    validation.check_choice("force_finite", self.force_finite, (True, False))

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    raw_target = jnp.asarray(target)  # int32: its variance from the integers (Moments)
    preds, target, error = pair_and_error(preds, target)
    residual = -error  # target - preds, rounded once from the exact difference
    if self.num_outputs > 1 and (preds.ndim < 2 or preds.shape[-1] != self.num_outputs):
      raise ValueError(
        f"num_outputs={self.num_outputs} expects preds and target of shape "
        f"[batch, ..., {self.num_outputs}]; got {preds.shape}"
      )
    real, w = element_weights(mask, weights, preds.shape, "preds")
    axes = tuple(range(preds.ndim - (self.num_outputs > 1)))
    variables = [raw_target, residual]  # the target's own dtype: int32 keeps every digit
    return {
      "moments": Moments.of(variables, real, w, axes),
      "invalid": self.count_invalid(**{"nan value": nan_seen(real, w, preds, target)}),
    }

  def compute(self) -> jax.Array:
    """The score: a float32 scalar, or ``[D]`` with ``multioutput="raw_values"``."""
    target_var, target_varies = _second_moment(self.moments, 0)
    residual_var, residual_varies = _second_moment(self.moments, 1)
    ratio = residual_var.ratio(target_var)
    if self.force_finite:
      scores = jnp.where(residual_varies, jnp.where(target_varies, 1.0 - ratio, 0.0), 1.0)
    else:
      constant = jnp.where(residual_varies, -jnp.inf, jnp.nan)
      scores = jnp.where(target_varies, jnp.where(residual_varies, 1.0 - ratio, 1.0), constant)
    scores = jnp.where(self.moments.count.total() > 0, scores, jnp.nan)
    # the target variances relative to the largest one (exact powers of two: no overflow)
    mantissa, exp = target_var.frexp()
    largest = jnp.max(jnp.where(target_varies, exp, ZERO_EXPONENT))
    weight = jnp.where(target_varies, ldexp(mantissa, exp - largest), 0.0)
    return combine(scores, self.multioutput, weight)
