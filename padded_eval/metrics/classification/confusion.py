"""Classification metrics from one exact confusion state.

Precision, recall and F-scores cannot be averaged per batch; they need counts.
Every metric here, and the per-class scores of :mod:`padded_eval.metrics.classification.scores`
(Precision, Recall, F-scores, Specificity, JaccardIndex), keeps exact integer counts (:class:`~padded_eval.exact.accumulate.ExactCount`,
exact past ``2**31``, reduced with ``psum``) and differs from the others only in
``compute``:

* per-class counts ``[4, L]`` (rows tp, fp, fn, tn; ``L`` = 1 for binary, else
  ``num_classes``) for Precision, Recall, F-scores, Specificity and JaccardIndex;
* the full ``[C, C + 1]`` matrix (rows true class, columns predicted; the last column
  counts predictions of no class) for multiclass ConfusionMatrix, MatthewsCorrCoef
  and CohenKappa.

Inputs (``task``), read by the one formatter of :mod:`padded_eval.metrics.classification._formatting`:

* ``"binary"``: ``preds`` ``[...]`` probabilities (or logits with ``from_logits=True``,
  or hard 0/1 ints), positive where the probability (``sigmoid`` of logits) is
  ``> threshold`` (a NaN score is negative); ``target`` ``[...]`` int 0/1.
* ``"multiclass"``: ``preds`` ``[...]`` int class ids or ``[..., C]`` scores (argmax, or
  the ``top_k`` best; NaN ranks worst); ``target`` ``[...]`` int class ids
  (segmentation: ``[B, H, W]``).
* ``"multilabel"``: ``preds`` ``[..., C]`` probabilities / logits / 0-1; ``target``
  ``[..., C]`` int 0/1.

Float targets are refused (``ValueError``). ``mask`` is a prefix of ``target``'s shape
(``[B]`` or ``[B, H, W]``). An element counts when it is real, its target is a valid
label (0/1, or a class id in ``[0, C)``) and its target is not ``ignore_index``.
Padded elements are dropped from every count, with ``where``, so NaN or garbage there
never arrives. Real elements (of nonzero weight) that are invalid are counted by kind in
the ``invalid`` state (:meth:`~padded_eval.metrics.base.Metric.invalid_counts`;
``masked_eval`` reports them): ``"target out of range"`` (the element is not counted), ``"pred id out of
range"`` (a class id outside ``[0, C)``: a wrong prediction, a miss of the true class
that predicts no class), ``"nan score"`` and ``"probability outside [0, 1]"`` (binary
and multilabel preds without ``from_logits``: logits passed as probabilities).

``ignore_index``: elements whose target equals it are removed from every statistic
(never counted as negatives). If it is a class id (``0 <= ignore_index < C``,
multiclass), that class is also left out of every average (micro sums, macro and
weighted means) and reads NaN with ``average=None``; predictions of it on other
elements are then misses of their true class only. This equals scikit-learn on the
elements kept with ``labels=[every class but ignore_index]`` (the torchmetrics bug
#1691, where the ignored class counted as a 0 in macro averages, cannot happen).

Averages: ``"micro"`` scores the summed counts. ``"macro"`` is the unweighted mean
over classes: for ``task="multiclass"`` over the classes that occur in the target or
the predictions (scikit-learn's default ``labels``, torchmetrics' multiclass rule); for
``task="multilabel"`` over every label, present or not (scikit-learn's and
torchmetrics' multilabel rule: an absent label scores 0, or 1 for Specificity).
``"weighted"`` weights classes (labels) by their support (true count), so absent ones
weigh 0 in both tasks. ``None`` gives the ``[C]`` per-class scores. Undefined ratios
count as ``zero_division`` (default 0; 1 or NaN as in scikit-learn). With ``task="binary"`` ``average`` is not used: the
positive class is scored. A metric that has seen no counted element computes NaN.

With ``top_k > 1`` (multiclass Precision, Recall, F-scores, Specificity, JaccardIndex),
``top_k_rule`` says what is predicted:

* ``"every"`` (default): each of the ``k`` best classes is predicted (``k`` predictions
  per element: a target among them is a true positive, the others are false positives);
  per class ``tn = N - tp - fp - fn`` over the ``N`` counted elements.
* ``"torchmetrics"``: torchmetrics 1.9's rule, one prediction per element: the target
  when it is among the ``k`` best, else the best class.

Both give the same micro recall (the top-k accuracy); precision and the averaged scores
differ.

Per sample (Precision, Recall, F-scores, Specificity, JaccardIndex):
``multidim_average="samplewise"`` scores each batch row over its extra axes
(torchmetrics' meaning) and ``average="samples"`` (multilabel) each ``[C]`` row of labels
(scikit-learn's); ``compute()`` is the mean over samples (a fixed-size, psum-able
state) and ``sample_values(...)`` the per-sample values, for ``masked_eval(...,
outputs=True)``.

Differences that remain, ours beside the peer's:

* ``ignore_index`` that is a class id: left out of every average here; torchmetrics
  counts it as a 0 in macro averages (#1691); scikit-learn has no ``ignore_index``
  (equal to ours with ``labels=`` the other classes).
* ``samplewise``: ``compute()`` is the mean of the ``[N]`` per-sample values that
  torchmetrics returns (``sample_values`` gives them per batch); a sample with no
  counted element (all padding or ignored) is not a sample (NaN in ``sample_values``).
* ``zero_division=nan`` with ``"macro"`` / ``"weighted"``: NaN classes are left out of
  the mean (scikit-learn's ``_nanaverage``). JaccardIndex takes 0 or 1 only
  (scikit-learn's ``jaccard_score`` refuses NaN).

Counts are of elements: sample ``weights`` are refused (``ValueError``) except by the
per-class scores and ConfusionMatrix with ``weighted=True``
(:class:`~padded_eval.metrics.classification.scores.ClassScore`, scikit-learn's ``sample_weight``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval import validation
from padded_eval.exact.accumulate import Accumulator, ExactCount, ExactSum
from padded_eval.metrics.base import state
from padded_eval.metrics.classification import exact_products, per_sample
from padded_eval.metrics.classification._formatting import (
  class_inputs,
  label_inputs,
  probabilities,
)
from padded_eval.metrics.classification._inputs import (
  MAX_MATRIX_CLASSES,
  ClassificationMetric,
  check_no_weights,
  class_counts,
  config_field,
  divide,
  label_counts,
  matrix_counts,
  num_columns,
  predicted_classes,
)

# --- the shared state ------------------------------------------------------------------


TOP_K_RULES = ("every", "torchmetrics")


class ConfusionState(ClassificationMetric):
  """Base of the confusion-count metrics: configuration, inputs and exact counts.

  Subclasses define ``compute`` from :meth:`class_stats` (or :meth:`matrix`); the
  class attribute ``_full_matrix`` asks for ``[C, C + 1]`` counts in the multiclass task
  (the last column: predictions of no class). Configuration fields are keyword-only (see
  the module docstring for their meaning).
  """

  num_classes: int | None = config_field(default=None)
  task: str = config_field(default="multiclass")
  threshold: float = config_field(default=0.5)
  top_k: int = config_field(default=1)
  top_k_rule: str = config_field(default="every")
  confusion: ExactCount = state(lambda self: self._empty_confusion())

  _full_matrix: ClassVar[bool] = False

  def _empty_confusion(self) -> ExactCount | ExactSum:
    return ExactCount.zeros(self._counts_shape())

  def _uses_matrix(self) -> bool:
    return self._full_matrix and self.task == "multiclass"

  def _counts_shape(self) -> tuple[int, ...]:
    if self._uses_matrix():
      return (self._classes(), self._classes() + 1)
    return (4, num_columns(self.task, self.num_classes))

  def _check_config(self):
    super()._check_config()
    validation.check_probability("threshold", self.threshold)
    validation.check_positive_int("top_k", self.top_k)
    validation.check_choice("top_k_rule", self.top_k_rule, TOP_K_RULES)
    if self.top_k > 1 and (self.task != "multiclass" or self._full_matrix):
      raise ValueError(
        f"top_k={self.top_k} is for task='multiclass' Precision, Recall, "
        f"F-scores, Specificity and JaccardIndex; {type(self).__name__} with "
        f"task={self.task!r} takes top_k=1"
      )
    if self.task == "multiclass" and self.top_k > self._classes():
      raise ValueError(f"top_k={self.top_k} exceeds num_classes={self.num_classes}")
    if self._uses_matrix() and self._classes() > MAX_MATRIX_CLASSES:
      raise ValueError(
        f"num_classes={self.num_classes} is too many for a [C, C + 1] matrix; "
        f"expected at most {MAX_MATRIX_CLASSES}"
      )

  def _batch_state(
    self, *, preds, target, mask=None, weights=None, **_
  ) -> Mapping[str, Accumulator]:
    check_no_weights(weights, self)
    inputs, invalid = self.elements(preds, target, mask)
    if self.task != "multiclass":
      labeled = label_inputs(inputs)
      guess = probabilities(labeled.scores, self.from_logits) > self.threshold  # NaN: False
      counts = label_counts(labeled.truth, guess, labeled.valid)
    else:
      elements = class_inputs(inputs)
      if self._uses_matrix():
        predicted = elements.top_k(1)
        counts = matrix_counts(elements.labels, predicted, elements.valid, self._classes())
      else:
        predicted = predicted_classes(self, elements)
        counts = class_counts(elements.labels, predicted, elements.valid, self._classes())
    return {"confusion": ExactCount.of(counts), "invalid": invalid}

  # --- views of the counts ---

  def class_stats(self) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """``(tp, fp, fn, tn)``, float32 ``[L]`` each (``L`` = 1 for binary)."""
    counts = self.confusion.total()
    if not self._uses_matrix():
      return counts[0], counts[1], counts[2], counts[3]
    c = self.num_classes
    tp = jnp.diagonal(counts[:, :c])
    fp = jnp.sum(counts[:, :c], axis=0) - tp
    fn = jnp.sum(counts, axis=1) - tp
    return tp, fp, fn, jnp.sum(counts) - tp - fp - fn

  def table(self) -> ExactCount:
    """The exact square table ``[K, K]`` of MatthewsCorrCoef and CohenKappa.

    Multiclass: ``K = C + 1``, the last class is "no class predicted" (an out-of-range
    id or an all-NaN row; its row is empty). Binary and multilabel: ``[[tn, fp], [fn,
    tp]]`` summed over the labels.
    """
    if self._uses_matrix():
      return jax.tree.map(lambda limb: jnp.pad(limb, [(0, 1), (0, 0)]), self.confusion)
    summed = jax.tree.map(lambda limb: limb.T, self.confusion).aggregate()  # [4]
    return jax.tree.map(
      lambda s: jnp.stack([jnp.stack([s[3], s[1]]), jnp.stack([s[2], s[0]])]), summed
    )

  def included_classes(self) -> jax.Array:
    """bool ``[L]``: False only for a multiclass ``ignore_index`` that is a class id."""
    return jnp.asarray(super().included_classes())

  def seen(self) -> jax.Array:
    """Whether any element was counted."""
    return jnp.sum(self.confusion.total()) > 0


NORMALIZE = (None, "true", "pred", "all")


class ConfusionMatrix(ConfusionState):
  """Confusion counts, rows true class, columns predicted (scikit-learn convention).

  ``compute()``: float32 ``[C, C]`` (multiclass), ``[2, 2]`` ``[[tn, fp], [fn, tp]]``
  (binary) or ``[C, 2, 2]`` per label (multilabel, like ``multilabel_confusion_matrix``);
  all NaN before any counted element. :meth:`counts` gives exact int64 counts on the host.
  Multiclass predictions of no class (an out-of-range id, an all-NaN row) are counted in
  the state (see :meth:`table`) but not shown, like scikit-learn's ``labels=range(C)``.

  Args:
    num_classes: the number of classes (the only positional argument; ``None`` for binary).
    normalize: ``None`` (counts), ``"true"`` (rows sum to 1), ``"pred"`` (columns sum to
      1) or ``"all"``; an all-zero row or column stays 0.
    weighted: each element counts with its sample ``weights`` (the update keyword, a
      prefix of ``target``'s shape; scikit-learn's ``confusion_matrix(sample_weight=)``),
      summed in float32 within a batch (exact for integer weights up to ``2**24`` per
      cell) and in compensated sums (:class:`~padded_eval.exact.accumulate.ExactSum`)
      across batches and devices; :meth:`counts` is then float64. Default False:
      ``weights`` are refused.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> logits = np.array([[2.0, 1, 0], [0, 2.0, 1], [1, 0, 2.0], [2.0, 0, 1]])
    >>> labels = np.array([0, 1, 1, 2])
    >>> m = pe.metrics.ConfusionMatrix(num_classes=3).update(preds=logits, target=labels)
    >>> m.counts().tolist()  # rows: the labels, columns: the predictions
    [[1, 0, 0], [0, 1, 1], [1, 0, 0]]
  """

  higher_is_better: ClassVar[bool | None] = None

  num_classes: int | None = None
  normalize: str | None = config_field(default=None)
  weighted: bool = config_field(default=False)
  _full_matrix: ClassVar[bool] = True

  def _check_config(self):
    super()._check_config()
    validation.check_choice("normalize", self.normalize, NORMALIZE)
    validation.check_flag("weighted", self.weighted)

  def _empty_confusion(self):
    if self.weighted:  # float weights: compensated sums, not integer counts
      return ExactSum.zeros(self._counts_shape())
    return super()._empty_confusion()

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    if not self.weighted:
      return super()._batch_state(preds=preds, target=target, mask=mask, weights=weights)
    elements, invalid = self.elements(preds, target, mask, weights)
    if self.task == "multiclass":
      counts = per_sample.weighted_matrix(self, elements, weights)
    else:
      counts = per_sample.weighted_counts(self, elements, weights)
    return {"confusion": ExactSum.of(counts), "invalid": invalid}

  def _layout(self, counts):
    if self.task == "multiclass":
      return counts[:, : self.num_classes]
    tp, fp, fn, tn = counts
    table = jnp.stack([jnp.stack([tn, fp], -1), jnp.stack([fn, tp], -1)], -2)  # [L, 2, 2]
    return table[0] if self.task == "binary" else table

  def counts(self) -> np.ndarray:
    """The exact counts as an int64 numpy array (host side), in ``compute()``'s layout
    (float64 weighted sums with ``weighted=True``)."""
    counts = self.confusion.to_numpy()
    if self.task == "multiclass":
      return counts[:, : self.num_classes]
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

  Multiclass uses the ``[C + 1, C + 1]`` :meth:`table` (scikit-learn's formula; a
  prediction of no class is its own class, as scikit-learn treats an unknown label);
  binary and multilabel score the ``[2, 2]`` table summed over labels (torchmetrics).

  With ``n`` elements, ``c`` correct, ``t_k`` / ``p_k`` the true / predicted counts of
  class ``k``: ``(c n - sum t_k p_k) / sqrt((n^2 - sum p_k^2) (n^2 - sum t_k^2))``, each
  of the three terms formed exactly from the integer counts
  (:mod:`padded_eval.metrics.classification.exact_products`) and rounded once, so nearly constant
  inputs do not cancel (constant inputs give exactly 0, like scikit-learn).

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> preds, labels = np.array([1, 0, 0, 0, 0, 1]), np.array([1, 1, 0, 0, 0, 0])
    >>> mcc = pe.metrics.MatthewsCorrCoef(task="binary").update(preds=preds, target=labels)
    >>> float(mcc.compute())  # (tp tn - fp fn) / sqrt(...) = (1 * 3 - 1 * 1) / sqrt(2 * 2 * 4 * 4)
    0.25
  """

  higher_is_better: ClassVar[bool | None] = True

  _full_matrix: ClassVar[bool] = True

  def compute(self) -> jax.Array:
    value = exact_products.matthews_corrcoef(self.table())
    return jnp.where(self.seen(), value, jnp.nan)


