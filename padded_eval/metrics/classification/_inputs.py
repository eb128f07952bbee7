"""The classification base: configuration, formatted inputs, invalid counts and batch counts.

:class:`ClassificationMetric` is the base of the confusion, curve and calibration
metrics: it holds the configuration they share (``task``, ``num_classes``,
``from_logits``, ``ignore_index``), checks it once (through
:mod:`padded_eval.validation`), reads the update inputs through the one formatter of
:mod:`padded_eval.metrics.classification._formatting` and counts the invalid elements it reports.

The int32 batch counts (per-class tp/fp/fn/tn, the ``[C, C + 1]`` matrix) are wrapped in
:class:`~padded_eval.exact.accumulate.ExactCount` by the metrics. See
:mod:`padded_eval.metrics.classification.confusion` for the semantics.
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval import validation
from padded_eval.exact.accumulate import ExactCount
from padded_eval.metrics.base import Metric, config_field, empty_count, invalid_state, state
from padded_eval.metrics.classification._formatting import INVALID_KINDS, format_inputs

TASKS = ("binary", "multiclass", "multilabel")
AVERAGES = ("micro", "macro", "weighted", None)
MAX_MATRIX_CLASSES = 46339  # flat index t * (C + 1) + p stays below 2**31


# --- configuration ---------------------------------------------------------------------


MAX_CLASSES = 2**31
"""The most classes a metric takes: class ids are int32, ``0 .. 2**31 - 1``."""


def check_task(task, num_classes, *, tasks=TASKS) -> None:
  """Raises ValueError for a bad ``task`` / ``num_classes`` pair."""
  validation.check_choice("task", task, tasks)
  if task == "binary":
    if num_classes not in (None, 2) or isinstance(num_classes, bool):
      raise ValueError(
        f"task='binary' has 2 classes; got num_classes={num_classes!r}. Use "
        "num_classes=None (or 2), or task='multiclass' / 'multilabel'"
      )
    return
  validation.check_positive_int("num_classes", num_classes)
  if num_classes > MAX_CLASSES:
    raise ValueError(
      f"num_classes={num_classes} is more classes than int32 class ids can name; expected at "
      f"most {MAX_CLASSES} (2**31)"
    )
  if task == "multiclass" and num_classes < 2:
    raise ValueError(f"task='multiclass' needs num_classes, an int >= 2; got {num_classes!r}")


def check_ignore_index(ignore_index) -> None:
  """Raises ValueError unless ``ignore_index`` is None or an int in int32's range (the
  target ids' type: a larger one would overflow at the first update)."""
  if ignore_index is None:
    return
  if not validation.is_int(ignore_index):
    raise ValueError(f"ignore_index must be None or an int; got {ignore_index!r}")
  int32 = np.iinfo(np.int32)
  if not int32.min <= int(ignore_index) <= int32.max:
    raise ValueError(
      f"ignore_index must be None or an int in int32's range [{int32.min}, {int32.max}] "
      f"(target ids are int32); got {ignore_index!r}"
    )


def check_no_weights(weights, metric) -> None:
  """Raises ValueError if sample ``weights`` were given to a counting metric."""
  if weights is not None:
    raise ValueError(
      f"{type(metric).__name__} counts elements and does not take sample "
      "weights; got weights. Drop the keyword, or mask elements out instead"
    )


def check_labels(labels, task, num_classes) -> tuple[int, ...]:
  """``labels`` as a sorted tuple; ValueError unless distinct class ids in ``[0, C)``."""
  if task == "binary":
    raise ValueError("labels= is for task='multiclass' or 'multilabel'; task='binary' scores 1")
  ids = tuple(labels) if isinstance(labels, (list, tuple, np.ndarray)) else None
  if (
    not ids
    or not all(validation.is_int(i) and 0 <= i < num_classes for i in ids)
    or len(set(ids)) != len(ids)
  ):
    raise ValueError(
      f"labels must be a non-empty list of distinct class ids in [0, {num_classes}); got {labels!r}"
    )
  return tuple(sorted(int(i) for i in ids))


def num_columns(task: str, num_classes: int | None) -> int:
  """Columns of the per-class counts: 1 for binary, else ``num_classes``."""
  if task == "binary":
    return 1
  assert num_classes is not None  # check_task: multiclass and multilabel name their classes
  return num_classes


