"""Classification metrics from one exact confusion state.

Precision, recall and F-scores cannot be averaged per batch; they need counts.
Every metric here keeps exact integer counts (:class:`~padded_eval.accumulate.ExactCount`,
exact past ``2**31``, reduced with ``psum``) and differs from the others only in
``compute``:

* per-class counts ``[4, L]`` (rows tp, fp, fn, tn; ``L`` = 1 for binary, else
  ``num_classes``) for Precision, Recall, F-scores, Specificity and JaccardIndex;
* the full ``[C, C]`` matrix (rows true class, columns predicted) for multiclass
  ConfusionMatrix, MatthewsCorrCoef and CohenKappa.

Inputs (``task``):

* ``"binary"``: ``preds`` ``[...]`` probabilities (or logits with ``from_logits=True``,
  or hard 0/1 ints), positive where the probability (``sigmoid`` of logits) is
  ``> threshold``; ``target`` ``[...]`` 0/1.
* ``"multiclass"``: ``preds`` ``[...]`` int class ids or ``[..., C]`` scores (argmax, or
  the ``top_k`` best); ``target`` ``[...]`` int class ids (segmentation: ``[B, H, W]``).
* ``"multilabel"``: ``preds`` ``[..., C]`` probabilities / logits / 0-1; ``target``
  ``[..., C]`` 0/1.

``mask`` is a prefix of ``target``'s shape (``[B]`` or ``[B, H, W]``). An element
counts when it is real, its target is a valid label (0/1, or a class id in
``[0, C)``) and its target is not ``ignore_index``; class-id ``preds`` must also be
in ``[0, C)``. Everything else is dropped from every count, with ``where``, so NaN
or garbage in padded rows never arrives.

``ignore_index``: elements whose target equals it are removed from every statistic
(never counted as negatives). If it is a class id (``0 <= ignore_index < C``,
multiclass), that class is also left out of every average (micro sums, macro and
weighted means) and reads NaN with ``average=None``; predictions of it on other
elements are then misses of their true class only. This equals scikit-learn on the
elements kept with ``labels=[every class but ignore_index]`` (the torchmetrics bug
#1691, where the ignored class counted as a 0 in macro averages, cannot happen).

Averages: ``"micro"`` scores the summed counts; ``"macro"`` is the mean over classes
that occur in the target or the predictions (scikit-learn's default ``labels``);
``"weighted"`` weights classes by their support (true count); ``None`` gives the
``[C]`` per-class scores. Undefined ratios count as 0 (``zero_division=0``). With
``task="binary"`` ``average`` is not used: the positive class is scored. A metric
that has seen no counted element computes NaN.

Counts are of elements: sample ``weights`` are not supported (``ValueError``).
"""

from __future__ import annotations

import abc
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval.accumulate import ExactCount
from padded_eval.metrics.base import Metric, check_choice, state
from padded_eval.metrics.classification_inputs import (
  AVERAGES,
  MAX_MATRIX_CLASSES,
  check_flag,
  check_ignore_index,
  check_no_weights,
  check_task,
  class_counts,
  class_inputs,
  divide,
  label_counts,
  label_inputs,
  matrix_counts,
  num_columns,
)

# --- the shared state ------------------------------------------------------------------


def _config(default):
  """A keyword-only configuration field."""
  return dataclasses.field(default=default, kw_only=True)


