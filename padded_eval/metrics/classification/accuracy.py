"""Accuracy: the weighted fraction of real examples whose class is predicted."""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp

from padded_eval import validation
from padded_eval.exact.accumulate import ExactCount, ExactSum
from padded_eval.masking import element_weights
from padded_eval.metrics.averages import zero_total
from padded_eval.metrics.base import Metric, empty_count, invalid_state, state
from padded_eval.metrics.classification._formatting import (
  INVALID_KINDS,
  class_elements,
  label_elements,
  probabilities,
  weighed_invalid,
)
from padded_eval.metrics.classification._inputs import (
  check_ignore_index,
  check_task,
  config_field,
)
from padded_eval.metrics.classification.per_sample import weighted_counts
from padded_eval.metrics.totals import Totals

ACCURACY_AVERAGES = ("micro", "macro", "weighted", None)


class Accuracy(Metric):
  """Fraction of real elements whose target is among the top-k predictions.

  Args:
    top_k: with score ``preds`` ``[..., C]``, a hit is ``target`` among the ``top_k``
      highest scores (ties broken towards the lower class index, like ``lax.top_k``;
      NaN scores count as worst and are never a hit).
    task: ``"multiclass"`` (default) or ``"binary"``.
    threshold: binary only: a probability ``> threshold`` predicts 1 (default 0.5, like
      torchmetrics' ``BinaryAccuracy``). The threshold is always a probability: with
      ``from_logits=True`` it is compared with ``sigmoid(preds)``. Nothing is guessed
      from the values (torchmetrics applies a sigmoid when a value falls outside
      ``[0, 1]``; here probabilities outside ``[0, 1]`` are counted as invalid instead).
    from_logits: binary and multilabel: ``preds`` are logits (default False:
      probabilities).
    average: how per-class accuracies are combined (torchmetrics' ``MulticlassAccuracy``
      / ``MultilabelAccuracy``): ``"micro"`` (default: the fraction of counted elements
      predicted right; multilabel: of counted labels), ``"macro"`` (the mean over classes
      of each class's recall ``tp / (tp + fn)``; multiclass: over the classes seen in the
      target or the predictions, torchmetrics' rule (with ``top_k > 1``: in the target);
      multilabel: each label's ``(tp + tn) / n`` over every label), ``"weighted"`` (that
      mean weighted by each class's support ``tp + fn``) or ``None`` (the ``[C]`` per-class
      values; an absent class reads 0, as in torchmetrics). Not for ``task="binary"``.
      torchmetrics' default is ``"macro"``; ours stays ``"micro"``.
    num_classes: ``C``; needed for ``task="multilabel"`` and for an ``average`` other
      than ``"micro"`` (the per-class state has ``C`` columns).
    ignore_index: elements whose target equals it are left out of every count (any int:
      ``-100``, ``255``, or a class id). A class id is also left out of the ``"macro"``
      and ``"weighted"`` means and reads NaN with ``average=None``; torchmetrics instead
      scores it 0 in a macro mean where it is predicted (see the API reference,
      "Documented differences").

  With sample ``weights`` every element counts with its weight, in compensated float
  sums (integer weights are exact); the per-class averages weigh classes by the summed
  weights of their support.

  Update keywords: ``target`` ``[...]`` int class ids (0/1 for binary; float targets are
  refused); ``preds``: multiclass ``[...]`` int class ids or ``[..., C]`` float scores
  (float preds shaped like the target, and ``target.shape + [1]`` preds, are refused
  with a ``ValueError``: one score per row is a binary model's, use
  ``Accuracy(task="binary", threshold=...)``); binary
  ``[...]`` or ``[..., 1]`` probabilities or logits; multilabel ``[..., C]``
  probabilities or logits (positive above ``threshold``) with ``target`` ``[..., C]``
  int 0/1; ``mask`` and ``weights`` a prefix of ``target``'s shape.

  Invalid real elements of nonzero weight are counted by kind (:meth:`invalid_counts`, see
  :mod:`padded_eval.metrics.classification._formatting`): ``"target out of range"`` (negative, ``>= C``
  with scores, not 0/1 for binary: not counted), ``"pred id out of range"`` (a negative
  class id: a miss), ``"nan score"`` (a miss unless another class ranks) and
  ``"probability outside [0, 1]"`` (binary without ``from_logits``).

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> logits = np.array([[2.0, 1, 0], [0, 2.0, 1], [1, 0, 2.0], [2.0, 0, 1]])
    >>> labels = np.array([0, 1, 1, 2])
    >>> float(pe.metrics.Accuracy().update(preds=logits, target=labels).compute())
    0.5
    >>> float(pe.metrics.Accuracy(top_k=2).update(preds=logits, target=labels).compute())
    0.75
    >>> macro = pe.metrics.Accuracy(average="macro", num_classes=3)
    >>> round(float(macro.update(preds=logits, target=labels).compute()), 4)  # (1 + 1/2 + 0) / 3
    0.5
  """

  higher_is_better: ClassVar[bool | None] = True

  top_k: int = 1
  task: str = config_field(default="multiclass")
  threshold: float = config_field(default=0.5)
  from_logits: bool = config_field(default=False)
  average: str | None = config_field(default="micro")
  num_classes: int | None = config_field(default=None)
  ignore_index: int | None = config_field(default=None)
  correct: ExactSum = state(zero_total)
  weight: ExactSum = state(zero_total)
  # weighted tp, fp, fn, tn per class [4, C] for the per-class averages; [4, 0] for "micro"
  class_weights: ExactSum = state(lambda self: ExactSum.zeros((4, self._class_columns())))
  invalid: ExactCount = state(invalid_state)
  example_rows: ExactCount = state(empty_count)

  invalid_kinds: ClassVar[tuple[str, ...]] = INVALID_KINDS

  def _check_config(self):
    validation.check_positive_int("top_k", self.top_k)
    validation.check_choice("task", self.task, ("multiclass", "binary", "multilabel"))
    validation.check_probability("threshold", self.threshold)
    validation.check_flag("from_logits", self.from_logits)
    validation.check_choice("average", self.average, ACCURACY_AVERAGES)
    check_ignore_index(self.ignore_index)
    if self.task != "multiclass" and self.top_k != 1:
      raise ValueError(f"top_k={self.top_k} is for task='multiclass'; task={self.task!r} takes 1")
    if self.task == "binary" and self.average != "micro":
      raise ValueError(
        f"average={self.average!r} is for task='multiclass' or 'multilabel'; task='binary' "
        "scores one class (leave average='micro')"
      )
    if self.task == "multilabel" or self.average != "micro" or self.num_classes is not None:
      if self.num_classes is None:
        raise ValueError(
          f"Accuracy(task={self.task!r}, average={self.average!r}) needs num_classes (the "
          "number of classes or labels: the per-class state has one column each); got None"
        )
      check_task(self.task, self.num_classes)
      if self.top_k > self.num_classes:
        raise ValueError(f"top_k={self.top_k} exceeds num_classes={self.num_classes}")

  def _class_columns(self) -> int:
    """Columns of the per-class state: ``num_classes`` unless ``average="micro"``."""
    if self.average == "micro":
      return 0
    assert self.num_classes is not None  # _check_config: a per-class average needs num_classes
    return self.num_classes

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    preds, target = jnp.asarray(preds), jnp.asarray(target)
    if self.average != "micro":
      return self._class_state(preds, target, mask, weights)
    if self.task == "binary":
      hits, valid, bad = self._binary_hits(preds, target, mask)
    elif self.task == "multilabel":
      hits, valid, bad = self._label_hits(preds, target, mask)
    else:
      hits, valid, bad = self._class_hits(preds, target, mask)
    bad = weighed_invalid(bad, weights)  # an element of weight 0 is not seen
    real, w = element_weights(valid, weights, hits.shape, "target")
    # hits, weights, invalid counts and real rows in one reduction (one all-reduce under jit)
    return Totals([jnp.where(real, w, 0.0) * hits, w], self.invalid_flags(**bad), _accuracy_state)

  def _binary_hits(self, preds, target, mask):
    if preds.shape == target.shape + (1,):
      preds = preds[..., 0]
    elements = label_elements(
      preds,
      target,
      mask,
      task="binary",
      num_classes=None,
      from_logits=self.from_logits,
      ignore_index=self.ignore_index,
    )
    guess = probabilities(elements.scores[..., 0], self.from_logits) > self.threshold
    bad = {k: v[..., 0] for k, v in elements.invalid.items()}
    return guess == elements.truth[..., 0], elements.valid[..., 0], bad

  def _label_elements(self, preds, target, mask):
    return label_elements(
      preds,
      target,
      mask,
      task="multilabel",
      num_classes=self.num_classes,
      from_logits=self.from_logits,
      ignore_index=self.ignore_index,
    )

  def _label_hits(self, preds, target, mask):
    elements = self._label_elements(preds, target, mask)
    guess = probabilities(elements.scores, self.from_logits) > self.threshold
    return guess == elements.truth, elements.valid, elements.invalid

  def _class_elements(self, preds, target, mask):
    check_class_preds(preds, target)
    if preds.shape == target.shape:
      if self.top_k != 1:
        raise ValueError(
          f"top_k={self.top_k} needs score preds [..., C]; got class ids of shape {preds.shape}"
        )
      num_classes = None
    elif preds.shape[:-1] == target.shape:
      num_classes = preds.shape[-1]
      if self.top_k > num_classes:
        raise ValueError(f"top_k={self.top_k} exceeds the {num_classes} classes of preds")
    else:
      raise ValueError(
        f"preds has shape {preds.shape} and target {target.shape}; expected "
        "preds of target's shape (class ids) or target's shape + [C] (scores)"
      )
    if num_classes is not None and self.num_classes not in (None, num_classes):
      raise ValueError(
        f"preds has {num_classes} class scores but num_classes={self.num_classes}; expected "
        f"preds [..., {self.num_classes}]"
      )
    if num_classes is None:
      num_classes = self.num_classes
    return class_elements(
      preds, target, mask, num_classes=num_classes, ignore_index=self.ignore_index
    )

  def _class_hits(self, preds, target, mask):
    elements = self._class_elements(preds, target, mask)
    hits = _any_hit(elements.top_k(self.top_k), elements.labels)
    return hits, elements.valid, elements.invalid

  def _class_state(self, preds, target, mask, weights) -> dict:
    """The per-class state: weighted ``[4, C]`` tp, fp, fn, tn (``average`` not micro)."""
    if self.task == "multilabel":
      elements = self._label_elements(preds, target, mask)
    else:
      elements = self._class_elements(preds, target, mask)
    counts = weighted_counts(self, elements, weights)
    return {
      "correct": zero_total(self),
      "weight": zero_total(self),
      "class_weights": ExactSum.of(counts),
      "invalid": self.count_invalid(**weighed_invalid(elements.invalid, weights)),
    }

  def compute(self) -> jax.Array:
    """Weighted accuracy over real elements (``[C]`` with ``average=None``); NaN if none
    was seen."""
    if self.average == "micro":
      return self.correct.total() / self.weight.total()
    tp, fp, fn, tn = self.class_weights.total()
    counted = tp + fp + fn + tn if self.task == "multilabel" else tp + fn
    hits = tp + tn if self.task == "multilabel" else tp
    per_class = jnp.where(counted > 0, hits / jnp.where(counted > 0, counted, 1.0), 0.0)
    included = jnp.ones(per_class.shape, bool)
    if self.task == "multiclass" and self.ignore_index is not None:
      included = jnp.arange(per_class.shape[0]) != self.ignore_index
    seen = jnp.sum(tp + fn) > 0 if self.task == "multiclass" else jnp.sum(counted) > 0
    if self.average is None:
      return jnp.where(seen & included, per_class, jnp.nan)
    if self.average == "weighted":
      w = tp + fn
    elif self.task == "multiclass":  # torchmetrics: the classes in the target or predicted
      w = (tp + fn > 0) if self.top_k > 1 else (tp + fp + fn > 0)
    else:
      w = jnp.ones(per_class.shape)
    w = jnp.where(included, w, 0.0).astype(jnp.float32)
    total = jnp.sum(w)
    value = jnp.where(total > 0, jnp.sum(w * per_class) / jnp.where(total > 0, total, 1.0), 0.0)
    return jnp.where(seen, value, jnp.nan)