def formatted_inputs(metric, preds, target, mask, weights=None, *, scores_only, from_logits=None):
  """``(elements, {kind: flags})``: the inputs read by the one formatter with ``metric``'s
  configuration (``task``, ``num_classes``, ``ignore_index``, and ``from_logits`` unless given),
  and the invalid flags of the kinds ``metric`` reports (``metric.invalid_kinds``; an element
  of weight 0 in ``weights``, the update's sample weights, is not counted)."""
  elements = format_inputs(
    preds,
    target,
    mask,
    task=metric.task,
    num_classes=metric.num_classes,
    from_logits=metric.from_logits if from_logits is None else from_logits,
    ignore_index=metric.ignore_index,
    scores_only=scores_only,
    weights=weights,
  )
  return elements, {k: v for k, v in elements.invalid.items() if k in metric.invalid_kinds}


class ClassificationMetric(Metric):
  """Base of the confusion, curve and calibration metrics.

  Subclasses set the default ``task``, list their ``invalid_kinds`` (a subset of
  :data:`~padded_eval.metrics.classification._formatting.INVALID_KINDS`) and call :meth:`elements` in
  ``_batch_state``; its invalid counts go in the ``invalid`` state field.
  """

  task: str = config_field(default="multiclass")
  num_classes: int | None = config_field(default=None)
  from_logits: bool = config_field(default=False)
  ignore_index: int | None = config_field(default=None)
  invalid: ExactCount = state(invalid_state)
  example_rows: ExactCount = state(empty_count)

  invalid_kinds: ClassVar[tuple[str, ...]] = INVALID_KINDS
  _tasks: ClassVar[tuple[str, ...]] = TASKS
  _scores_only: ClassVar[bool] = False  # multiclass preds must be [..., C] scores

  def _check_config(self):
    check_task(self.task, self.num_classes, tasks=self._tasks)
    validation.check_flag("from_logits", self.from_logits)
    check_ignore_index(self.ignore_index)

  def elements(self, preds, target, mask, weights=None):
    """``(elements, invalid counts)``: the formatted inputs and this batch's ``invalid``
    (an element of weight 0 in ``weights``, the update's sample weights, is not counted)."""
    elements, kinds = formatted_inputs(
      self, preds, target, mask, weights, scores_only=self._scores_only
    )
    return elements, self.count_invalid(**kinds)

  def _classes(self) -> int:
    """``num_classes`` of a multiclass / multilabel task (`check_task` makes it an int)."""
    assert self.num_classes is not None, self.task
    return self.num_classes

  def included_classes(self) -> np.ndarray | jax.Array:
    """bool ``[L]``: False only for a multiclass ``ignore_index`` that is a class id."""
    included = np.ones(num_columns(self.task, self.num_classes), bool)
    if self.task == "multiclass" and self.ignore_index is not None:
      if 0 <= self.ignore_index < self._classes():
        included[self.ignore_index] = False
    return included


# --- batch counts ----------------------------------------------------------------------


def label_counts(truth, guess, valid) -> jax.Array:
  """int32 ``[4, L]``: tp, fp, fn, tn per label over all leading axes."""
  axes = tuple(range(truth.ndim - 1))

  def count(selected):
    return jnp.sum(valid & selected, axis=axes, dtype=jnp.int32)

  return jnp.stack(
    [count(truth & guess), count(~truth & guess), count(truth & ~guess), count(~truth & ~guess)]
  )


def scatter_count(indices, valid, size: int) -> jax.Array:
  """int32 ``[size]``: how many valid elements carry each index (one scatter-add)."""
  flat = jnp.where(valid, indices, size).reshape(-1)
  return jnp.zeros((size,), jnp.int32).at[flat].add(1, mode="drop")


def predicted_classes(metric, elements) -> jax.Array:
  """int32 ``[..., k]``: the classes ``metric`` predicts for each multiclass element under its
  ``top_k`` and ``top_k_rule`` (``"every"``: the ``k`` best; ``"torchmetrics"``: one, the
  target when among the ``k`` best, else the best); -1: no class (a NaN pick)."""
  predicted = elements.top_k(metric.top_k)
  if getattr(metric, "top_k_rule", "every") == "torchmetrics":
    hit = jnp.any(predicted == elements.labels[..., None], axis=-1)
    predicted = jnp.where(hit, elements.labels, predicted[..., 0])[..., None]
  return predicted


