"""Per-class scores from the exact confusion counts: Precision, Recall, F-scores, ...

:class:`ClassScore` turns the per-class counts of
:class:`~padded_eval.metrics.classification.confusion.ConfusionState` into one ratio per class and
averages it; its subclasses define only ``_score``. Inputs, ``ignore_index``, the
averages, the per-sample modes, ``labels``, ``weighted`` and the differences from the
peers are described in :mod:`padded_eval.metrics.classification.confusion`.
"""

from __future__ import annotations

import abc
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval import validation
from padded_eval.exact.accumulate import ExactCount, ExactSum
from padded_eval.metrics.base import state
from padded_eval.metrics.classification import per_sample
from padded_eval.metrics.classification._inputs import (
  AVERAGES,
  average_scores,
  check_labels,
  check_no_weights,
  check_zero_division,
  config_field,
  divide,
)
from padded_eval.metrics.classification.confusion import ConfusionState
from padded_eval.metrics.classification.per_sample import MULTIDIM_AVERAGES


class ClassScore(ConfusionState):
  """A per-class ratio of counts, averaged by ``average``; subclasses define ``_score``.

  ``labels``: a subset of class ids (scikit-learn's ``labels=``): only they are scored
  and averaged (``"macro"`` over all of them, present or not, as scikit-learn does with
  explicit labels; ``average=None`` reads NaN for the others); multiclass and
  multilabel.

  ``weighted=True``: each element counts with its sample ``weights`` (the update
  keyword, a prefix of ``target``'s shape; scikit-learn's ``sample_weight``), in
  compensated float sums (:class:`~padded_eval.exact.accumulate.ExactSum`) instead of
  integer counts; without it, ``weights`` are refused. An element of weight 0 is not seen:
  a class that occurs only in rows of weight 0 is left out of the ``"macro"`` average, where
  scikit-learn (which reads the classes off the data, whatever their weights) keeps it;
  ``labels=`` names the classes to average over.

  ``zero_division``: the score of an undefined ratio (a zero denominator): 0 (default),
  1 or ``float("nan")``, scikit-learn's meaning; NaN scores are left out of the
  ``"macro"`` and ``"weighted"`` means (scikit-learn's ``_nanaverage``).
  """

  higher_is_better: ClassVar[bool | None] = True

  average: str | None = config_field(default="macro")
  zero_division: float = config_field(default=0.0)
  multidim_average: str = config_field(default="global")
  labels: tuple[int, ...] | None = config_field(default=None)
  weighted: bool = config_field(default=False)
  sample_scores: ExactSum = state(lambda self: ExactSum.zeros(self._sample_shape()))
  samples: ExactCount = state(lambda self: ExactCount.zeros(self._sample_shape()))
  _allow_nan: ClassVar[bool] = True  # zero_division=nan accepted

  def _check_config(self):
    super()._check_config()
    validation.check_choice("average", self.average, AVERAGES + ("samples",))
    validation.check_choice("multidim_average", self.multidim_average, MULTIDIM_AVERAGES)
    if self.average == "samples" and self.task != "multilabel":
      raise ValueError(
        f"average='samples' is for task='multilabel' (one score per row of labels); got "
        f"task={self.task!r}. Use multidim_average='samplewise' for one score per row"
      )
    if self.average == "samples" and self.multidim_average == "samplewise":
      raise ValueError(
        "average='samples' and multidim_average='samplewise' are two meanings of a sample; "
        "choose one"
      )
    check_zero_division(self.zero_division, allow_nan=self._allow_nan)
    # one NaN object, so equal configurations compare equal (jit's cache key)
    canonical = math.nan if np.isnan(self.zero_division) else float(self.zero_division)
    object.__setattr__(self, "zero_division", canonical)
    if self.labels is not None:
      object.__setattr__(self, "labels", check_labels(self.labels, self.task, self.num_classes))
    validation.check_flag("weighted", self.weighted)
    if self.weighted and self._per_sample():
      raise ValueError(
        "weighted=True counts elements with their sample weights over the whole dataset; "
        "it does not combine with multidim_average='samplewise' or average='samples'"
      )

  def _empty_confusion(self):
    if self.weighted:  # float weights: compensated sums, not integer counts
      return ExactSum.zeros(self._counts_shape())
    return super()._empty_confusion()

  def included_classes(self) -> jax.Array:
    """bool ``[L]``: the ``labels`` (all by default), less a multiclass ``ignore_index``."""
    included = super().included_classes()
    if self.labels is not None:
      included = included & jnp.isin(jnp.arange(included.shape[0]), jnp.asarray(self.labels))
    return included

  def _per_sample(self) -> bool:
    return self.multidim_average == "samplewise" or self.average == "samples"

  def _sample_shape(self) -> tuple[int, ...]:
    if self._per_sample() and self.average is None and self.task != "binary":
      return (self._classes(),)
    return ()

  def _ratio(self, numerator, denominator) -> jax.Array:
    return divide(numerator, denominator, float(self.zero_division))

  @abc.abstractmethod
  def _score(self, tp, fp, fn, tn) -> jax.Array:
    """The score from counts (any shape; ``zero_division`` where undefined)."""

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    if self.weighted:
      elements, invalid = self.elements(preds, target, mask, weights)
      counts = per_sample.weighted_counts(self, elements, weights)
      return {"confusion": ExactSum.of(counts), "invalid": invalid}
    if not self._per_sample():
      return super()._batch_state(preds=preds, target=target, mask=mask, weights=weights)
    check_no_weights(weights, self)
    elements, invalid = self.elements(preds, target, mask)
    counts = per_sample.sample_counts(self, elements)  # [S, 4, L]
    scores, scored = per_sample.sample_scores(self, counts)
    return {
      "confusion": ExactCount.of(jnp.sum(counts, axis=0)),
      "sample_scores": ExactSum.of_sum(scores, axis=0, where=scored),
      "samples": ExactCount.of(jnp.sum(scored, axis=0, dtype=jnp.int32)),
      "invalid": invalid,
    }

  def sample_values(self, *, preds, target, mask=None) -> jax.Array:
    """Each sample's score, float32 ``[S]`` (``[S, C]`` with ``average=None``), NaN where a
    sample has no counted element: torchmetrics' ``multidim_average="samplewise"`` output
    (``S = B`` rows), or scikit-learn's per-sample scores of ``average="samples"`` (``S``
    label rows). Use it for per-row outputs (``masked_eval(..., outputs=True)``).
    """
    elements, _ = self.elements(preds, target, mask)
    counts = per_sample.sample_counts(self, elements)
    scores, _ = per_sample.sample_scores(self, counts)
    counted = jnp.sum(counts, axis=(1, 2)) > 0
    return jnp.where(counted if scores.ndim == 1 else counted[:, None], scores, jnp.nan)

  def averaged(self, tp, fp, fn, tn) -> jax.Array:
    """The ``average``d score of per-class counts ``[L]`` each (no NaN for "nothing seen")."""
    included = self.included_classes()
    if self.task == "binary":
      return self._score(tp, fp, fn, tn)[0]
    if self.average in ("micro", "samples"):  # "samples": micro over one sample's labels
      return self._score(*(jnp.sum(jnp.where(included, s, 0.0)) for s in (tp, fp, fn, tn)))
    per_class = self._score(tp, fp, fn, tn)
    if self.average is None:
      return jnp.where(included, per_class, jnp.nan)
    present = included
    if self.task == "multiclass" and self.labels is None:  # in the target or the predictions
      present = included & (tp + fp + fn > 0)
    support = None if self.average == "macro" else tp + fn
    return average_scores(per_class, present, support)

  def compute(self) -> jax.Array:
    """Scalar (``[C]`` with ``average=None``) float32; NaN if no element was counted.

    Per sample (``multidim_average="samplewise"``, ``average="samples"``): the mean of
    the sample scores (per class with ``average=None``), NaN when there is none.
    """
    if self._per_sample():
      count = self.samples.total()
      return jnp.where(count > 0, self.sample_scores.total() / jnp.maximum(count, 1.0), jnp.nan)
    value = self.averaged(*self.class_stats())
    return jnp.where(self.seen(), value, jnp.nan)