def check_class_preds(preds: jax.Array, target: jax.Array) -> None:
  """Refuses multiclass ``preds`` that are one probability or logit per row.

  Float ``preds`` of ``target``'s shape, or ``[..., 1]`` scores (one class), are what a
  binary model outputs; read as class ids or as one-class scores they would give a
  silently wrong accuracy.

  Raises:
    ValueError: float ``preds`` shaped like ``target``, or ``preds`` ``target.shape + [1]``.
  """
  one_score = preds.shape == target.shape + (1,)
  if not one_score and (preds.shape != target.shape or _holds_ints(preds)):
    return
  if not one_score and target.ndim >= 2 and target.shape[-1] >= 2:
    raise ValueError(
      f"Accuracy (task='multiclass'): preds and target both have shape {preds.shape}: a "
      f"one-hot (or soft) target [..., C]? target must hold class indices: pass "
      f"jnp.argmax(target, axis=-1) (int, shape {target.shape[:-1]}). For one binary score per "
      'element use Accuracy(task="binary", threshold=0.5) (add from_logits=True for logits)'
    )
  raise ValueError(
    f"Accuracy (task='multiclass'): preds has shape {preds.shape} and dtype {preds.dtype}, "
    f"target {target.shape}: one score per row is not a class id. Pass logits or "
    f"probabilities [..., C] for C >= 2 classes (target.shape + [C]), int class ids of "
    f'target\'s shape, or for a binary model use Accuracy(task="binary", threshold=0.5) '
    "(add from_logits=True for logits)"
  )


def _holds_ints(preds: jax.Array) -> bool:
  return jnp.issubdtype(preds.dtype, jnp.integer)


def _any_hit(predicted: jax.Array, labels: jax.Array) -> jax.Array:
  """Whether ``labels`` is among the ids ``predicted`` ``[..., k]`` (-1 never hits)."""
  return jnp.any(predicted == labels[..., None], axis=-1)


def _accuracy_state(sums: list, counts: list) -> dict:
  """Accuracy's state from its `Totals`: ``(correct, weight)`` sums and the invalid counts."""
  correct, weight = sums
  return {
    "correct": correct,
    "weight": weight,
    "invalid": ExactCount.of(jnp.stack(counts)),
  }