class ConfusionState(Metric):
  """Base of the confusion-count metrics: configuration, inputs and exact counts.

  Subclasses define ``compute`` from :meth:`class_stats` (or :meth:`matrix`); the
  class attribute ``_full_matrix`` asks for ``[C, C]`` counts in the multiclass task.
  Configuration fields are keyword-only (see the module docstring for their meaning).
  """

  num_classes: int | None = _config(None)
  task: str = _config("multiclass")
  threshold: float = _config(0.5)
  top_k: int = _config(1)
  ignore_index: int | None = _config(None)
  from_logits: bool = _config(False)
  confusion: ExactCount = state(lambda self: ExactCount.zeros(self._counts_shape()))

  _full_matrix = False

  def _uses_matrix(self) -> bool:
    return self._full_matrix and self.task == "multiclass"

  def _counts_shape(self) -> tuple[int, ...]:
    if self._uses_matrix():
      return (self.num_classes, self.num_classes)
    return (4, num_columns(self.task, self.num_classes))

  def _check_config(self):
    check_task(self.task, self.num_classes)
    if not isinstance(self.threshold, (int, float)) or not 0 <= self.threshold <= 1:
      raise ValueError(f"threshold must be a probability in [0, 1]; got {self.threshold!r}")
    if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1:
      raise ValueError(f"top_k must be a positive int; got {self.top_k!r}")
    if self.top_k > 1 and (self.task != "multiclass" or self._full_matrix):
      raise ValueError(
        f"top_k={self.top_k} is for task='multiclass' Precision, Recall, "
        f"F-scores, Specificity and JaccardIndex; {type(self).__name__} with "
        f"task={self.task!r} takes top_k=1"
      )
    if self.task == "multiclass" and self.top_k > self.num_classes:
      raise ValueError(f"top_k={self.top_k} exceeds num_classes={self.num_classes}")
    if self._uses_matrix() and self.num_classes > MAX_MATRIX_CLASSES:
      raise ValueError(
        f"num_classes={self.num_classes} is too many for a [C, C] matrix; "
        f"expected at most {MAX_MATRIX_CLASSES}"
      )
    check_ignore_index(self.ignore_index)
    check_flag("from_logits", self.from_logits)

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    check_no_weights(weights, self)
    if self.task != "multiclass":
      truth, guess, valid = label_inputs(
        preds,
        target,
        mask,
        task=self.task,
        num_classes=self.num_classes,
        threshold=self.threshold,
        from_logits=self.from_logits,
        ignore_index=self.ignore_index,
      )
      return {"confusion": ExactCount.of(label_counts(truth, guess, valid))}
    labels, predicted, valid = class_inputs(
      preds,
      target,
      mask,
      num_classes=self.num_classes,
      top_k=self.top_k,
      ignore_index=self.ignore_index,
    )
    if self._uses_matrix():
      counts = matrix_counts(labels, predicted, valid, self.num_classes)
    else:
      counts = class_counts(labels, predicted, valid, self.num_classes)
    return {"confusion": ExactCount.of(counts)}

  # --- views of the counts (float32) ---

  def class_stats(self) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """``(tp, fp, fn, tn)``, float32 ``[L]`` each (``L`` = 1 for binary)."""
    counts = self.confusion.total()
    if not self._uses_matrix():
      return counts[0], counts[1], counts[2], counts[3]
    tp = jnp.diagonal(counts)
    fp = jnp.sum(counts, axis=0) - tp
    fn = jnp.sum(counts, axis=1) - tp
    return tp, fp, fn, jnp.sum(counts) - tp - fp - fn

  def matrix(self) -> jax.Array:
    """float32 confusion matrix: ``[C, C]`` multiclass, ``[2, 2]`` binary and summed
    over the labels of a multilabel task (rows true, columns predicted)."""
    if self._uses_matrix():
      return self.confusion.total()
    tp, fp, fn, tn = (jnp.sum(s) for s in self.class_stats())
    return jnp.stack([jnp.stack([tn, fp]), jnp.stack([fn, tp])])

  def included_classes(self) -> jax.Array:
    """bool ``[L]``: False only for a multiclass ``ignore_index`` that is a class id."""
    columns = num_columns(self.task, self.num_classes)
    included = np.ones(columns, bool)
    if (
      self.task == "multiclass"
      and self.ignore_index is not None
      and (0 <= self.ignore_index < columns)
    ):
      included[self.ignore_index] = False
    return jnp.asarray(included)

  def seen(self) -> jax.Array:
    """Whether any element was counted."""
    return jnp.sum(self.confusion.total()) > 0


