"""Segmentation overlap beside :class:`~padded_eval.metrics.classification.scores.JaccardIndex`: Dice.

Both are ratios of the exact per-class confusion counts of
:mod:`padded_eval.metrics.classification.confusion` (pixels are elements: ``preds`` ``[B, H, W]`` ids or
``[B, H, W, C]`` scores, ``target`` ``[B, H, W]``, ``mask`` ``[B]`` or ``[B, H, W]``), so
they are summed over the whole dataset before the ratio, never averaged per image or
per batch.
"""

from __future__ import annotations

from padded_eval.metrics.classification.scores import ClassScore, f_beta


class Dice(ClassScore):
  """Dice coefficient ``2 tp / (2 tp + fp + fn)`` (the F1 score of the pixels).

  Configured like :class:`~padded_eval.metrics.classification.scores.JaccardIndex`: for segmentation
  (``task="multiclass"``) the default ``average="macro"`` is the mean Dice over the
  classes present in the target or the predictions; ``average=None`` gives ``[C]``;
  ``ignore_index`` (e.g. 255, or a background class id) removes those pixels, and a class
  id from the mean. Equals scikit-learn ``f1_score`` on the real pixels (and torchmetrics
  ``Dice`` with the same ``average``).

  Example:
    >>> import jax.numpy as jnp
    >>> target = jnp.array([[[0, 1], [1, 1]]])  # [B, H, W] class ids
    >>> preds = jnp.array([[[0, 1], [0, 1]]])
    >>> m = Dice(num_classes=2, average=None).update(preds=preds, target=target)
    >>> [round(float(v), 4) for v in m.compute()]  # 2*1/(2+1), 2*2/(4+1)
    [0.6667, 0.8]
  """

  def _score(self, tp, fp, fn, tn):
    return f_beta(tp, fp, fn, 1.0, self.zero_division)
