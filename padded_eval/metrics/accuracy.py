"""Accuracy: the weighted fraction of real examples whose class is predicted."""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp

from padded_eval import validation
from padded_eval.exact.accumulate import ExactCount, ExactSum
from padded_eval.masking import element_weights
from padded_eval.metrics._classification_inputs import check_flag, config_field
from padded_eval.metrics._formatting import (
  INVALID_KINDS,
  class_elements,
  label_elements,
  probabilities,
)
from padded_eval.metrics.averages import zero_total
from padded_eval.metrics.base import Metric, Totals, empty_count, invalid_state, state


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
    from_logits: binary only: ``preds`` are logits (default False: probabilities).

  Update keywords: ``target`` ``[...]`` int class ids (0/1 for binary; float targets are
  refused); ``preds``: multiclass ``[...]`` int class ids or ``[..., C]`` float scores
  (float preds shaped like the target, and ``target.shape + [1]`` preds, are refused
  with a ``ValueError``: one score per row is a binary model's, use
  ``Accuracy(task="binary", threshold=...)``); binary
  ``[...]`` or ``[..., 1]`` probabilities or logits; ``mask`` and ``weights`` a prefix of
  ``target``'s shape.

  Invalid real elements are counted by kind (:meth:`invalid_counts`, see
  :mod:`padded_eval.metrics._formatting`): ``"target out of range"`` (negative, ``>= C``
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
  """

  higher_is_better: ClassVar[bool | None] = True

  top_k: int = 1
  task: str = config_field("multiclass")
  threshold: float = config_field(0.5)
  from_logits: bool = config_field(False)
  correct: ExactSum = state(zero_total)
  weight: ExactSum = state(zero_total)
  invalid: ExactCount = state(invalid_state)
  example_rows: ExactCount = state(empty_count)

  invalid_kinds: ClassVar[tuple[str, ...]] = INVALID_KINDS

  def _check_config(self):
    validation.check_positive_int("top_k", self.top_k)
    validation.check_choice("task", self.task, ("multiclass", "binary"))
    validation.check_probability("threshold", self.threshold)
    check_flag("from_logits", self.from_logits)
    if self.task == "binary" and self.top_k != 1:
      raise ValueError(f"top_k={self.top_k} is for task='multiclass'; task='binary' takes 1")

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    preds, target = jnp.asarray(preds), jnp.asarray(target)
    if self.task == "binary":
      hits, valid, bad = self._binary_hits(preds, target, mask)
    else:
      hits, valid, bad = self._class_hits(preds, target, mask)
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
      ignore_index=None,
    )
    guess = probabilities(elements.scores[..., 0], self.from_logits) > self.threshold
    bad = {k: v[..., 0] for k, v in elements.invalid.items()}
    return guess == elements.truth[..., 0], elements.valid[..., 0], bad

  def _class_hits(self, preds, target, mask):
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
    elements = class_elements(preds, target, mask, num_classes=num_classes, ignore_index=None)
    hits = _any_hit(elements.top_k(self.top_k), elements.labels)
    return hits, elements.valid, elements.invalid

  def compute(self) -> jax.Array:
    """Weighted accuracy over real elements; NaN if none was seen."""
    return self.correct.total() / self.weight.total()


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
  raise ValueError(
    f"Accuracy (task='multiclass'): preds has shape {preds.shape} and dtype {preds.dtype}, "
    f"target {target.shape}: one score per row is not a class id. Pass logits or "
    f"probabilities [..., C] for C >= 2 classes (target.shape + [C]), int class ids of "
    f'target\'s shape, or for a binary model use Accuracy(task="binary", threshold=0.5) '
    "(add from_logits=True for logits)"
  )


def _holds_ints(preds: jax.Array) -> bool:
  return bool(jnp.issubdtype(preds.dtype, jnp.integer))


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