class ClassScore(ConfusionState):
  """A per-class ratio of counts, averaged by ``average``; subclasses define ``_score``."""

  average: str | None = _config("macro")

  def _check_config(self):
    super()._check_config()
    check_choice("average", self.average, AVERAGES)

  @abc.abstractmethod
  def _score(self, tp, fp, fn, tn) -> jax.Array:
    """The score from counts (any shape; 0 where undefined)."""

  def compute(self) -> jax.Array:
    """Scalar (``[C]`` with ``average=None``) float32; NaN if no element was counted."""
    tp, fp, fn, tn = self.class_stats()
    included = self.included_classes()
    if self.task == "binary":
      value = self._score(tp, fp, fn, tn)[0]
    elif self.average == "micro":
      value = self._score(*(jnp.sum(jnp.where(included, s, 0.0)) for s in (tp, fp, fn, tn)))
    else:
      per_class = self._score(tp, fp, fn, tn)
      if self.average is None:
        value = jnp.where(included, per_class, jnp.nan)
      elif self.average == "macro":
        present = included & (tp + fp + fn > 0)
        value = divide(jnp.sum(jnp.where(present, per_class, 0.0)), jnp.sum(present))
      else:
        support = jnp.where(included, tp + fn, 0.0)
        value = divide(jnp.sum(support * per_class), jnp.sum(support))
    return jnp.where(self.seen(), value, jnp.nan)


# --- the metrics -----------------------------------------------------------------------


def f_beta(tp, fp, fn, beta: float) -> jax.Array:
  """``(1 + b^2) tp / ((1 + b^2) tp + b^2 fn + fp)``, 0 where undefined."""
  scale = 1.0 + beta * beta
  return divide(scale * tp, scale * tp + beta * beta * fn + fp)


class Precision(ClassScore):
  """``tp / (tp + fp)``: the fraction of predicted positives that are right.

  Example:
    >>> import jax.numpy as jnp
    >>> m = Precision(task="binary").update(preds=jnp.array([0.9, 0.8, 0.1]),
    ...                                     target=jnp.array([1, 0, 1]))
    >>> float(m.compute())
    0.5
  """

  def _score(self, tp, fp, fn, tn):
    return divide(tp, tp + fp)


class Recall(ClassScore):
  """``tp / (tp + fn)``: the fraction of true positives found (sensitivity)."""

  def _score(self, tp, fp, fn, tn):
    return divide(tp, tp + fn)


class Specificity(ClassScore):
  """``tn / (tn + fp)``: the fraction of true negatives found."""

  def _score(self, tp, fp, fn, tn):
    return divide(tn, tn + fp)


class F1Score(ClassScore):
  """Harmonic mean of precision and recall, ``2 tp / (2 tp + fn + fp)``."""

  def _score(self, tp, fp, fn, tn):
    return f_beta(tp, fp, fn, 1.0)


class FBetaScore(ClassScore):
  """``(1 + b^2) tp / ((1 + b^2) tp + b^2 fn + fp)``; recall weighs ``beta`` times more.

  Args:
    beta: a positive float (the only positional argument).
  """

  beta: float = 1.0

  def _check_config(self):
    super()._check_config()
    if isinstance(self.beta, bool) or not isinstance(self.beta, (int, float)) or not self.beta > 0:
      raise ValueError(f"beta must be a positive float; got {self.beta!r}")

  def _score(self, tp, fp, fn, tn):
    return f_beta(tp, fp, fn, float(self.beta))


class JaccardIndex(ClassScore):
  """Intersection over union ``tp / (tp + fp + fn)``, over the whole dataset.

  For segmentation (``task="multiclass"``, ``preds`` ``[B, H, W]`` ids or ``[B, H, W, C]``
  scores, ``target`` ``[B, H, W]``, ``mask`` ``[B]`` or ``[B, H, W]``) the default
  ``average="macro"`` is the mIoU over classes present; ``ignore_index`` (e.g. 255, or a
  background class id) removes those pixels, and a class id from the mean.
  """

  def _score(self, tp, fp, fn, tn):
    return divide(tp, tp + fp + fn)


NORMALIZE = (None, "true", "pred", "all")


