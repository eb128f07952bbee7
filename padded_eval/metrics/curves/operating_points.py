"""Operating points of the ROC and precision-recall curves: torchmetrics' curve-family metrics.

:class:`RecallAtFixedPrecision`, :class:`PrecisionAtFixedRecall`,
:class:`SensitivityAtSpecificity`, :class:`SpecificityAtSensitivity` and :class:`EER` read the
same state as :class:`~padded_eval.metrics.curves.auc.AUROC` (its histograms, ``thresholds=``, or
``exact=True``'s kept scores; tasks, averages, masks and invalid counts as there) and pick
one point of the curve in ``compute()``, inside jit.

The points are the curve's thresholds, as torchmetrics builds them:

* ``exact=True``: one point per distinct counted score (``score >= s``), plus, on the ROC
  curve, the point where nothing is predicted positive (torchmetrics' first ROC point);
  torchmetrics' exact (``thresholds=None``) value on any data.
* ``thresholds=[...]`` (or an int, ``linspace(0, 1, n)``): one point per threshold
  (``prob >= t``, float32) and no other, torchmetrics' binned value.
* the binned default (``num_thresholds`` bins): one point per bin (its lowest score), plus
  the ROC's empty point; distinct scores of one bin are merged, so the value is the exact
  one only where no bin holds two distinct scores that matter (``binning="linear"`` grid
  scores, see :mod:`padded_eval.metrics.curves.histogram`).

A point where nothing is predicted positive is not a precision-recall point (torchmetrics'
binned curves give it precision 1; they never pick it except with ``min_recall=0``). With no
qualifying point the value is 0 (torchmetrics' rule; torchmetrics also returns the threshold,
``1e6`` then; ours is not kept). Undefined (NaN): a recall or sensitivity without positives,
a specificity without negatives. torchmetrics' multiclass / multilabel versions return one
value per class: ``average=None`` here (``"macro"``, the default, means them).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval import validation
from padded_eval.metrics.curves import exact_scores
from padded_eval.metrics.curves.histogram import ScoreHistogram, suffix_sums


def _required_rate():
  return dataclasses.field(kw_only=True)


class OperatingPoint(ScoreHistogram):
  """Base: ``_value(tp, fp, point, P, N) -> [L]`` from the curve's points ``[L, K]``."""

  _roc_origin = False  # whether the point "nothing predicted positive" is one (ROC curves)

  def _check_config(self):
    super()._check_config()
    for name in self._rate_names():
      rate = getattr(self, name)
      validation.check_probability(name, rate)

  def _rate_names(self) -> tuple[str, ...]:
    return ()

  def _area(self, positives, negatives):
    tp, fp = suffix_sums(positives), suffix_sums(negatives)  # score >= bin k's lowest score
    total_pos, total_neg = tp[:, :1], fp[:, :1]
    point = jnp.ones(tp.shape, bool)
    if self.thresholds is not None:  # the points are the thresholds: bins 1.. only
      point = jnp.arange(tp.shape[-1]) > 0
      point = jnp.broadcast_to(point, tp.shape)
    return self._from_points(tp, fp, point, total_pos, total_neg, self.thresholds is None)

  def _exact_area(self, buffer):
    g = exact_scores.groups(buffer)
    total_pos = jnp.sum(g.positive, -1, keepdims=True).astype(jnp.float32)
    total_neg = jnp.sum(g.negative, -1, keepdims=True).astype(jnp.float32)
    tp = total_pos - g.positives_below.astype(jnp.float32)
    fp = total_neg - g.negatives_below.astype(jnp.float32)
    value = self._from_points(tp, fp, g.first, total_pos, total_neg, True)
    return jnp.where(buffer.dropped == 0, value, jnp.nan)

  def _from_points(self, tp, fp, point, total_pos, total_neg, empty_point):
    """Points in increasing score order; the empty point (ROC's origin) is appended last,
    as the highest threshold."""
    if empty_point and self._roc_origin:
      zero = jnp.zeros(tp.shape[:-1] + (1,), tp.dtype)
      tp, fp = jnp.concatenate([tp, zero], -1), jnp.concatenate([fp, zero], -1)
      point = jnp.concatenate([point, jnp.ones(zero.shape, bool)], -1)
    return self._value(tp, fp, point, total_pos, total_neg)

  @abc.abstractmethod
  def _value(self, tp, fp, point, total_pos, total_neg) -> jax.Array:
    """float32 ``[L]`` from the points: ``tp`` / ``fp`` float32 ``[L, K]`` counts of ``score >=
    the point's threshold``, ``point`` bool ``[L, K]`` (which entries are points), the totals
    ``[L, 1]``."""


