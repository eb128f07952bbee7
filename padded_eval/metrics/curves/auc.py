"""AUROC and AUPRC: the areas under the curves of a :class:`~padded_eval.metrics.curves.histogram.ScoreHistogram`.

The state, its bins, the error bound, the tasks and the exact mode are described in
:mod:`padded_eval.metrics.curves.histogram`; the modes of the two areas follow.

Explicit thresholds (``thresholds=[t_0, ..., t_{T-1}]`` strictly increasing in ``[0, 1]``, or
an int ``n``: ``linspace(0, 1, n)``; torchmetrics' ``thresholds=`` meaning): ``T + 1`` bins,
bin ``j`` holding the probabilities (sigmoid of logits with ``from_logits=True``, softmax for
multiclass) with ``j`` thresholds ``<= p`` in float32, so the counts of ``p >= t_k`` are exact.
The value is torchmetrics' binned one, whose curve has points at the thresholds only: AUROC
is the trapezoid over those ROC points (no ``(0, 0)`` / ``(1, 1)`` unless thresholds 1 /
0 put them there; scikit-learn and ``num_thresholds=`` add them), AUPRC
``-sum(diff(recall) * precision[:-1])`` with the point (precision 1, recall 0) appended
(positives below ``t_0`` add no recall). ``error_bound()`` raises (no bound ties that value
to the exact area) and ``exact=True`` with thresholds is refused. ``curve()`` keeps our
layout, one point per non-empty bin at its lower threshold. Where torchmetrics divides by
zero (no positives: AUROC, AUPRC 0 with a warning) the value here is NaN, as everywhere.

Partial AUC (``AUROC(max_fpr=m)``, ``m`` in ``(0, 1]``; scikit-learn's
``roc_auc_score(max_fpr=)``, torchmetrics' binary ``max_fpr``): the area under the ROC
curve up to ``fpr = m`` (the segment crossing ``m`` cut by linear interpolation), McClish-
corrected: ``0.5 * (1 + (A - m**2 / 2) / (m - m**2 / 2))``; ``m = 1`` is the plain area.
Every mode: exact (scikit-learn's value, float32 rounding apart), binned (``error_bound()``
covers it: ``sum (x - a) * (d - c)`` over the clipped segments times McClish's scale), and
with ``thresholds=`` (torchmetrics' binned value; a curve whose first point lies right of
``m`` has area 0 there, where torchmetrics indexes before its curve). It applies per column
for multilabel (scikit-learn does the same) and multiclass one-vs-rest (scikit-learn and
torchmetrics refuse multiclass ``max_fpr``; each class's partial area is McClish-corrected,
then averaged).

Multilabel ``average="samples"`` (AUROC and AUPRC; scikit-learn's meaning): the mean over
rows of each row's area over its labels, computed exactly inside the batch
(:mod:`padded_eval.metrics.curves.samples`); the state is the row values' compensated sum
and the count of rows scored (no histogram). An AUROC row needs a counted positive and a
counted negative label (scikit-learn raises on the others; here they are not rows); an
AUPRC row without a positive scores 0, as in scikit-learn. Not with ``exact=True``,
``thresholds=`` or ``max_fpr``; ``curve()`` is per column and refuses it.

One-vs-one multiclass AUROC (``AUROC(multi_class="ovo")``, ``average="macro"`` or
``"weighted"``; scikit-learn's ``multi_class="ovo"``): the state is a histogram per (score
column, true class), ``C * C`` rows of ``num_thresholds`` bins (:mod:`padded_eval.metrics.
one_vs_one`); each pair of classes that occur scores the mean of its two binary areas,
averaged (``"weighted"``: by the pair's elements). Binned only, within ``error_bound()``.

Sample weights (``weighted=True``; scikit-learn's ``sample_weight``, the update keyword
``weights``, a prefix of ``target``'s shape): each counted element adds its weight to its
bin, so the histograms are float sums (:class:`~padded_eval.exact.accumulate.ExactSum`,
``24 * L * num_thresholds`` bytes instead of 16), summed in float32 within a batch (exact for
integer weights up to ``2**24`` per bin) and compensated across batches and devices; integer
weights give the value of repeated rows, bit for bit. Every average (``"weighted"`` weighs a
class by its positives' weight, as scikit-learn), ``max_fpr`` and ``curve()`` (float64 weighted
sums) read the weighted sums; ``error_bound()`` is the same bound in weighted terms (AUPRC's
lets a positive's own weight tend to 0, so it is a little wider than the unweighted one).
A real element whose weight is negative, NaN or inf is not counted and is reported as the
invalid kind ``"weight negative or not finite"``; weight 0 counts nothing. With
``exact=True`` each kept element keeps its float32 weight too
(:class:`~padded_eval.metrics.curves.exact_scores.WeightedScoreBuffer`, ``9 * L * capacity`` bytes)
and the areas (``max_fpr`` included) and curves are computed from compensated weight sums:
scikit-learn's value, ties included, within 1e-6. Not with ``thresholds=``,
``average="samples"`` or ``multi_class="ovo"`` (a ValueError says why; scikit-learn itself
refuses ``sample_weight`` with ``"ovo"``). Without
``weighted=True`` the state is the integer counts as before and ``weights=`` raises "mask
elements out instead". See :mod:`padded_eval.metrics.curves.weighted`.

Logits given without ``from_logits=True`` are probabilities outside ``[0, 1]``: counted
(nothing can raise under jit) and reported by ``masked_eval`` as such, with "pass
from_logits=True".

OGB's mean average precision (``average="ogb"``, multilabel only): the mean over tasks
(labels) that have at least one positive and one negative counted label of the task's
area, OGB's ``Evaluator`` rule for ogbg-molpcba (``"ap"``) and ogbg-molhiv / molbace /
... (``"rocauc"`` with AUROC); ``average="macro"`` would score a task without negatives
as AP 1.0. NaN when no task qualifies (OGB raises). Under this option ``target`` may be
float with NaN for a missing label (as in OGB's datasets): a NaN label in a real row is
left out of its task, not counted as invalid; 0.0 / 1.0 are the labels and any other
value is an invalid ``"target out of range"``. Int targets work as usual
(``ignore_index`` marks missing labels).

Curves (:meth:`AUROC.curve`, :meth:`AUPRC.curve`) are read on the host from the exact
counts (int64, rates in float64), one point per non-empty bin, with scikit-learn's
conventions (``roc_curve(..., drop_intermediate=False)``, ``precision_recall_curve``), so
the area under the returned curve is ``compute()``. A point's threshold is the *lowest
score of its bin* (:meth:`bin_edges`), in the units of ``preds`` (probabilities, or
logits for binary / multilabel ``from_logits=True``; multiclass: softmax probabilities):
its rates are exactly those of ``score >= threshold`` over the counted elements, except
for scores within float32 rounding of a bin edge (the bins are computed in float32), on
grid scores and on any scores alike. Binning only merges distinct scores of one bin
into one point. Multiclass (one-vs-rest) and multilabel give one curve per class:
``curve()`` -> ``{class id: curve}`` (a class id equal to ``ignore_index`` left out),
``curve(class_index=c)`` one curve, ``curve(class_index="micro")`` the curve of the
summed counts (its area is ``compute()`` with ``average="micro"``).
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval import validation
from padded_eval.exact._floats import frexp, ldexp
from padded_eval.exact.accumulate import ExactCount
from padded_eval.metrics.classification._inputs import check_no_weights, config_field, divide
from padded_eval.metrics.curves import exact_scores, one_vs_one, segments
from padded_eval.metrics.curves import samples as sample_curves
from padded_eval.metrics.curves.histogram import (
  ScoreHistogram,
  column_totals,
  score_elements,
  suffix_sums,
)


class AUROC(ScoreHistogram):
  """Area under the ROC curve from binned scores, or exactly (see [the module docstring][padded_eval.metrics.curves.auc]).

  Args:
    num_thresholds: number of score bins (positional; default 65_537). The binned value is
      within ``error_bound()`` of the exact one: ``|compute() - exact| <= error_bound()``.
    exact: keep every counted element's score (``capacity`` of them per column) and compute
      scikit-learn's ``roc_auc_score`` exactly (ties as half a pair) instead of binning.
      Memory ``5 * L * capacity`` bytes (``9 *`` with ``weighted=True``), ``L`` = 1
      (binary) or ``num_classes``; see :mod:`padded_eval.metrics.curves.exact_scores`.
    capacity: with ``exact=True``, the most elements one column sees (for one call of
      ``masked_eval``: ``len(batches) * batch_size`` rows, times spatial elements); more are
      counted as invalid and the value is NaN. Under ``Bootstrap`` a replica holds each row as
      many times as it is drawn: ``rows + 5 * sqrt(rows)`` fits every replica in practice.
    thresholds: explicit probability thresholds (or an int: ``linspace(0, 1, n)``):
      torchmetrics' binned AUROC at those thresholds (see [the module docstring][padded_eval.metrics.curves.auc]: its curve
      has no other point); not with ``exact=True`` or ``num_thresholds``.
    max_fpr: partial AUC up to this false positive rate, McClish-corrected as
      scikit-learn's ``roc_auc_score(max_fpr=)``; works binned, exact and with thresholds.
    multi_class: ``"ovr"`` (default: one-vs-rest per class) or ``"ovo"`` (one-vs-one over
      class pairs, scikit-learn's; multiclass, ``average`` ``"macro"`` / ``"weighted"``,
      binned; see [the module docstring][padded_eval.metrics.curves.auc]).
    weighted: count each element with its sample ``weights`` (the update keyword, a prefix
      of ``target``'s shape; scikit-learn's ``sample_weight``): weighted per-bin sums, within
      the same ``error_bound()`` in weighted terms, or with ``exact=True`` a weight per kept
      score (``9 * L * capacity`` bytes; scikit-learn's value); ``"ovr"``. Negative, NaN or inf
      weights of real rows are counted as invalid, not used. Default False: ``weights`` are
      refused.

  Examples:
    >>> import jax.numpy as jnp
    >>> m = AUROC().update(preds=jnp.array([0.1, 0.4, 0.35, 0.8]), target=jnp.array([0, 0, 1, 1]))
    >>> round(float(m.compute()), 4)
    0.75
    >>> w = AUROC(weighted=True).update(  # scikit-learn's sample_weight
    ...   preds=jnp.array([0.1, 0.4, 0.35, 0.8]), target=jnp.array([0, 0, 1, 1]),
    ...   weights=jnp.array([1.0, 1.0, 2.0, 1.0]))
    >>> round(float(w.compute()), 4)  # (2 + 1 + 1) / (3 * 2) ordered weighted pairs
    0.6667
  """

  max_fpr: float | None = config_field(default=None)
  multi_class: str = config_field(default="ovr")
  _takes_weights: ClassVar[bool] = True
  _row_value = staticmethod(sample_curves.row_auroc)

  def _check_config(self):
    segments.check_max_fpr(self.max_fpr)
    validation.check_choice("multi_class", self.multi_class, ("ovr", "ovo"))
    super()._check_config()
    if self._pairs():
      others = {"exact": self.exact, "thresholds": self.thresholds, "max_fpr": self.max_fpr}
      given = [k for k, v in others.items() if v not in (None, False)]
      if self.task != "multiclass" or self.average not in one_vs_one.OVO_AVERAGES or given:
        raise ValueError(
          "multi_class='ovo' is for task='multiclass' with average 'macro' or 'weighted' "
          f"(scikit-learn's choices), binned; got task={self.task!r}, average="
          f"{self.average!r}" + (f" and {', '.join(given)}" if given else "")
        )

  def _pairs(self) -> bool:
    return self.multi_class == "ovo"

  def _histogram_rows(self) -> int:
    return self._classes() ** 2 if self._pairs() else super()._histogram_rows()

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    if not self._pairs():
      return super()._batch_state(preds=preds, target=target, mask=mask, weights=weights)
    check_no_weights(weights, self)
    scores, truth, valid, invalid = score_elements(self, preds, target, mask)
    labels = jnp.argmax(truth, axis=-1)
    bins = self._bins(jnp.where(valid, scores, 0.5))
    counts = one_vs_one.pair_histogram(bins, labels, valid, self._classes(), self._bin_count())
    return {"positives": ExactCount.of(counts), "invalid": invalid}

  def _pair_average(self, per_pair) -> jax.Array:
    """``per_pair(positives, negatives) -> [P]`` over the ordered pairs, averaged."""
    pos_rows, neg_rows = one_vs_one.ordered_pairs(self._classes())
    values = per_pair(self.positives[pos_rows], self.positives[neg_rows])
    own = np.arange(self._classes()) * (self._classes() + 1)  # rows a C + a
    counts = self.positives[own].total().sum(-1)
    assert self.average is not None  # _check_config: ovo averages 'macro' or 'weighted'
    return one_vs_one.pair_mean(values, counts, self.included_classes(), self.average)

  def compute(self) -> jax.Array:
    """Scalar float32 (``[C]`` with ``average=None``); NaN where undefined."""
    if self._pairs():
      return self._pair_average(self._area)
    return super().compute()

  def _area(self, positives, negatives):
    pos, neg = positives.total(), negatives.total()
    total_pos, total_neg = column_totals(positives), column_totals(negatives)
    counted = self._counted_bins(last=False)
    if counted is not None:
      pos, neg = jnp.where(counted, pos, 0.0), jnp.where(counted, neg, 0.0)
    above = suffix_sums(positives, inclusive=False)
    if self.max_fpr is None:
      ranked = (neg / jnp.where(total_neg > 0, total_neg, 1.0)) * (above + 0.5 * pos)
      area = jnp.sum(ranked, -1) / jnp.where(total_pos[:, 0] > 0, total_pos[:, 0], 1.0)
    else:
      neg_above = suffix_sums(negatives, inclusive=False)
      terms = segments.partial_terms(neg, pos, neg_above, above, total_neg, total_pos, self.max_fpr)
      area = segments.mcclish(jnp.sum(terms, -1), self.max_fpr)
    return jnp.where((total_pos[:, 0] > 0) & (total_neg[:, 0] > 0), area, jnp.nan)

  def _exact_area(self, buffer):
    if self.max_fpr is None:
      return exact_scores.auroc(buffer)
    g = exact_scores.groups(buffer)
    once = lambda x: jnp.where(g.first, x, 0).astype(jnp.float32)  # one segment per group
    p, n = exact_scores.totals(g)
    neg_above = n - once(g.negatives_below + g.negatives_tied)
    pos_above = p - once(g.positives_below + g.positives_tied)
    terms = segments.partial_terms(
      once(g.negatives_tied),
      once(g.positives_tied),
      once(neg_above),
      once(pos_above),
      n,
      p,
      self.max_fpr,
    )
    area = segments.mcclish(exact_scores.compensated_sum(terms), self.max_fpr)
    defined = (p[:, 0] > 0) & (n[:, 0] > 0) & (buffer.dropped == 0)
    return jnp.where(defined, area, jnp.nan)

  def _partial_tie_share(self, positives, negatives):
    assert self.max_fpr is not None  # only a partial AUC shares its ties
    pos, neg = positives.total(), negatives.total()
    total_pos, total_neg = column_totals(positives), column_totals(negatives)
    neg_above = suffix_sums(negatives, inclusive=False)
    bound = segments.partial_tie_bound(neg, pos, neg_above, total_neg, total_pos, self.max_fpr)
    bound = bound * segments.mcclish_scale(self.max_fpr)
    return jnp.where((total_pos[:, 0] > 0) & (total_neg[:, 0] > 0), bound, jnp.nan)

  def _tie_share(self, positives, negatives):
    pos, neg = positives.total(), negatives.total()
    total_pos, total_neg = column_totals(positives), column_totals(negatives)
    if self.weighted:  # weight sums times powers of two (exact): 1e18 or 1e-25 fit P * N
      (total_pos, pos_exp), (total_neg, neg_exp) = frexp(total_pos), frexp(total_neg)
      pos, neg = ldexp(pos, -pos_exp), ldexp(neg, -neg_exp)
    pairs = total_pos[:, 0] * total_neg[:, 0]
    share = 0.5 * jnp.sum(pos * neg, -1) / jnp.where(pairs > 0, pairs, 1.0)
    return jnp.where(pairs > 0, share, jnp.nan)

  def curve(self, class_index=None):
    """The ROC curve, scikit-learn's ``roc_curve(..., drop_intermediate=False)`` layout.

    Args:
      class_index: ``None`` (binary: the curve; multiclass / multilabel: a dict of
        every class's curve), a class id, or ``"micro"`` (the summed counts).

    Returns:
      ``(fpr, tpr, thresholds)``, float64 numpy ``[n + 1]`` for ``n`` non-empty bins:
      ``thresholds`` decreasing from ``inf`` (the point (0, 0)) to the lowest non-empty
      bin's edge (the point (1, 1)). ``fpr`` is NaN without negatives, ``tpr`` without
      positives. ``np.trapezoid(tpr, fpr)`` is ``compute()`` (float32 rounding apart).

    Raises:
      ValueError: a ``class_index`` that names no counted class, or an unreduced state.
    """

    def one_curve(index):
      tp, fp, thresholds = self._points(index)
      tp, fp = np.concatenate([[0], tp]), np.concatenate([[0], fp])
      return _rate(fp, fp[-1]), _rate(tp, tp[-1]), np.concatenate([[np.inf], thresholds])

    return self._per_class(one_curve, class_index)

  def error_bound(self) -> jax.Array:
    """Bound on ``|compute() - exact AUROC|``: half the share of (positive, negative)
    pairs that fell in one bin, averaged like ``compute()``. 0 with ``binning="linear"`` grid
    scores only if no bin holds both classes, though the result is exact there regardless;
    0 with ``exact=True`` (float32 rounding apart). With ``max_fpr``: ``sum (x - a) * (d - c)``
    over the bins' segments clipped to ``fpr <= max_fpr`` (the staircase inside a bin lies in
    that rectangle), times McClish's scale ``0.5 / (max_fpr - max_fpr**2 / 2)``.

    Raises:
      ValueError: with ``thresholds=`` (torchmetrics' binned value is not bounded).
    """
    if self.exact or self.average == "samples":  # exact values
      return self._exact_error_bound()
    self._check_bound_defined()
    if self._pairs():  # the bound of a mean of pair areas: the mean of their bounds
      return self._pair_average(self._tie_share)
    if self.max_fpr is not None:
      return self._averaged(self._partial_tie_share)
    return self._averaged(self._tie_share)


class AUPRC(ScoreHistogram):
  """Area under the precision-recall curve as average precision (scikit-learn's
  ``average_precision_score``: ``sum_k (R_k - R_{k-1}) P_k`` over thresholds from the
  highest bin down), from binned scores (``|compute() - exact| <= error_bound()``), or
  exactly with ``exact=True`` and ``capacity`` (as for :class:`AUROC`: every counted score
  kept, ``5 * L * capacity`` bytes, thresholds at every distinct score). With
  ``thresholds=[...]``: torchmetrics' binned average precision at those thresholds (see
  [the module docstring][padded_eval.metrics.curves.auc]). ``weighted=True``: scikit-learn's ``sample_weight`` (the update keyword
  ``weights``), binned or exact, as for :class:`AUROC`.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> probs = np.array([0.9, 0.8, 0.3, 0.2, 0.6, 0.7])
    >>> labels = np.array([1, 0, 1, 0, 1, 0])
    >>> m = pe.metrics.AUPRC().update(preds=probs, target=labels)
    >>> round(float(m.compute()), 4)  # average precision: (1 + 2/4 + 3/5) / 3
    0.7
  """

  _takes_weights: ClassVar[bool] = True
  _exact_area = staticmethod(exact_scores.average_precision)
  _row_value = staticmethod(sample_curves.row_average_precision)

  def _area(self, positives, negatives):
    pos = positives.total()
    total_pos = column_totals(positives)[:, 0]
    true_pos, false_pos = suffix_sums(positives), suffix_sums(negatives)
    precision = divide(true_pos, true_pos + false_pos)
    counted = self._counted_bins(last=True)
    if counted is not None:  # positives below the first threshold add no recall
      pos = jnp.where(counted, pos, 0.0)
    area = jnp.sum(pos * precision, -1) / jnp.where(total_pos > 0, total_pos, 1.0)
    return jnp.where(total_pos > 0, area, jnp.nan)

  def _precision_spread(self, positives, negatives):
    pos, neg = positives.total(), negatives.total()
    total_pos = column_totals(positives)[:, 0]
    above_tp, above_fp = suffix_sums(positives, False), suffix_sums(negatives, False)
    binned = divide(above_tp + pos, above_tp + above_fp + pos + neg)
    highest = divide(above_tp + pos, above_tp + above_fp + pos)  # no negative of the bin above
    if self.weighted:  # a positive's own weight may be as small as it likes: a -> 0
      lowest = divide(above_tp, above_tp + above_fp + neg, zero_division=1.0)
    else:  # every negative of the bin above one positive
      lowest = divide(above_tp + 1.0, above_tp + above_fp + 1.0 + neg)
    spread = jnp.maximum(highest - binned, binned - lowest)
    bound = jnp.sum(pos * spread, -1) / jnp.where(total_pos > 0, total_pos, 1.0)
    return jnp.where(total_pos > 0, bound, jnp.nan)

  def error_bound(self) -> jax.Array:
    """Bound on ``|compute() - exact average precision|``, averaged like ``compute()``.

    Every positive of bin ``k`` gets the bin's precision; at its own score its precision
    is ``(T + a) / (T + F + a + b)`` for ``T`` / ``F`` the positives / negatives of the
    bins above, ``a`` in ``[1, pos_k]`` and ``b`` in ``[0, neg_k]`` of its bin, so the
    error is at most ``sum_k pos_k * max(highest_k - binned_k, binned_k - lowest_k) / P``
    (float32 rounding of the sums apart; the result is exact anyway where each bin
    holds one distinct score). 0 with ``exact=True``.
    """
    if self.exact or self.average == "samples":  # exact values
      return self._exact_error_bound()
    self._check_bound_defined()
    return self._averaged(self._precision_spread)

  def curve(self, class_index=None):
    """The precision-recall curve, scikit-learn's ``precision_recall_curve`` layout.

    Args:
      class_index: ``None`` (binary: the curve; multiclass / multilabel: a dict of
        every class's curve), a class id, or ``"micro"`` (the summed counts).

    Returns:
      ``(precision, recall, thresholds)``: float64 numpy ``[n + 1]``, ``[n + 1]`` and
      ``[n]`` for ``n`` non-empty bins, ``thresholds`` increasing (bin edges), the last
      point ``(precision 1, recall 0)`` without a threshold. ``recall`` is NaN without
      positives. ``-sum(diff(recall) * precision[:-1])`` is ``compute()``.

    Raises:
      ValueError: a ``class_index`` that names no counted class, or an unreduced state.
    """

    def one_curve(index):
      tp, fp, thresholds = self._points(index)
      total = tp[-1] if len(tp) else 0
      precision = np.concatenate([(tp / (tp + fp))[::-1], [1.0]])
      recall = np.concatenate([_rate(tp, total)[::-1], [0.0]])
      return precision, recall, thresholds[::-1].copy()

    return self._per_class(one_curve, class_index)


def _rate(counts: np.ndarray, total) -> np.ndarray:
  """float64 ``counts / total``, NaN when ``total`` is 0."""
  if total == 0:
    return np.full(counts.shape, np.nan)
  return counts / np.float64(total)
