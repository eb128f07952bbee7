"""Margin losses of classifier scores: HingeLoss (binary, Crammer-Singer, one-vs-all).

The state is the compensated sum of per-element losses and of their weights
(:class:`~padded_eval.exact.accumulate.ExactSum`), so batches, devices and hosts merge
exactly; the value is their ratio.
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp

from padded_eval import validation
from padded_eval.exact.accumulate import ExactCount, ExactSum
from padded_eval.masking import element_weights, leading_ones
from padded_eval.metrics.averages import zero_total
from padded_eval.metrics.base import Metric, empty_count, invalid_state, state
from padded_eval.metrics.classification._formatting import (
  NAN_SCORE,
  TARGET_OUT_OF_RANGE,
  class_inputs,
  label_inputs,
)
from padded_eval.metrics.classification._inputs import (
  check_ignore_index,
  check_task,
  config_field,
  formatted_inputs,
)

MULTICLASS_MODES = ("crammer-singer", "one-vs-all")


class HingeLoss(Metric):
  """The mean hinge loss ``max(0, 1 - margin)`` (squared with ``squared=True``).

  torchmetrics' ``HingeLoss`` (``BinaryHingeLoss``, ``MulticlassHingeLoss``) and
  scikit-learn's ``hinge_loss``:

  * ``task="binary"``: ``preds`` ``[...]`` scores, ``target`` ``[...]`` 0/1; the margin is
    ``s`` for target 1 and ``-s`` for target 0.
  * ``task="multiclass"``: ``preds`` ``[..., C]`` scores, ``target`` ``[...]`` class ids.
    ``multiclass_mode="crammer-singer"`` (default; scikit-learn's only mode): the margin is
    ``s[y] - max_{j != y} s[j]``, one loss per element. ``"one-vs-all"``: each class's
    binary margin (``s_c`` where ``y = c``, else ``-s_c``); ``compute()`` is ``[C]``.

  Scores are used as given (scikit-learn's ``pred_decision``): nothing is guessed from
  their range. torchmetrics applies a sigmoid (softmax) when a score lies outside
  ``[0, 1]``; pass ``jax.nn.sigmoid(logits)`` (``softmax``) for its value on logits.

  Args:
    task: ``"binary"`` or ``"multiclass"``.
    num_classes: ``C`` (multiclass).
    squared: the mean of squared hinge losses.
    multiclass_mode: ``"crammer-singer"`` or ``"one-vs-all"`` (multiclass).
    ignore_index: elements whose target equals it are left out.

  Update keywords: ``preds``, ``target``, ``mask``, ``weights`` (sample weights, a prefix
  of ``target``'s shape; scikit-learn's ``sample_weight``). Real elements with a target
  that is not a label, or a NaN score, are left out and counted by kind
  (:meth:`invalid_counts`). ``compute()``: float32 scalar (``[C]`` one-vs-all); NaN before
  any counted element. Lower is better.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> scores = np.array([2.0, -0.5, 0.3, -3.0])
    >>> labels = np.array([1, 1, 0, 0])
    >>> m = pe.metrics.HingeLoss(task="binary").update(preds=scores, target=labels)
    >>> round(float(m.compute()), 4)  # (0 + 1.5 + 1.3 + 0) / 4
    0.7
  """

  higher_is_better: ClassVar[bool | None] = False

  task: str = config_field(default="binary")
  num_classes: int | None = config_field(default=None)
  squared: bool = config_field(default=False)
  multiclass_mode: str = config_field(default="crammer-singer")
  ignore_index: int | None = config_field(default=None)
  total: ExactSum = state(lambda self: ExactSum.zeros(self._value_shape()))
  weight: ExactSum = state(zero_total)
  invalid: ExactCount = state(invalid_state)
  example_rows: ExactCount = state(empty_count)

  invalid_kinds: ClassVar[tuple[str, ...]] = (TARGET_OUT_OF_RANGE, NAN_SCORE)

  def _check_config(self):
    check_task(self.task, self.num_classes, tasks=("binary", "multiclass"))
    validation.check_flag("squared", self.squared)
    validation.check_choice("multiclass_mode", self.multiclass_mode, MULTICLASS_MODES)
    check_ignore_index(self.ignore_index)

  def _one_vs_all(self) -> bool:
    return self.task == "multiclass" and self.multiclass_mode == "one-vs-all"

  def _value_shape(self) -> tuple[int, ...]:
    if not self._one_vs_all():
      return ()
    assert self.num_classes is not None  # check_task: multiclass names its classes
    return (self.num_classes,)

  def number_inputs(self) -> tuple[str, ...]:
    return ("preds",)  # target holds labels

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    inputs, invalid = formatted_inputs(  # scores as given: no probability range
      self, preds, target, mask, weights, scores_only=True, from_logits=True
    )
    if self.task == "binary":
      labeled = label_inputs(inputs)
      scores, truth = labeled.scores[..., 0], labeled.truth[..., 0]
      valid = labeled.valid[..., 0] & ~jnp.isnan(scores)
      invalid = {k: v[..., 0] for k, v in invalid.items()}
      margin = jnp.where(truth, scores, -scores)
    else:
      elements = class_inputs(inputs, scores=True)
      assert elements.scores is not None  # scores_only
      scores = elements.scores
      valid = elements.valid & ~jnp.any(jnp.isnan(scores), axis=-1)
      truth = elements.labels[..., None] == leading_ones(
        jnp.arange(self.num_classes), elements.labels.ndim
      )
      if self._one_vs_all():
        margin = jnp.where(truth, scores, -scores)  # [..., C]
      else:
        others = jnp.max(jnp.where(truth, -jnp.inf, scores), axis=-1)
        margin = jnp.sum(jnp.where(truth, scores, 0.0), axis=-1) - others
    real, w = element_weights(valid, weights, valid.shape, "target")
    losses = jnp.maximum(1.0 - jnp.where(_fit(real, margin), margin, 0.0), 0.0)
    if self.squared:
      losses = jnp.square(losses)
    axes = tuple(range(valid.ndim))
    return {
      "total": ExactSum.of_sum(
        losses, axis=axes, where=_fit(real, losses), weights=_fit(w, losses)
      ),
      "weight": ExactSum.of_sum(w, where=real),
      "invalid": self.count_invalid(**invalid),
    }

  def compute(self) -> jax.Array:
    """The weighted mean loss (``[C]`` one-vs-all); NaN if nothing was counted."""
    return self.total.ratio(self.weight)


def _fit(x: jax.Array, like: jax.Array) -> jax.Array:
  """``x`` ``[...]`` with trailing axes to broadcast against ``like`` (``[...]`` or
  ``[..., C]``)."""
  return x.reshape(x.shape + (1,) * (like.ndim - x.ndim))