def _best(values, candidates) -> jax.Array:
  """float32 ``[L]``: the largest of ``values`` where ``candidates``, else 0."""
  return jnp.max(jnp.where(candidates, values, 0.0), -1, initial=0.0)


def _ratio(numerator, denominator) -> jax.Array:
  """``numerator / denominator`` (the numerator where the denominator is 0), correctly rounded.

  XLA on CPU makes a division by a broadcast total (``[L, 1]``) a reciprocal multiply, one
  ulp off (``20 / 25 = 0.79999995``), which leaves out a point whose rate equals the required
  one; the barrier keeps a true division.
  """
  safe = jnp.where(denominator > 0, denominator, 1.0)
  shape = jnp.broadcast_shapes(jnp.shape(numerator), jnp.shape(safe))
  return numerator / jax.lax.optimization_barrier(jnp.broadcast_to(safe, shape))


class RatePoint(OperatingPoint):
  """The highest rate ``best_rate`` at a point whose ``bounded_rate`` is at least the configured
  bound (the field ``min_<bounded_rate>``); 0 if none qualifies.

  The rates: ``"precision"`` (``tp / (tp + fp)``) and ``"recall"`` (``tp / P``) at the
  thresholds that predict something, NaN without positives; ``"sensitivity"`` (``tp / P``)
  and ``"specificity"`` (``1 - fpr``) at the ROC points (``_roc_origin``: the point that
  predicts nothing is one), NaN without positives or without negatives.
  """

  higher_is_better: ClassVar[bool | None] = True

  best_rate: ClassVar[str]
  bounded_rate: ClassVar[str]

  def _rate_names(self):
    return (f"min_{self.bounded_rate}",)

  def _value(self, tp, fp, point, total_pos, total_neg):
    predicted = tp + fp
    rates = {
      "precision": lambda: _ratio(tp, predicted),
      "recall": lambda: _ratio(tp, total_pos),
      "sensitivity": lambda: _ratio(tp, total_pos),
      "specificity": lambda: _ratio(total_neg - fp, total_neg),
    }
    bound = getattr(self, f"min_{self.bounded_rate}")
    candidates = point & (rates[self.bounded_rate]() >= bound)
    defined = total_pos[:, 0] > 0
    if self._roc_origin:
      defined &= total_neg[:, 0] > 0
    else:  # a precision-recall point predicts something
      candidates &= predicted > 0
    return jnp.where(defined, _best(rates[self.best_rate](), candidates), jnp.nan)


class RecallAtFixedPrecision(RatePoint):
  """The highest recall at a threshold whose precision is ``>= min_precision`` (torchmetrics'
  ``RecallAtFixedPrecision``; 0 if no threshold qualifies, NaN without positives).

  ``num_thresholds``, ``thresholds``, ``exact``, ``capacity``, ``task``, ``num_classes``,
  ``average``, ``from_logits`` and ``ignore_index`` are as for :class:`~padded_eval.metrics.AUROC`
  (see [the module docstring][padded_eval.metrics.curves.operating_points] for the points each mode gives).

  Args:
    min_precision: float in ``[0, 1]`` (keyword).

  Example:
    >>> import jax.numpy as jnp
    >>> m = RecallAtFixedPrecision(min_precision=0.6, exact=True, capacity=4)
    >>> m = m.update(preds=jnp.array([0.1, 0.4, 0.35, 0.8]), target=jnp.array([0, 0, 1, 1]))
    >>> float(m.compute())
    1.0
  """

  min_precision: float = _required_rate()
  best_rate: ClassVar[str] = "recall"
  bounded_rate: ClassVar[str] = "precision"


