"""Calibration error (ECE and friends) from exact per-bin totals.

Each counted element has a confidence ``c`` and a hit ``a`` (0 or 1):

* ``task="binary"``: ``c`` = the predicted probability of the positive class, ``a`` = the
  target (a reliability diagram of the positive class, as torchmetrics does);
* ``task="multiclass"``: ``c`` = the highest class probability, ``a`` = whether its class
  (argmax) is the target.

Confidences fall in ``n_bins`` equal bins of ``[0, 1]``: ``bin = min(floor(c * n_bins),
n_bins - 1)``, with ``c * n_bins`` rounded to float32: a confidence within a float32 step of
a bin edge may fall on either side of it (float32 ``0.7``, 0.69999999, times 10 rounds to 7.0:
bin 7 of 10, as 0.7 in float64; the exact product would give bin 6). The state per bin is
the element count and hit count (:class:`~padded_eval.exact.accumulate.ExactCount`) and the
confidence total (:class:`~padded_eval.exact.accumulate.ExactSum`), so batches merge and
devices reduce exactly.
With ``N`` counted elements, ``n_b`` / ``acc_b`` / ``conf_b`` the count, mean hit and mean
confidence of bin ``b`` (over non-empty bins):

* ``norm="l1"`` (ECE, default): ``sum_b n_b / N * |acc_b - conf_b|``;
* ``norm="l2"``: ``sqrt(sum_b n_b / N * (acc_b - conf_b)**2)``;
* ``norm="max"`` (MCE): ``max_b |acc_b - conf_b|``.

Inputs are read by the one formatter of :mod:`padded_eval.metrics.classification._formatting`
(int targets; multiclass ``preds`` are ``[..., C]`` scores). Elements are dropped when
masked out, when the target is not a valid label (0/1, or a class id in ``[0, C)``) or
equals ``ignore_index``, or when the confidence is NaN. Real elements of nonzero weight that
are invalid are counted by kind (:meth:`~padded_eval.metrics.base.Metric.invalid_counts`):
``"target out of range"``, ``"nan score"`` (a multiclass row with any NaN) and
``"probability outside [0, 1]"`` (without ``from_logits``). No counted element: NaN.

:meth:`CalibrationError.bins` gives the reliability diagram's data on the host: per bin
the mean confidence, the accuracy (mean hit) and the exact count.
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval import validation
from padded_eval.exact.accumulate import ExactCount, ExactSum
from padded_eval.masking import leading_ones
from padded_eval.metrics.averages import WeightedMean, weighted_totals
from padded_eval.metrics.base import invalid_state, state
from padded_eval.metrics.classification._formatting import (
  SCORE_INVALID_KINDS,
  class_inputs,
  label_inputs,
  probabilities,
)
from padded_eval.metrics.classification._inputs import (
  ClassificationMetric,
  check_ignore_index,
  check_no_weights,
  check_task,
  config_field,
  formatted_inputs,
)

NORMS = ("l1", "l2", "max")


class CalibrationError(ClassificationMetric):
  """Expected (``l1``), root-mean-square (``l2``) or maximum calibration error.

  Args:
    n_bins: number of equal confidence bins (positional; default 15, like torchmetrics).
    task: ``"binary"`` (``preds`` ``[...]`` probabilities, ``target`` ``[...]`` 0/1) or
      ``"multiclass"`` (``preds`` ``[..., C]`` probabilities, ``target`` ``[...]`` ids).
    num_classes: ``C`` for multiclass; ``None`` (or 2) for binary.
    norm: ``"l1"``, ``"l2"`` or ``"max"``.
    from_logits: ``preds`` are logits (sigmoid for binary, softmax for multiclass).
    ignore_index: targets equal to it are not counted.

  Examples:
    >>> import jax.numpy as jnp
    >>> m = CalibrationError(2, task="binary").update(preds=jnp.array([0.2, 0.9]),
    ...                                               target=jnp.array([0, 1]))
    >>> round(float(m.compute()), 4)
    0.15
  """

  higher_is_better: ClassVar[bool | None] = False

  n_bins: int = 15
  task: str = config_field(default="binary")
  norm: str = config_field(default="l1")
  count: ExactCount = state(lambda self: ExactCount.zeros((self.n_bins,)))
  hits: ExactCount = state(lambda self: ExactCount.zeros((self.n_bins,)))
  confidence: ExactSum = state(lambda self: ExactSum.zeros((self.n_bins,)))

  invalid_kinds: ClassVar[tuple[str, ...]] = SCORE_INVALID_KINDS
  _tasks: ClassVar[tuple[str, ...]] = ("binary", "multiclass")
  _scores_only: ClassVar[bool] = True

  def _check_config(self):
    super()._check_config()
    validation.check_positive_int("n_bins", self.n_bins)
    validation.check_choice("norm", self.norm, NORMS)

  def _confidences(self, preds, target, mask):
    """``(confidence float32, hit bool, valid bool, invalid counts)``, target's shape."""
    inputs, invalid = self.elements(preds, target, mask)
    if self.task == "binary":
      labeled = label_inputs(inputs)
      confidence = probabilities(labeled.scores[..., 0], self.from_logits)
      hit, valid = labeled.truth[..., 0], labeled.valid[..., 0]
    else:
      elements = class_inputs(inputs, scores=True)
      probs = probabilities(elements.scores, self.from_logits, axis=-1)
      confidence = jnp.max(probs, axis=-1)
      hit = elements.top_k(1)[..., 0] == elements.labels
      valid = elements.valid
    return confidence, hit, valid & ~jnp.isnan(confidence), invalid

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    check_no_weights(weights, self)
    confidence, hit, valid, invalid = self._confidences(preds, target, mask)
    confidence = jnp.clip(jnp.where(valid, confidence, 0.0), 0.0, 1.0).reshape(-1)
    bins = jnp.minimum(jnp.floor(confidence * self.n_bins), self.n_bins - 1).astype(jnp.int32)
    bins = jnp.where(valid.reshape(-1), bins, self.n_bins)  # out of range: dropped

    def per_bin(values, dtype):
      return jnp.zeros((self.n_bins,), dtype).at[bins].add(values, mode="drop")

    return {
      "count": ExactCount.of(per_bin(jnp.ones_like(bins), jnp.int32)),
      "hits": ExactCount.of(per_bin(hit.reshape(-1).astype(jnp.int32), jnp.int32)),
      "confidence": ExactSum.of(per_bin(confidence, jnp.float32)),
      "invalid": invalid,
    }

  def compute(self) -> jax.Array:
    """Scalar float32 calibration error; NaN if no element was counted."""
    count = self.count.total()
    total = jnp.sum(count)
    filled = count > 0
    safe_count = jnp.where(filled, count, 1.0)
    gap = (self.hits.total() - self.confidence.total()) / safe_count  # acc_b - conf_b
    share = count / jnp.where(total > 0, total, 1.0)
    if self.norm == "l1":
      value = jnp.sum(jnp.where(filled, share * jnp.abs(gap), 0.0))
    elif self.norm == "l2":
      value = jnp.sqrt(jnp.sum(jnp.where(filled, share * gap * gap, 0.0)))
    else:
      value = jnp.max(jnp.where(filled, jnp.abs(gap), 0.0))
    return jnp.where(total > 0, value, jnp.nan)

  def bins(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-bin ``(mean_confidence, accuracy, count)`` from the exact state, on the host.

    Bin ``b`` holds the confidences in ``[b / n_bins, (b + 1) / n_bins)`` (the last bin
    includes 1).

    Returns:
      float64 ``[n_bins]`` mean confidence and accuracy (NaN for empty bins), and int64
      ``[n_bins]`` exact counts.

    Raises:
      ValueError: if the state is not reduced to ``[n_bins]`` (a stacked state).
    """
    count = self.count.to_numpy()
    if count.shape != (self.n_bins,):
      raise ValueError(
        f"the state has shape {count.shape}; expected {(self.n_bins,)} "
        "(aggregate() a stacked or per-device state first)"
      )
    filled = np.where(count > 0, count, 1).astype(np.float64)
    mean_confidence = np.where(count > 0, self.confidence.to_numpy() / filled, np.nan)
    accuracy = np.where(count > 0, self.hits.to_numpy() / filled, np.nan)
    return mean_confidence, accuracy, count


class BrierScore(WeightedMean):
  """Brier score: the weighted mean over rows of ``sum_c (p_c - y_c)**2`` (scikit-learn's
  ``brier_score_loss``, with its ``scale_by_half``).

  * ``task="multiclass"``: ``preds`` ``[..., C]`` probabilities (or logits with
    ``from_logits=True``: softmax), ``target`` ``[...]`` class ids; the squared distance to
    the one-hot target, in ``[0, 2]`` (torchmetrics has no Brier score).
  * ``task="binary"``: ``preds`` ``[...]`` probabilities of class 1 (or logits: sigmoid),
    ``target`` ``[...]`` 0/1; the two-column sum is ``2 (p - y)**2``.

  Args:
    scale_by_half: scikit-learn's: ``"auto"`` (default) halves the sum for two columns (binary,
      or multiclass with ``num_classes=2``: ``(p - y)**2`` in ``[0, 1]``) and not for more;
      True always halves it, False never.

  Update keywords: ``preds``, ``target``, ``mask``, ``weights`` (sample weights, a prefix of
  ``target``'s shape, scikit-learn's ``sample_weight``). Elements are left out, and counted by
  kind (``invalid_counts()``), for a target that is not a label (``"target out of range"``),
  a NaN score (``"nan score"``, any NaN in a multiclass row) or a probability outside
  ``[0, 1]`` without ``from_logits``; ``ignore_index`` targets are left out. NaN when nothing
  was counted.

  Example:
    >>> import jax.numpy as jnp
    >>> m = BrierScore(num_classes=2).update(preds=jnp.array([[0.8, 0.2], [0.4, 0.6]]),
    ...                                      target=jnp.array([0, 0]))
    >>> round(float(m.compute()), 4)  # two classes: halved, as scikit-learn's "auto"
    0.2
  """

  higher_is_better: ClassVar[bool | None] = False

  task: str = config_field(default="multiclass")
  num_classes: int | None = config_field(default=None)
  from_logits: bool = config_field(default=False)
  ignore_index: int | None = config_field(default=None)
  scale_by_half: bool | str = config_field(default="auto")
  invalid: ExactCount = state(invalid_state)

  invalid_kinds: ClassVar[tuple[str, ...]] = SCORE_INVALID_KINDS

  def _check_config(self):
    check_task(self.task, self.num_classes, tasks=("binary", "multiclass"))
    validation.check_flag("from_logits", self.from_logits)
    check_ignore_index(self.ignore_index)
    if not (
      self.scale_by_half is True or self.scale_by_half is False or self.scale_by_half == "auto"
    ):
      raise ValueError(
        f"scale_by_half must be 'auto', True or False (scikit-learn's); got {self.scale_by_half!r}"
      )

  def _factor(self) -> float:
    """What the row's sum of squares is multiplied by: 1/2 where it is halved (binary rows
    hold the halved two-column sum already)."""
    two_columns = self.task == "binary" or self.num_classes == 2
    halved = two_columns if self.scale_by_half == "auto" else self.scale_by_half
    if self.task == "binary":
      return 1.0 if halved else 2.0
    return 0.5 if halved else 1.0

  def number_inputs(self) -> tuple[str, ...]:
    return ("preds",)  # target holds class ids

  def _values(self, *, preds, target, **_):
    return jnp.asarray(preds), "preds"

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    inputs, kinds = formatted_inputs(self, preds, target, mask, weights, scores_only=True)
    if self.task == "multiclass":
      elements = class_inputs(inputs, scores=True)
      probs = probabilities(elements.scores, self.from_logits, axis=-1)
      truth = elements.labels[..., None] == leading_ones(
        jnp.arange(self.num_classes), elements.labels.ndim
      )
      valid = elements.valid & ~jnp.any(jnp.isnan(probs), -1)
    else:
      labeled = label_inputs(inputs)
      probs = probabilities(labeled.scores[..., 0], self.from_logits)[..., None]
      truth, valid = labeled.truth, labeled.valid[..., 0] & ~jnp.isnan(probs[..., 0])
    squares = jnp.sum(jnp.square(jnp.where(valid[..., None], probs, 0.0) - truth), -1)
    squares = squares * self._factor()  # a power of two: exact
    if self.task == "binary":
      kinds = {k: v[..., 0] for k, v in kinds.items()}
    invalid = self.count_invalid(**kinds)
    totals = weighted_totals(squares, valid, weights, "preds", nonnegative=True)
    return totals.then(lambda pair: {"total": pair[0], "weight": pair[1], "invalid": invalid})