class ConfusionMatrix(ConfusionState):
  """Confusion counts, rows true class, columns predicted (scikit-learn convention).

  ``compute()``: float32 ``[C, C]`` (multiclass), ``[2, 2]`` ``[[tn, fp], [fn, tp]]``
  (binary) or ``[C, 2, 2]`` per label (multilabel, like ``multilabel_confusion_matrix``);
  all NaN before any counted element. :meth:`counts` gives exact int64 counts on the host.

  Args:
    num_classes: the number of classes (the only positional argument; ``None`` for binary).
    normalize: ``None`` (counts), ``"true"`` (rows sum to 1), ``"pred"`` (columns sum to
      1) or ``"all"``; an all-zero row or column stays 0.
  """

  num_classes: int | None = None
  normalize: str | None = _config(None)
  _full_matrix = True

  def _check_config(self):
    super()._check_config()
    check_choice("normalize", self.normalize, NORMALIZE)

  def _layout(self, counts):
    if self.task == "multiclass":
      return counts
    tp, fp, fn, tn = counts
    table = jnp.stack([jnp.stack([tn, fp], -1), jnp.stack([fn, tp], -1)], -2)  # [L, 2, 2]
    return table[0] if self.task == "binary" else table

  def counts(self) -> np.ndarray:
    """The exact counts as an int64 numpy array (host side), in ``compute()``'s layout."""
    counts = self.confusion.to_numpy()
    if self.task == "multiclass":
      return counts
    tp, fp, fn, tn = counts
    table = np.stack([np.stack([tn, fp], -1), np.stack([fn, tp], -1)], -2)
    return table[0] if self.task == "binary" else table

  def compute(self) -> jax.Array:
    table = self._layout(self.confusion.total())
    if self.normalize == "true":
      table = divide(table, jnp.sum(table, axis=-1, keepdims=True))
    elif self.normalize == "pred":
      table = divide(table, jnp.sum(table, axis=-2, keepdims=True))
    elif self.normalize == "all":
      table = divide(table, jnp.sum(table, axis=(-2, -1), keepdims=True))
    return jnp.where(self.seen(), table, jnp.nan)


class MatthewsCorrCoef(ConfusionState):
  """Matthews correlation coefficient of the confusion matrix (0 where undefined).

  Multiclass uses the ``[C, C]`` matrix (scikit-learn's formula); multilabel scores the
  ``[2, 2]`` matrix summed over labels (torchmetrics).
  """

  _full_matrix = True

  def compute(self) -> jax.Array:
    table = self.matrix()
    table = table / jnp.sum(table)
    true_share, pred_share = jnp.sum(table, axis=1), jnp.sum(table, axis=0)
    cov_true_pred = jnp.trace(table) - jnp.dot(true_share, pred_share)
    cov_pred = 1.0 - jnp.dot(pred_share, pred_share)
    cov_true = 1.0 - jnp.dot(true_share, true_share)
    value = divide(cov_true_pred, jnp.sqrt(jnp.maximum(cov_true * cov_pred, 0.0)))
    return jnp.where(self.seen(), value, jnp.nan)


KAPPA_WEIGHTS = (None, "linear", "quadratic")


class CohenKappa(ConfusionState):
  """Cohen's kappa, agreement of preds and target beyond chance (binary / multiclass).

  Args:
    weights: ``None``, ``"linear"`` or ``"quadratic"`` disagreement weights over the
      class ids ``0..C-1`` (scikit-learn's ``cohen_kappa_score(labels=range(C))``).
      Configuration, not the update keyword ``weights`` (which is not supported).

  Undefined kappa (chance agreement 1) computes 0.
  """

  weights: str | None = _config(None)
  _full_matrix = True

  def _check_config(self):
    super()._check_config()
    check_choice("task", self.task, ("binary", "multiclass"))
    check_choice("weights", self.weights, KAPPA_WEIGHTS)

  def compute(self) -> jax.Array:
    table = self.matrix()
    table = table / jnp.sum(table)
    expected = jnp.outer(jnp.sum(table, axis=1), jnp.sum(table, axis=0))
    ids = np.arange(table.shape[0])
    distance = np.abs(ids[:, None] - ids[None, :]).astype(np.float32)
    if self.weights is None:
      disagreement = (distance > 0).astype(np.float32)
    else:
      disagreement = distance if self.weights == "linear" else distance**2
    observed = jnp.sum(disagreement * table)
    chance = jnp.sum(disagreement * expected)
    value = jnp.where(chance > 0, 1.0 - divide(observed, chance), 0.0)
    return jnp.where(self.seen(), value, jnp.nan)