class PrecisionAtFixedRecall(RatePoint):
  """The highest precision at a threshold whose recall is ``>= min_recall`` (torchmetrics'
  ``PrecisionAtFixedRecall``; 0 if none qualifies, NaN without positives).

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> probs = np.array([0.9, 0.8, 0.3, 0.2, 0.6, 0.7])
    >>> labels = np.array([1, 0, 1, 0, 1, 0])
    >>> m = pe.metrics.PrecisionAtFixedRecall(min_recall=0.5).update(preds=probs, target=labels)
    >>> round(float(m.compute()), 4)  # the best precision with recall >= 0.5: 3 / 5
    0.6
  """

  min_recall: float = _required_rate()
  best_rate: ClassVar[str] = "precision"
  bounded_rate: ClassVar[str] = "recall"


class SensitivityAtSpecificity(RatePoint):
  """The highest sensitivity (recall) at a ROC point whose specificity ``1 - fpr`` is
  ``>= min_specificity`` (torchmetrics' ``SensitivityAtSpecificity``; 0 if none qualifies,
  NaN without positives or without negatives).

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> probs = np.array([0.9, 0.8, 0.3, 0.2, 0.6, 0.7])
    >>> labels = np.array([1, 0, 1, 0, 1, 0])
    >>> m = pe.metrics.SensitivityAtSpecificity(min_specificity=0.5)
    >>> m = m.update(preds=probs, target=labels)
    >>> round(float(m.compute()), 4)  # the best recall with specificity >= 0.5: 1 / 3
    0.3333
  """

  min_specificity: float = _required_rate()
  _roc_origin = True
  best_rate: ClassVar[str] = "sensitivity"
  bounded_rate: ClassVar[str] = "specificity"


class SpecificityAtSensitivity(RatePoint):
  """The highest specificity at a ROC point whose sensitivity is ``>= min_sensitivity``
  (torchmetrics' ``SpecificityAtSensitivity``; 0 if none qualifies, NaN without positives or
  without negatives).

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> probs = np.array([0.9, 0.8, 0.3, 0.2, 0.6, 0.7])
    >>> labels = np.array([1, 0, 1, 0, 1, 0])
    >>> m = pe.metrics.SpecificityAtSensitivity(min_sensitivity=0.5)
    >>> m = m.update(preds=probs, target=labels)
    >>> round(float(m.compute()), 4)  # the best specificity with recall >= 0.5: 1 / 3
    0.3333
  """

  min_sensitivity: float = _required_rate()
  _roc_origin = True
  best_rate: ClassVar[str] = "specificity"
  bounded_rate: ClassVar[str] = "sensitivity"


class EER(OperatingPoint):
  """Equal error rate: ``(fpr + fnr) / 2`` at the ROC point where ``|fpr - fnr|`` is smallest,
  the first such point from the highest threshold down (torchmetrics' ``EER``:
  ``argmin |fpr - (1 - tpr)|``). Lower is better; NaN without positives or negatives.

  ``|fpr - fnr|`` is compared as ``|fp * P - fn * N|`` (exact below ``P * N = 2**24``; above,
  float32-rounded like torchmetrics' float32 rates), so ties between points are resolved as
  exact rational values, not as rounded rates.

  Example:
    >>> import jax.numpy as jnp
    >>> m = EER(exact=True, capacity=4).update(preds=jnp.array([0.1, 0.4, 0.35, 0.8]),
    ...                                        target=jnp.array([0, 0, 1, 1]))
    >>> float(m.compute())
    0.5
  """

  higher_is_better: ClassVar[bool | None] = False

  _roc_origin = True

  def _value(self, tp, fp, point, total_pos, total_neg):
    fn = total_pos - tp
    gap = jnp.where(point, jnp.abs(fp * total_pos - fn * total_neg), jnp.inf)
    first = jnp.argmin(gap[..., ::-1], -1)  # from the highest threshold down: first wins
    at = lambda x: jnp.take_along_axis(x[..., ::-1], first[..., None], -1)[..., 0]
    value = 0.5 * (_ratio(at(fp), total_neg[:, 0]) + _ratio(at(fn), total_pos[:, 0]))
    return jnp.where((total_pos[:, 0] > 0) & (total_neg[:, 0] > 0), value, jnp.nan)