def class_counts(labels, predicted, valid, num_classes: int) -> jax.Array:
  """int32 ``[4, C]`` tp, fp, fn, tn per class of multiclass elements (top-k aware).

  A class is predicted for an element when it is among its ``top_k`` ids (``predicted``
  ``[..., k]``; -1 predicts no class); a true positive when it is also the target.
  ``tn = N - tp - fp - fn`` with ``N`` the counted elements. One scatter-add into
  ``[3C]`` bins.
  """
  c = num_classes
  hit = jnp.any(predicted == labels[..., None], axis=-1)
  indices = jnp.concatenate(
    [labels.reshape(-1), c + predicted.reshape(-1), 2 * c + labels.reshape(-1)]
  )
  predicted_valid = (valid[..., None] & (predicted >= 0)).reshape(-1)
  selected = jnp.concatenate([(valid & hit).reshape(-1), predicted_valid, valid.reshape(-1)])
  tp, predicted_count, true_count = scatter_count(indices, selected, 3 * c).reshape(3, c)
  fp, fn = predicted_count - tp, true_count - tp
  total = jnp.sum(valid, dtype=jnp.int32)
  return jnp.stack([tp, fp, fn, total - tp - fp - fn])


def matrix_counts(labels, predicted, valid, num_classes: int, method: str = "scatter"):
  """int32 ``[C, C + 1]`` (rows true, columns predicted) of multiclass elements.

  ``predicted`` ``[..., 1]`` (or ``[...]``) ids; -1 (no class: an out-of-range id or an
  all-NaN row) counts in the last column. ``method``: ``"scatter"`` (one scatter-add of
  ``t * (C + 1) + p``; the default: on CPU it was 2-3x faster than the matmul at C=10
  and 280-1000x at C=1000 for 1024 examples, benchmarks/RESULTS.md records it) or
  ``"matmul"`` (one-hot ``[N, C + 1]`` product, exact: per-batch counts are far below
  ``2**24``).
  """
  validation.check_choice("method", method, ("scatter", "matmul"))
  c = num_classes
  labels, valid = labels.reshape(-1), valid.reshape(-1)
  predicted = predicted.reshape(-1)
  columns = jnp.where(predicted >= 0, predicted, c)
  if method == "scatter":
    return scatter_count(labels * (c + 1) + columns, valid, c * (c + 1)).reshape(c, c + 1)
  true_hot = jnp.where(valid[:, None], jax.nn.one_hot(labels, c, dtype=jnp.float32), 0.0)
  pred_hot = jax.nn.one_hot(columns, c + 1, dtype=jnp.float32)
  product = jnp.matmul(true_hot.T, pred_hot, precision=jax.lax.Precision.HIGHEST)
  return product.astype(jnp.int32)


def divide(numerator, denominator, zero_division: float = 0.0) -> jax.Array:
  """``numerator / denominator``; ``zero_division`` (default 0) where the denominator is 0."""
  defined = denominator > 0
  return jnp.where(defined, numerator / jnp.where(defined, denominator, 1.0), zero_division)


def check_zero_division(zero_division, *, allow_nan: bool = True) -> None:
  """Raises ValueError unless ``zero_division`` is 0, 1 or (``allow_nan``) NaN."""
  if not validation.is_number(zero_division) or not (
    zero_division in (0, 1) or (allow_nan and np.isnan(zero_division))
  ):
    choices = "0, 1 or float('nan')" if allow_nan else "0 or 1"
    raise ValueError(
      f"zero_division must be {choices} (scikit-learn's choices); got {zero_division!r}"
    )


def average_scores(per_class, present, weights=None) -> jax.Array:
  """scikit-learn's ``_nanaverage`` of ``per_class`` ``[L]`` over the ``present`` classes.

  NaN scores (``zero_division=nan``) are left out with their weights (NaN when none is
  left); when the ``weights`` left sum to 0 the plain mean is taken.
  """
  defined = present & ~jnp.isnan(per_class)
  values = jnp.where(defined, per_class, 0.0)
  plain = defined.astype(jnp.float32)
  if weights is None:
    w = plain
  else:
    w = jnp.where(defined, weights, 0.0)
    w = jnp.where(jnp.sum(w) > 0, w, plain)
  total = jnp.sum(w)
  return jnp.where(total > 0, jnp.sum(w * values) / jnp.where(total > 0, total, 1.0), jnp.nan)