KAPPA_WEIGHTS = (None, "linear", "quadratic")


class CohenKappa(ConfusionState):
  """Cohen's kappa, agreement of preds and target beyond chance (binary / multiclass).

  Args:
    weights: ``None``, ``"linear"`` or ``"quadratic"`` disagreement weights over the
      class ids ``0..C-1`` (scikit-learn's ``cohen_kappa_score(labels=range(C))``).
      Configuration, not the update keyword ``weights`` (which is not supported).
    replace_undefined_by: the value where kappa is undefined (the chance disagreement is
      0: target and preds of one and the same class), a float in ``[-1, 1]`` or
      ``float("nan")``; scikit-learn 1.6+'s ``replace_undefined_by``. Default 0 (as
      before; scikit-learn's default is NaN). A metric that counted nothing is NaN.

  A multiclass prediction of no class (an out-of-range id or an all-NaN row) is class
  ``C`` of the :meth:`table`, a disagreement with every target. Undefined kappa (chance
  agreement 1, e.g. constant inputs) computes ``replace_undefined_by`` (default 0).
  ``1 - observed / chance`` is formed from
  exact integer products of the counts and rounded once
  (:func:`padded_eval.metrics.classification.exact_products.cohen_kappa`), so agreement at chance level
  is exactly 0, as in scikit-learn.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> logits = np.array([[2.0, 1, 0], [0, 2.0, 1], [1, 0, 2.0], [2.0, 0, 1]])
    >>> labels = np.array([0, 1, 1, 2])
    >>> m = pe.metrics.CohenKappa(num_classes=3).update(preds=logits, target=labels)
    >>> round(float(m.compute()), 4)  # (1/2 - 5/16) / (1 - 5/16)
    0.2727
  """

  higher_is_better: ClassVar[bool | None] = True

  weights: str | None = config_field(default=None)
  replace_undefined_by: float = config_field(default=0.0)
  _full_matrix: ClassVar[bool] = True
  _tasks: ClassVar[tuple[str, ...]] = ("binary", "multiclass")

  def _check_config(self):
    super()._check_config()
    validation.check_choice("weights", self.weights, KAPPA_WEIGHTS)
    value = self.replace_undefined_by
    if not validation.is_number(value) or not (np.isnan(value) or -1.0 <= value <= 1.0):
      raise ValueError(
        "replace_undefined_by must be a float in [-1, 1] or float('nan') (scikit-learn's "
        f"choices); got {value!r}"
      )
    # one NaN object, so equal configurations compare equal (jit's cache key)
    object.__setattr__(self, "replace_undefined_by", math.nan if np.isnan(value) else float(value))

  def compute(self) -> jax.Array:
    value = exact_products.cohen_kappa(
      self.table(), weights=self.weights, undefined=self.replace_undefined_by
    )
    return jnp.where(self.seen(), value, jnp.nan)
