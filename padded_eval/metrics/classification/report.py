"""ClassificationReport: scikit-learn's per-class report from one exact confusion state.

The state is the multiclass ``[C, C + 1]`` confusion matrix of
:mod:`padded_eval.metrics.classification.confusion` (exact integer counts, reduced with ``psum``), so
precision, recall, F1 and support of every class, accuracy and the macro and weighted
averages all come from one pass, with the inputs, ``ignore_index`` and invalid counts of
the confusion metrics.
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval.metrics.classification._inputs import divide
from padded_eval.metrics.classification.confusion import ConfusionState
from padded_eval.metrics.classification.scores import f_beta

#: The per-class fields of :meth:`ClassificationReport.report`, in ``compute()``'s order.
FIELDS = ("precision", "recall", "f1-score", "support")


def _divide(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
  """float64 ``numerator / denominator``, 0 where the denominator is 0 (``zero_division=0``)."""
  numerator, denominator = np.asarray(numerator, np.float64), np.asarray(denominator, np.float64)
  return np.divide(numerator, denominator, out=np.zeros_like(numerator), where=denominator > 0)


class ClassificationReport(ConfusionState):
  """Precision, recall, F1 and support per class, with accuracy and averages.

  ``compute()`` is float32 ``[C, 4]``: per class precision, recall, F1 and support
  (rows in class order; all NaN before any counted element; an ``ignore_index`` class
  reads NaN). :meth:`report` gives scikit-learn's ``classification_report(target,
  preds, output_dict=True, zero_division=0)`` dict, computed on the host in float64
  from the exact counts.

  Inputs are those of the multiclass confusion metrics (``preds`` ``[...]`` class ids or
  ``[..., C]`` scores, ``target`` ``[...]`` class ids, ``mask`` a prefix of
  ``target``'s shape); a predicted id outside ``[0, C)`` is a miss of its true class
  (and is counted in ``invalid``).

  Args:
    num_classes: the number of classes, an int >= 2 (the only positional argument).
    ignore_index: a target id whose elements are left out (keyword).

  Example:
    >>> import jax.numpy as jnp
    >>> m = ClassificationReport(3).update(preds=jnp.array([0, 2, 1, 2]),
    ...                                    target=jnp.array([0, 1, 1, 2]))
    >>> report = m.report()
    >>> report["1"]
    {'precision': 1.0, 'recall': 0.5, 'f1-score': 0.6666666666666666, 'support': 2.0}
    >>> report["accuracy"]
    0.75
  """

  higher_is_better: ClassVar[bool | None] = None

  num_classes: int | None = None
  _full_matrix: ClassVar[bool] = True
  _tasks: ClassVar[tuple[str, ...]] = ("multiclass",)

  def compute(self) -> jax.Array:
    tp, fp, fn, _ = self.class_stats()
    precision, recall = divide(tp, tp + fp), divide(tp, tp + fn)
    table = jnp.stack([precision, recall, f_beta(tp, fp, fn, 1.0), tp + fn], axis=-1)
    table = jnp.where(self.included_classes()[:, None], table, jnp.nan)
    return jnp.where(self.seen(), table, jnp.nan)

  def report(self, target_names=None, all_classes: bool = False) -> dict:
    """scikit-learn's ``classification_report(..., output_dict=True, zero_division=0)``.

    Reads the exact counts on the host (after ``masked_eval``, or on a metric updated
    eagerly) and forms every ratio in float64.

    Args:
      target_names: optional names of the listed classes, in class order (default:
        ``str(class id)``).
      all_classes: list every class ``0..C-1`` (scikit-learn with ``labels=range(C)``)
        instead of the classes that occur in the target or the predictions (its default).

    Returns:
      ``{name: {"precision", "recall", "f1-score", "support"}, "accuracy": float,
      "macro avg": {...}, "weighted avg": {...}}``, Python floats; empty before any
      counted element.

    Raises:
      ValueError: ``target_names`` of the wrong length.
    """
    counts = self.confusion.to_numpy()  # int64 [C, C + 1]: rows true, columns predicted
    c = self._classes()
    tp = np.diagonal(counts[:, :c])
    support, predicted = counts.sum(axis=1), counts[:, :c].sum(axis=0)
    listed = np.ones(c, bool) if all_classes else (support + predicted) > 0
    listed &= self.included_classes()
    labels = np.flatnonzero(listed)
    if target_names is None:
      target_names = [str(label) for label in labels]
    elif len(target_names) != len(labels):
      raise ValueError(
        f"target_names has {len(target_names)} names but the report lists {len(labels)} "
        f"classes ({labels.tolist()}); pass one name per listed class"
      )
    if not len(labels) or counts.sum() == 0:
      return {}
    precision, recall = _divide(tp, predicted), _divide(tp, support)
    f1 = _divide(2 * tp, support + predicted)
    rows = np.stack([precision, recall, f1, support.astype(np.float64)], axis=-1)[labels]
    report: dict[str, dict[str, float] | float] = {
      name: dict(zip(FIELDS, map(float, row))) for name, row in zip(target_names, rows)
    }
    weights = support[labels]
    report["accuracy"] = float(_divide(tp[labels].sum(), weights.sum()))
    macro = rows[:, :3].mean(axis=0)
    weighted = _divide((rows[:, :3] * weights[:, None]).sum(axis=0), weights.sum())
    total = float(weights.sum())
    report["macro avg"] = dict(zip(FIELDS, [*map(float, macro), total]))
    report["weighted avg"] = dict(zip(FIELDS, [*map(float, weighted), total]))
    return report
