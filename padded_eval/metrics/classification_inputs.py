"""Classification inputs and their batch counts, shared by the classification families.

Configuration checks, the three input formats (binary, multiclass, multilabel) turned
into bool / int element arrays with one ``valid`` mask, and the int32 batch counts
(per-class tp/fp/fn/tn, the ``[C, C]`` matrix) that the metrics wrap in
:class:`~padded_eval.accumulate.ExactCount`. See :mod:`padded_eval.metrics.confusion`
for the semantics.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from padded_eval.accumulate import upcast
from padded_eval.masking import broadcast_mask
from padded_eval.validation import check_choice

TASKS = ("binary", "multiclass", "multilabel")
AVERAGES = ("micro", "macro", "weighted", None)
MAX_MATRIX_CLASSES = 46340  # flat index t * C + p stays below 2**31


# --- configuration ---------------------------------------------------------------------


def check_task(task, num_classes, *, tasks=TASKS) -> None:
  """Raises ValueError for a bad ``task`` / ``num_classes`` pair."""
  check_choice("task", task, tasks)
  if task == "binary":
    if num_classes not in (None, 2):
      raise ValueError(
        f"task='binary' has 2 classes; got num_classes={num_classes!r}. Use "
        "num_classes=None (or 2), or task='multiclass' / 'multilabel'"
      )
  elif (
    isinstance(num_classes, bool)
    or not isinstance(num_classes, int)
    or num_classes < 1
    or (task == "multiclass" and num_classes < 2)
  ):
    least = 2 if task == "multiclass" else 1
    raise ValueError(f"task={task!r} needs num_classes, an int >= {least}; got {num_classes!r}")


def check_flag(argname: str, value) -> None:
  if not isinstance(value, bool):
    raise ValueError(f"{argname} must be True or False; got {value!r}")


def check_ignore_index(ignore_index) -> None:
  if ignore_index is not None and (
    isinstance(ignore_index, bool) or not isinstance(ignore_index, int)
  ):
    raise ValueError(f"ignore_index must be None or an int; got {ignore_index!r}")


def check_no_weights(weights, metric) -> None:
  if weights is not None:
    raise ValueError(
      f"{type(metric).__name__} counts elements and does not take sample "
      "weights; got weights. Drop the keyword, or mask elements out instead"
    )


def num_columns(task: str, num_classes) -> int:
  """Columns of the per-class counts: 1 for binary, else ``num_classes``."""
  return 1 if task == "binary" else num_classes


# --- inputs ----------------------------------------------------------------------------


def probabilities(preds, from_logits: bool, axis=None) -> jax.Array:
  """float32 probabilities: ``preds`` as they are, or sigmoid / softmax of logits."""
  preds = upcast(jnp.asarray(preds))
  if not from_logits:
    return preds
  return jax.nn.sigmoid(preds) if axis is None else jax.nn.softmax(preds, axis=axis)


def check_same_shape(preds, target, task) -> None:
  if preds.shape != target.shape:
    raise ValueError(
      f"task={task!r}: preds has shape {preds.shape} but target has shape "
      f"{target.shape}; expected equal shapes"
    )


def label_inputs(preds, target, mask, *, task, num_classes, threshold, from_logits, ignore_index):
  """Binary / multilabel elements: ``(truth, guess, valid)``, bool ``[..., L]``.

  Binary inputs get a trailing axis of size 1. ``valid``: real, target 0 or 1, and not
  ``ignore_index``.
  """
  preds, target = jnp.asarray(preds), jnp.asarray(target)
  check_same_shape(preds, target, task)
  if task == "multilabel" and (target.ndim == 0 or target.shape[-1] != num_classes):
    raise ValueError(
      f"task='multilabel' needs target [..., {num_classes}] (num_classes "
      f"labels last); got shape {target.shape}"
    )
  valid = broadcast_mask(mask, target.shape, "target")
  valid &= (target == 0) | (target == 1)
  if ignore_index is not None:
    valid &= target != ignore_index
  guess = probabilities(preds, from_logits) > threshold
  truth = target == 1
  if task == "binary":
    truth, guess, valid = truth[..., None], guess[..., None], valid[..., None]
  return truth, guess, valid


def class_inputs(preds, target, mask, *, num_classes, top_k, ignore_index):
  """Multiclass elements: ``(labels [...], predicted [..., top_k], valid [...])`` int32/bool.

  ``preds`` are class ids of ``target``'s shape or scores ``[..., C]`` (the ``top_k``
  best, ties to the lower class like ``lax.top_k``).
  """
  preds, target = jnp.asarray(preds), jnp.asarray(target)
  if not jnp.issubdtype(target.dtype, jnp.integer):
    raise ValueError(f"task='multiclass' needs int class ids as target; got dtype {target.dtype}")
  labels = target.astype(jnp.int32)
  valid = broadcast_mask(mask, target.shape, "target")
  valid &= (labels >= 0) & (labels < num_classes)
  if ignore_index is not None:
    valid &= target != ignore_index
  if preds.shape == target.shape:
    if not jnp.issubdtype(preds.dtype, jnp.integer):
      raise ValueError(
        f"task='multiclass' preds of target's shape must be int class ids; got "
        f"dtype {preds.dtype}. Pass scores [..., {num_classes}], or use "
        "task='binary' for probabilities of one class"
      )
    if top_k != 1:
      raise ValueError(
        f"top_k={top_k} needs score preds [..., C]; got class ids of shape {preds.shape}"
      )
    predicted = preds.astype(jnp.int32)[..., None]
    valid &= (predicted[..., 0] >= 0) & (predicted[..., 0] < num_classes)
  elif preds.shape == target.shape + (num_classes,):
    scores = upcast(preds)
    if top_k == 1:
      predicted = jnp.argmax(scores, axis=-1).astype(jnp.int32)[..., None]
    else:
      predicted = jax.lax.top_k(scores, top_k)[1].astype(jnp.int32)
  else:
    raise ValueError(
      f"task='multiclass': preds has shape {preds.shape} and target "
      f"{target.shape}; expected preds {target.shape} (class ids) or "
      f"{target.shape + (num_classes,)} (scores for num_classes={num_classes})"
    )
  return labels, predicted, valid


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


def class_counts(labels, predicted, valid, num_classes: int) -> jax.Array:
  """int32 ``[4, C]`` tp, fp, fn, tn per class of multiclass elements (top-k aware).

  A class is predicted for an element when it is among its ``top_k`` ids; a true
  positive when it is also the target. One scatter-add into ``[3C]`` bins.
  """
  c = num_classes
  hit = jnp.any(predicted == labels[..., None], axis=-1)
  k = predicted.shape[-1]
  indices = jnp.concatenate(
    [labels.reshape(-1), c + predicted.reshape(-1), 2 * c + labels.reshape(-1)]
  )
  selected = jnp.concatenate(
    [(valid & hit).reshape(-1), jnp.repeat(valid.reshape(-1), k), valid.reshape(-1)]
  )
  tp, predicted_count, true_count = scatter_count(indices, selected, 3 * c).reshape(3, c)
  fp, fn = predicted_count - tp, true_count - tp
  total = jnp.sum(valid, dtype=jnp.int32)
  return jnp.stack([tp, fp, fn, total * k - tp - fp - fn])


def matrix_counts(labels, predicted, valid, num_classes: int, method: str = "scatter"):
  """int32 ``[C, C]`` (rows true, columns predicted) of multiclass elements.

  ``method``: ``"scatter"`` (one scatter-add of ``t * C + p``; the default: on CPU it
  was 2-3x faster than the matmul at C=10 and 280-1000x at C=1000 for 1024 examples, see
  benchmarks/bench_classification.py) or ``"matmul"`` (one-hot ``[N, C]`` product,
  exact: per-batch counts are far below ``2**24``).
  """
  c = num_classes
  labels, predicted, valid = labels.reshape(-1), predicted.reshape(-1), valid.reshape(-1)
  check_choice("method", method, ("scatter", "matmul"))
  if method == "scatter":
    return scatter_count(labels * c + predicted, valid, c * c).reshape(c, c)
  true_hot = jnp.where(valid[:, None], jax.nn.one_hot(labels, c, dtype=jnp.float32), 0.0)
  pred_hot = jax.nn.one_hot(predicted, c, dtype=jnp.float32)
  product = jnp.matmul(true_hot.T, pred_hot, precision=jax.lax.Precision.HIGHEST)
  return product.astype(jnp.int32)


def divide(numerator, denominator) -> jax.Array:
  """``numerator / denominator``, 0 where the denominator is 0 (``zero_division=0``)."""
  defined = denominator > 0
  return jnp.where(defined, numerator / jnp.where(defined, denominator, 1.0), 0.0)