# --- the metrics -----------------------------------------------------------------------


def f_beta(tp, fp, fn, beta: float, zero_division: float = 0.0) -> jax.Array:
  """``(1 + b^2) tp / ((1 + b^2) tp + b^2 fn + fp)``, ``zero_division`` where undefined.

  ``beta=0`` is precision and ``beta=inf`` recall (scikit-learn's limits).
  """
  if beta == 0:
    return divide(tp, tp + fp, zero_division)
  if np.isposinf(beta):
    return divide(tp, tp + fn, zero_division)
  if beta > 1:  # divided through by b^2: (1 + b^2) overflows float32 beyond b = 1.8e19
    inverse = 1.0 / (beta * beta)
    scale = 1.0 + inverse
    return divide(scale * tp, scale * tp + fn + inverse * fp, zero_division)
  scale = 1.0 + beta * beta
  return divide(scale * tp, scale * tp + beta * beta * fn + fp, zero_division)


class Precision(ClassScore):
  """``tp / (tp + fp)``: the fraction of predicted positives that are right.

  Examples:
    >>> import jax.numpy as jnp
    >>> m = Precision(task="binary").update(preds=jnp.array([0.9, 0.8, 0.1]),
    ...                                     target=jnp.array([1, 0, 1]))
    >>> float(m.compute())
    0.5
  """

  def _score(self, tp, fp, fn, tn):
    return self._ratio(tp, tp + fp)