class LogAUC(OperatingPoint):
  """The area under the ROC curve over ``log10(fpr)`` in ``fpr_range``, divided by the range's
  width in decades (torchmetrics' ``LogAUC``): 1 for a perfect ranking, about
  ``(hi - lo) / ln(10) / log10(hi / lo)`` at chance.

  torchmetrics' definition: the ROC points (and, on them, linearly interpolated points at
  ``fpr = lo`` and ``hi``) are joined by the trapezoid rule in ``(log10 fpr, tpr)``; each ROC
  segment is cut at ``lo`` / ``hi`` here, the same value. NaN without positives or without
  negatives (torchmetrics divides by zero).

  ``num_thresholds``, ``thresholds``, ``exact``, ``capacity``, ``task``, ``num_classes``,
  ``average``, ``from_logits`` and ``ignore_index`` are as for :class:`~padded_eval.metrics.AUROC`
  ([the module docstring][padded_eval.metrics.curves.operating_points] says which points each mode gives; ``exact=True`` is torchmetrics'
  ``thresholds=None``).

  Args:
    fpr_range: ``(lo, hi)`` with ``0 < lo < hi <= 1`` (default ``(0.001, 0.1)``;
      torchmetrics also takes ``lo = 0``, whose logarithm makes its value NaN).

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> probs = np.array([0.9, 0.8, 0.3, 0.2, 0.6, 0.7])
    >>> labels = np.array([1, 0, 1, 0, 1, 0])
    >>> m = pe.metrics.LogAUC(fpr_range=(0.1, 1.0), exact=True, capacity=6)
    >>> round(float(m.update(preds=probs, target=labels).compute()), 4)
    0.4507
  """

  higher_is_better: ClassVar[bool | None] = True

  fpr_range: tuple[float, float] = dataclasses.field(default=(0.001, 0.1), kw_only=True)
  _roc_origin = True

  def _check_config(self):
    super()._check_config()
    bounds = self.fpr_range
    pair = isinstance(bounds, (tuple, list)) and len(bounds) == 2
    numbers = pair and all(validation.is_number(b) for b in bounds)
    if not numbers or not 0 < bounds[0] < bounds[1] <= 1:
      raise ValueError(
        f"fpr_range must be two floats (lo, hi) with 0 < lo < hi <= 1; got {bounds!r}"
      )
    object.__setattr__(self, "fpr_range", (float(bounds[0]), float(bounds[1])))

  def _value(self, tp, fp, point, total_pos, total_neg):
    # each entry that is not a point takes the next point's counts (a higher index: a higher
    # threshold), so consecutive entries are consecutive points or repeats (no width)
    k = tp.shape[-1]
    ids = jnp.where(point, jnp.arange(k), k - 1)
    ids = jax.lax.cummin(ids, axis=ids.ndim - 1, reverse=True)
    tp, fp = (jnp.take_along_axis(x, ids, -1) for x in (tp, fp))
    tpr, fpr = _ratio(tp, total_pos), _ratio(fp, total_neg)
    lo, hi = self.fpr_range
    # segment j joins entry j + 1 (lower rates) to entry j
    f0, f1, t0, t1 = fpr[:, 1:], fpr[:, :-1], tpr[:, 1:], tpr[:, :-1]
    x0, x1 = jnp.clip(f0, lo, hi), jnp.clip(f1, lo, hi)
    width = f1 - f0
    slope = jnp.where(width > 0, (t1 - t0) / jnp.where(width > 0, width, 1.0), 0.0)
    y0, y1 = t0 + slope * (x0 - f0), t0 + slope * (x1 - f0)
    area = (jnp.log10(x1) - jnp.log10(x0)) * 0.5 * (y0 + y1)
    value = jnp.sum(jnp.where(x1 > x0, area, 0.0), -1) / (np.log10(hi) - np.log10(lo))
    return jnp.where((total_pos[:, 0] > 0) & (total_neg[:, 0] > 0), value, jnp.nan)
