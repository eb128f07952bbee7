"""More metrics from the exact confusion counts: StatScores, NPV, balanced accuracy, losses.

Inputs, ``ignore_index``, invalid counts and averages are those of
:mod:`padded_eval.metrics.classification.confusion` (the same :class:`~padded_eval.metrics.classification.confusion.
ConfusionState`); only ``compute`` differs. :class:`ZeroOneLoss` also counts whole
samples (a multilabel sample is wrong when any of its labels is).

Documented differences from the peers:

* ``StatScores(average="macro")`` is refused: torchmetrics returns the per-class
  ``[C, 5]`` counts for it, the same as ``average=None`` here.
* ``BalancedAccuracy`` averages recall over the classes that occur in the target (an
  ignored class id left out), as scikit-learn's ``balanced_accuracy_score``;
  torchmetrics has no such metric (its ``MulticlassAccuracy(average="macro")`` averages
  over classes seen in the target or the predictions).
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp

from padded_eval import validation
from padded_eval.exact.accumulate import ExactCount
from padded_eval.metrics.base import state
from padded_eval.metrics.classification._formatting import (
  class_inputs,
  label_inputs,
  probabilities,
)
from padded_eval.metrics.classification._inputs import (
  ClassificationMetric,
  check_no_weights,
  config_field,
)
from padded_eval.metrics.classification.confusion import ConfusionState
from padded_eval.metrics.classification.scores import ClassScore


class NegativePredictiveValue(ClassScore):
  """``tn / (tn + fn)``: the fraction of predicted negatives that are right (NPV).

  torchmetrics' ``NegativePredictiveValue``; averages, ``zero_division`` and
  ``ignore_index`` as for :class:`~padded_eval.metrics.classification.scores.Precision`.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> probs = np.array([0.9, 0.8, 0.3, 0.2, 0.6, 0.7])
    >>> labels = np.array([1, 0, 1, 0, 1, 0])
    >>> m = pe.metrics.NPV(task="binary").update(preds=probs, target=labels)
    >>> float(m.compute())  # tn / (tn + fn) = 1 / 2
    0.5
  """

  higher_is_better: ClassVar[bool | None] = True

  def _score(self, tp, fp, fn, tn):
    return self._ratio(tn, tn + fn)


NPV = NegativePredictiveValue


class StatScores(ConfusionState):
  """The counts ``[tp, fp, tn, fn, support]`` (torchmetrics' ``StatScores`` layout).

  ``compute()``: float32 ``[5]`` (binary, or ``average="micro"``: summed over the
  classes) or ``[C, 5]`` per class (``average=None``, the default; an ignored class id
  reads NaN). ``support = tp + fn``. NaN before any counted element.

  Args:
    average: ``None`` or ``"micro"`` (``"macro"`` is refused: torchmetrics gives the
      per-class counts for it, use ``None``).

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> preds, labels = np.array([0, 1, 1, 2]), np.array([0, 1, 2, 2])
    >>> m = pe.metrics.StatScores(num_classes=3).update(preds=preds, target=labels)
    >>> np.asarray(m.compute()).astype(int).tolist()  # per class: tp, fp, tn, fn, support
    [[1, 0, 3, 0, 1], [1, 1, 2, 0, 1], [1, 0, 2, 1, 2]]
  """

  higher_is_better: ClassVar[bool | None] = None

  average: str | None = config_field(default=None)

  def _check_config(self):
    super()._check_config()
    validation.check_choice("average", self.average, (None, "micro"))

  def compute(self) -> jax.Array:
    tp, fp, fn, tn = self.class_stats()
    table = jnp.stack([tp, fp, tn, fn, tp + fn], axis=-1)  # [L, 5]
    table = jnp.where(self.included_classes()[:, None], table, jnp.nan)
    if self.task == "binary":
      table = table[0]
    elif self.average == "micro":
      table = jnp.nansum(table, axis=0)
    return jnp.where(self.seen(), table, jnp.nan)


class BalancedAccuracy(ConfusionState):
  """Mean recall over the classes in the target (scikit-learn's ``balanced_accuracy_score``).

  Binary: the mean of recall and specificity (scikit-learn on labels ``{0, 1}``; a
  class absent from the target is left out). With ``adjusted=True`` chance scores 0:
  ``(score - 1 / K) / (1 - 1 / K)`` over the ``K`` classes in the target; with one class in
  the target that divides by 0, as in scikit-learn: -inf, or NaN when every row is right.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> preds, labels = np.array([1, 0, 0, 0, 0, 1]), np.array([1, 1, 0, 0, 0, 0])  # 2 positives
    >>> m = pe.metrics.BalancedAccuracy(task="binary").update(preds=preds, target=labels)
    >>> float(m.compute())  # the mean of recall 1/2 and specificity 3/4 (accuracy: 4/6)
    0.625
  """

  higher_is_better: ClassVar[bool | None] = True

  adjusted: bool = config_field(default=False)
  _tasks: ClassVar[tuple[str, ...]] = ("binary", "multiclass")

  def _check_config(self):
    super()._check_config()
    validation.check_flag("adjusted", self.adjusted)

  def compute(self) -> jax.Array:
    tp, fp, fn, tn = self.class_stats()
    if self.task == "binary":  # the classes 1 and 0
      hits, support = jnp.concatenate([tp, tn]), jnp.concatenate([tp + fn, tn + fp])
    else:
      hits, support = tp, jnp.where(self.included_classes(), tp + fn, 0.0)
    present = support > 0
    recall = jnp.where(present, hits / jnp.where(present, support, 1.0), 0.0)
    classes = jnp.sum(present)
    value = jnp.sum(recall) / jnp.maximum(classes, 1)
    if self.adjusted:  # one class: 1 - chance is 0, so -inf (or NaN if every row is right)
      chance = 1.0 / jnp.maximum(classes, 1)
      value = jnp.where(classes > 0, (value - chance) / (1.0 - chance), 0.0)
    return jnp.where(self.seen(), value, jnp.nan)


class HammingLoss(ConfusionState):
  """The fraction of wrong elements (scikit-learn's ``hamming_loss``).

  Multilabel: wrong labels over all counted labels, ``sum(fp + fn) / sum(tp + fp + fn
  + tn)``; multiclass and binary: wrong predictions over counted elements (``1 -
  accuracy``). Lower is better.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> probs = np.array([[0.9, 0.2], [0.6, 0.7], [0.1, 0.8]])  # 3 rows of 2 labels
    >>> labels = np.array([[1, 0], [0, 1], [1, 1]])
    >>> m = pe.metrics.HammingLoss(task="multilabel", num_classes=2)
    >>> round(float(m.update(preds=probs, target=labels).compute()), 4)  # 2 of 6 labels wrong
    0.3333
  """

  higher_is_better: ClassVar[bool | None] = False

  def compute(self) -> jax.Array:
    tp, fp, fn, tn = (jnp.sum(s) for s in self.class_stats())
    if self.task == "multiclass":  # a wrong element is one fn of its true class
      value = fn / jnp.maximum(tp + fn, 1.0)
    else:
      value = (fp + fn) / jnp.maximum(tp + fp + fn + tn, 1.0)
    return jnp.where(self.seen(), value, jnp.nan)


def _zero_one_empty(metric) -> ExactCount:
  return ExactCount.zeros((2,))


class ZeroOneLoss(ClassificationMetric):
  """The fraction of samples not predicted exactly (scikit-learn's ``zero_one_loss``).

  A sample is one element (multiclass, binary) or one ``[C]`` row of labels
  (multilabel: wrong when any counted label is wrong; a row with no counted label is
  not a sample). Configuration (``task``, ``num_classes``, ``threshold``,
  ``from_logits``, ``ignore_index``) and inputs as for the confusion metrics. Lower is
  better. ``compute()``: scalar float32; NaN before any sample.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> probs = np.array([[0.9, 0.2], [0.6, 0.7], [0.1, 0.8]])  # 3 rows of 2 labels
    >>> labels = np.array([[1, 0], [0, 1], [1, 1]])
    >>> loss = pe.metrics.ZeroOneLoss(task="multilabel", num_classes=2)
    >>> loss = loss.update(preds=probs, target=labels)
    >>> round(float(loss.compute()), 4)  # rows 2 and 3 have a wrong label (Hamming: 2 of 6)
    0.6667
  """

  higher_is_better: ClassVar[bool | None] = False

  threshold: float = config_field(default=0.5)
  samples: ExactCount = state(_zero_one_empty)  # [wrong, counted]

  def _check_config(self):
    super()._check_config()
    validation.check_probability("threshold", self.threshold)

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    check_no_weights(weights, self)
    inputs, invalid = self.elements(preds, target, mask)
    if self.task == "multiclass":
      classes = class_inputs(inputs)
      wrong = classes.top_k(1)[..., 0] != classes.labels
      counted = classes.valid
    else:
      elements = label_inputs(inputs)
      guess = probabilities(elements.scores, self.from_logits) > self.threshold
      wrong = jnp.any(elements.valid & (guess != elements.truth), axis=-1)
      counted = jnp.any(elements.valid, axis=-1)
    counts = jnp.stack(
      [jnp.sum(counted & wrong, dtype=jnp.int32), jnp.sum(counted, dtype=jnp.int32)]
    )
    return {"samples": ExactCount.of(counts), "invalid": invalid}

  def compute(self) -> jax.Array:
    wrong, counted = self.samples.total()
    return jnp.where(counted > 0, wrong / jnp.maximum(counted, 1.0), jnp.nan)