class Recall(ClassScore):
  """``tp / (tp + fn)``: the fraction of true positives found (sensitivity).

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> preds, labels = np.array([0, 2, 1, 1, 0, 2]), np.array([0, 1, 1, 2, 0, 2])  # class ids
    >>> m = pe.metrics.Recall(num_classes=3, average=None).update(preds=preds, target=labels)
    >>> m.compute().tolist()  # per class: 2 of 2, 1 of 2, 1 of 2 found
    [1.0, 0.5, 0.5]
  """

  def _score(self, tp, fp, fn, tn):
    return self._ratio(tp, tp + fn)


class Specificity(ClassScore):
  """``tn / (tn + fp)``: the fraction of true negatives found.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> probs = np.array([0.9, 0.8, 0.3, 0.2, 0.6, 0.7])
    >>> labels = np.array([1, 0, 1, 0, 1, 0])
    >>> m = pe.metrics.Specificity(task="binary").update(preds=probs, target=labels)
    >>> round(float(m.compute()), 4)  # tn / (tn + fp) = 1 / 3
    0.3333
  """

  def _score(self, tp, fp, fn, tn):
    return self._ratio(tn, tn + fp)


class F1Score(ClassScore):
  """Harmonic mean of precision and recall, ``2 tp / (2 tp + fn + fp)``.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> probs = np.array([[0.9, 0.2], [0.6, 0.7], [0.1, 0.8]])  # 3 rows of 2 labels
    >>> labels = np.array([[1, 0], [0, 1], [1, 1]])
    >>> m = pe.metrics.F1Score(task="multilabel", num_classes=2, average="micro")
    >>> float(m.update(preds=probs, target=labels).compute())  # 2 tp / (2 tp + fp + fn) = 6 / 8
    0.75
  """

  def _score(self, tp, fp, fn, tn):
    return f_beta(tp, fp, fn, 1.0, float(self.zero_division))


class FBetaScore(ClassScore):
  """``(1 + b^2) tp / ((1 + b^2) tp + b^2 fn + fp)``; recall weighs ``beta`` times more.

  Args:
    beta: a float ``>= 0`` (the only positional argument); ``0`` is precision and
      ``float("inf")`` recall, as in scikit-learn.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> logits = np.array([[2.0, 0.5, 0.1], [0.2, 1.5, 0.3], [0.1, 0.2, 0.9], [1.0, 1.2, 0.0]])
    >>> labels = np.array([0, 1, 1, 0])  # predicted: 0, 1, 2, 1
    >>> m = pe.metrics.FBetaScore(beta=0.5, num_classes=3, average="weighted")
    >>> round(float(m.update(preds=logits, target=labels).compute()), 4)  # (1 + 1/3) / 2
    0.6667
  """

  beta: float = 1.0

  def _check_config(self):
    super()._check_config()
    beta = self.beta
    if not validation.is_number(beta) or not beta >= 0:
      raise ValueError(
        f"beta must be a number >= 0 (0: precision, float('inf'): recall); got {beta!r}"
      )
    object.__setattr__(self, "beta", float(beta))  # numpy numbers too: one jit cache key

  def _score(self, tp, fp, fn, tn):
    return f_beta(tp, fp, fn, float(self.beta), float(self.zero_division))


class JaccardIndex(ClassScore):
  """Intersection over union ``tp / (tp + fp + fn)``, over the whole dataset.

  For segmentation (``task="multiclass"``, ``preds`` ``[B, H, W]`` ids or ``[B, H, W, C]``
  scores, ``target`` ``[B, H, W]``, ``mask`` ``[B]`` or ``[B, H, W]``) the default
  ``average="macro"`` is the mIoU over classes present; ``ignore_index`` (e.g. 255, or a
  background class id) removes those pixels, and a class id from the mean.
  ``zero_division`` is 0 or 1, as in scikit-learn's ``jaccard_score`` (which refuses
  NaN).

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> pred_ids = np.array([[[0, 1], [0, 1]]])  # one 2x2 image of class ids
    >>> true_ids = np.array([[[0, 1], [1, 1]]])
    >>> m = pe.metrics.JaccardIndex(num_classes=2).update(preds=pred_ids, target=true_ids)
    >>> round(float(m.compute()), 4)  # mIoU: (1/2 + 2/3) / 2
    0.5833
  """

  _allow_nan: ClassVar[bool] = False

  def _score(self, tp, fp, fn, tn):
    return self._ratio(tp, tp + fp + fn)
