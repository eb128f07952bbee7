"""The state of AUROC and AUPRC: exact per-bin histograms of scores, reducible with ``psum``.

The state is two :class:`~padded_eval.exact.accumulate.ExactCount` histograms, positives and
negatives per score bin (``[L, num_thresholds]``; ``L`` = 1 for binary, else
``num_classes``), so batches merge and devices reduce exactly. The area is computed
once, from the histograms, with exact integer suffix sums.

Bins (``binning``), monotone in the score:

* ``"logit"`` (default for binary and multiclass): ``num_thresholds`` equal bins of the
  logit over ``[-64, 64]`` (``z = log(p) - log1p(-p)``, or the logit itself with
  ``from_logits=True``); logits beyond share the end bins, and so do hard 0 / 1.
  Confident models put most scores within 1e-4 of 0 or 1, where equal probability
  bins merge them all: on 10k examples with logits ~ N(+-3, 6), 10_001 equal
  probability bins were 1.6e-2 off scikit-learn's AUPRC, these bins 2e-5.
* ``"symlog"`` (default for multilabel): equal bins of ``sign(z) * log1p(|z|)`` over the
  same logit range, so bins are ``1 + |z|`` times finer near ``z = 0`` than far out:
  the fewer bins of many labels go where logits are dense. On 128 tasks of 2_000
  examples (logits ~ N(0, s) + s for positives, s in {1, 4, 12}), 4_097 bins gave a
  macro AP 3e-5 to 3e-4 off scikit-learn (``"logit"``: 8e-5 to 2e-3); on ogbg-molpcba-
  like labels (0.5-10% positive, 40% missing, logits ~ N(-3, s) + 2s for positives, s
  in {1, 2, 4}, 4_000 rows), OGB's mean AP was 4e-4 to 5e-4 off with the default
  4_097 bins (bound 1.4e-3 to 1.9e-3), and 7e-4 to 1.1e-3 with 2_049.
* ``"linear"``: ``bin = round(clip(p, 0, 1) * (num_thresholds - 1))`` (``p`` = sigmoid of
  logits with ``from_logits=True``), bins centred on the grid ``k / (num_thresholds - 1)``.
  Exact mode: scores on that grid (hard 0/1 labels, scores rounded to 4 decimals with
  ``num_thresholds=10_001``, 8-bit scores ``k / 255`` with ``num_thresholds=256``) each
  get a bin of their own value, so both areas equal scikit-learn's (up to float32
  rounding of the final sums): their ties are real ties, which scikit-learn also counts
  as half a pair (AUROC) or one threshold (AUPRC).

Error bound: the binned promise is ``|compute() - exact| <= error_bound()``, computed from
the same counts, not a fixed tolerance (scores 0.5 and 0.5001 with target [0, 1] share a
bin: 0.5 with bound 0.5, where scikit-learn gives 1.0). Pairs in different bins are ordered exactly; a positive and a negative in
one bin count as a tie (half a pair, the trapezoid rule), so
``|AUROC - exact| <= 0.5 * sum_k pos_k * neg_k / (P * N)``, half the share of
(positive, negative) pairs sharing a bin; :meth:`AUROC.error_bound` returns it (it
counts real ties too, on which the result is exact). AUPRC (scikit-learn's step-wise
average precision) gives every positive of a bin the bin's precision;
:meth:`AUPRC.error_bound` bounds the error from the counts (the spread of the precisions
the bin's positives could have, see there). With the default 65_537 logit bins, on 10k
examples (3 seeds, prevalence 0.5 and 0.05, uniform probabilities and logits
~ N(+-m, s) for s up to 20) the error against scikit-learn was at most 4e-5 (AUROC) and
3e-4 (AUPRC).

Tasks: ``"binary"`` (``preds`` ``[...]``, ``target`` ``[...]`` 0/1); ``"multilabel"``
(``[..., C]`` both); ``"multiclass"`` one-vs-rest (``preds`` ``[..., C]`` probabilities, or
logits with ``from_logits=True`` (softmax), ``target`` ``[...]`` class ids). ``average``:
``"macro"`` (mean over classes where the area is defined), ``"weighted"`` (by
positives), ``"micro"`` (one area of the summed histograms), ``"ogb"`` (see below) or
``None`` (``[C]``). The
area is NaN where undefined: AUROC without positives or without negatives, AUPRC
without positives (so an empty metric is NaN). Inputs are read by the one formatter of
:mod:`padded_eval.metrics.classification._formatting` (int targets; multiclass ``preds`` are
``[..., C]`` scores). Elements are dropped when masked out, when the target is not a
valid label (0/1, or a class id) or equals ``ignore_index`` (a multiclass class id
``ignore_index`` is also left out of every average), or when the score is NaN. Real
elements of nonzero weight that are invalid are counted by kind
(:meth:`~padded_eval.metrics.base.Metric.invalid_counts`): ``"target out of range"``,
``"nan score"`` and ``"probability outside [0, 1]"`` (without ``from_logits``).
Memory: ``16 * L * num_thresholds`` bytes. ``num_thresholds=None`` (default) is 65_537
bins (1 MiB per class) for binary and multiclass; for multilabel, the most ``2**k + 1``
bins (at least 257, at most 65_537) whose state fits 16 MiB: 65_537 up to 15 labels,
32_769 from 16, 16_385 from 32, 8_193 from 64, 4_097 (8 MiB) from 128 (ogbg-molpcba's
128 tasks) to 255, 2_049 from 256, 1_025 from 512, and so on. The state is rewritten at
every batch, so its size is the update's cost: on a shared 2-core CPU, batches of 256
graphs and 128 tasks through a tiny model (benchmarks/bench_ogb.py), ``masked_eval``
with the default 4_097 bins took 0.87x the time of the original loop (outputs to the
host, scikit-learn per task at the end) and 2.4x that of a bare jitted loop computing
only the model's outputs (with a Mean instead: 1.4x; 2_049 bins: 1.8x; 1_025: 1.4x;
65_537: 43x); a bigger model makes the metric's share smaller. Fewer bins mean more ties:
:meth:`AUROC.error_bound` and :meth:`AUPRC.error_bound` bound the error from the state.

Exact mode (``exact=True, capacity=N``): every counted (score, label) element is kept
instead of the histograms (:mod:`padded_eval.metrics.curves.exact_scores`, ``5 * L * capacity``
bytes: ``capacity`` float32 scores and int8 labels per column, ``N`` at least the elements
one column sees, e.g. ``len(batches) * batch_size``; elements beyond it are reported as
invalid and the value is NaN), sorted once in ``compute()``: scikit-learn's
``roc_auc_score`` / ``average_precision_score`` (ties as scikit-learn counts them) on any
data, within float32 rounding (1e-6), every task and average (``"ogb"`` included);
``error_bound()`` is 0 and ``curve()`` has one point per distinct score, as scikit-learn's.
One batch's state holds only that batch's elements (``min(elements, capacity)`` slots per
column), so a step costs what the batch has, not ``capacity``; ``masked_eval`` sorts only the
used slots (rounded up to a power of two) at the end.

The areas, their curves and their modes (explicit thresholds, partial AUC, samples, one-vs-one,
sample weights, OGB's average) are in :mod:`padded_eval.metrics.curves.auc`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval import validation
from padded_eval.exact.accumulate import ExactCount, ExactSum
from padded_eval.metrics.base import state
from padded_eval.metrics.classification._formatting import (
  PROBABILITY_OUT_OF_RANGE,
  SCORE_INVALID_KINDS,
  nan_missing_labels,
  probabilities,
)
from padded_eval.metrics.classification._inputs import (
  AVERAGES,
  ClassificationMetric,
  check_no_weights,
  config_field,
  num_columns,
)
from padded_eval.metrics.curves import exact_scores, segments
from padded_eval.metrics.curves import weighted as weighted_curves
from padded_eval.metrics.curves.exact_scores import ScoreBuffer, WeightedScoreBuffer

DEFAULT_NUM_THRESHOLDS = 65_537
#: The default state of a multilabel metric stays within this many bytes (16 MiB).
MAX_DEFAULT_STATE_BYTES = 16 * 2**20
BYTES_PER_BIN = 16  # positives and negatives, two int32 limbs each
CURVE_AVERAGES = AVERAGES + ("ogb", "samples")
BINNINGS = ("logit", "symlog", "linear")
THRESHOLDS_BINNING = "thresholds"  # the binning of explicit thresholds=[...]
LOGIT_RANGE = 64.0  # logit bins span [-64, 64]; beyond, scores share the end bins
SYMLOG_RANGE = float(np.log1p(LOGIT_RANGE))  # symlog(64)
MAX_NUM_THRESHOLDS = 1 << 21  # suffix sums of 10-bit limb pieces stay below 2**31


def default_num_thresholds(task: str, num_classes) -> int:
  """The default bins: 65_537, or for multilabel the most ``2**k + 1`` whose state fits
  :data:`MAX_DEFAULT_STATE_BYTES` (4_097 for 128 labels: 8 MiB), at least 257."""
  labels = num_classes if task == "multilabel" and isinstance(num_classes, int) else 1
  bins = DEFAULT_NUM_THRESHOLDS
  while bins > 257 and BYTES_PER_BIN * max(labels, 1) * bins > MAX_DEFAULT_STATE_BYTES:
    bins = (bins - 1) // 2 + 1
  return bins


def _empty_histogram(metric):
  # exact: the scores are kept instead; "samples": the row values
  bins = 0 if metric.exact or metric.average == "samples" else metric.num_thresholds
  if metric.weighted:  # sums of sample weights per bin
    return ExactSum.zeros((metric._histogram_rows(), bins))
  return ExactCount.zeros((metric._histogram_rows(), bins))


def _empty_negatives(metric):
  # one-vs-one: the pair histogram in `positives` holds every class; one unused count here
  return ExactCount.zeros((1, 1)) if metric._pairs() else _empty_histogram(metric)


def _empty_buffer(metric):
  capacity = metric.capacity if metric.exact else 0  # binned: no scores kept
  kind = WeightedScoreBuffer if metric.weighted and metric.exact else ScoreBuffer
  return kind.zeros(num_columns(metric.task, metric.num_classes), capacity)


def score_elements(metric, preds, target, mask, weights=None):
  """``(scores float32, truth bool, valid bool, invalid counts)``, the first three ``[..., L]``.

  ``scores`` are ``preds`` as given (probabilities, or logits if ``from_logits``), except
  for multiclass logits, which become softmax probabilities (one-vs-rest columns).
  Elements with a NaN score are not counted; elements of weight 0 in ``weights`` are not
  counted invalid.
  """
  elements, invalid = metric.elements(preds, target, mask, weights)
  if metric.task == "multiclass":
    scores = probabilities(elements.scores, metric.from_logits, axis=-1)
    classes = jnp.arange(metric.num_classes)[(None,) * elements.labels.ndim]  # explicit rank
    truth = elements.labels[..., None] == classes
    valid = jnp.broadcast_to(elements.valid[..., None], scores.shape)
  else:
    scores, truth, valid = elements.scores, elements.truth, elements.valid
  return scores, truth, valid & ~jnp.isnan(scores), invalid


def suffix_sums(count: ExactCount, inclusive: bool = True) -> jax.Array:
  """float32 ``sum_{j >= k} count[..., j]`` (``j > k`` if not inclusive), from exact ints."""
  return count.suffix_totals(inclusive)


def column_totals(count: ExactCount | ExactSum) -> jax.Array:
  """float32 ``[L, 1]``: each column's total (weighted sums: compensated, rounded once)."""
  if isinstance(count, ExactSum):
    return count.suffix_totals()[..., :1]
  return jnp.sum(count.total(), -1, keepdims=True)


class ScoreHistogram(ClassificationMetric):
  """Base of the binned curve metrics; subclasses define ``_area(pos, neg)``."""

  higher_is_better: ClassVar[bool | None] = True

  num_thresholds: int | None = None
  task: str = config_field(default="binary")
  average: str | None = config_field(default="macro")
  binning: str | None = config_field(default=None)
  exact: bool = config_field(default=False)
  capacity: int | None = config_field(default=None)
  thresholds: tuple[float, ...] | None = config_field(default=None)
  weighted: bool = config_field(default=False)
  # ExactSum with weighted=True
  positives: ExactCount | ExactSum = state(_empty_histogram)
  negatives: ExactCount | ExactSum = state(_empty_negatives)
  buffer: ScoreBuffer = state(_empty_buffer)
  # average="samples": the sum of the row values and the rows scored ([1]; else [0])
  sample_scores: ExactSum = state(lambda self: ExactSum.zeros((self._samples_width(),)))
  samples: ExactCount = state(lambda self: ExactCount.zeros((self._samples_width(),)))

  _scores_only: ClassVar[bool] = True
  _takes_weights: ClassVar[bool] = False  # weighted=True (AUROC, AUPRC)
  _row_value: ClassVar[Callable[..., tuple[jax.Array, jax.Array]] | None] = (
    None  # (scores, truth, valid) -> (values [R], scored [R]), "samples"
  )

  @property
  # pyrefly: ignore[bad-override]  # a property over the class constant: kinds follow `weighted`
  def invalid_kinds(self) -> tuple[str, ...]:
    """The score kinds, and (``weighted=True``) the weights' own kind."""
    extra = (weighted_curves.INVALID_WEIGHT,) if self.weighted is True else ()
    return SCORE_INVALID_KINDS + extra

  def _samples_width(self) -> int:
    return 1 if self.average == "samples" else 0

  def _pairs(self) -> bool:
    """Whether the state is the one-vs-one pair histogram (AUROC ``multi_class="ovo"``)."""
    return False

  def _histogram_rows(self) -> int:
    return num_columns(self.task, self.num_classes)

  def __post_init__(self):
    if self.thresholds is not None:
      self._explicit_thresholds()
    if self.num_thresholds is None:
      bins = default_num_thresholds(self.task, self.num_classes)
      object.__setattr__(self, "num_thresholds", bins)
    if self.binning is None:
      binning = "symlog" if self.task == "multilabel" else "logit"
      object.__setattr__(self, "binning", binning)
    super().__post_init__()

  def _bin_count(self) -> int:
    """``num_thresholds``, an int once constructed (`__post_init__` fills the default)."""
    assert self.num_thresholds is not None
    return self.num_thresholds

  def _capacity(self) -> int:
    """``capacity`` of an ``exact=True`` metric (`_check_config` makes it an int)."""
    assert self.capacity is not None
    return self.capacity

  def _explicit_thresholds(self):
    """``thresholds=`` given: ``len + 1`` bins, binning ``"thresholds"`` (ValueError for a
    ``num_thresholds``, ``binning`` or ``exact=True`` that says otherwise)."""
    name = type(self).__name__
    thresholds = segments.normalized_thresholds(self.thresholds)
    bins = len(thresholds) + 1
    if self.num_thresholds not in (None, bins) or self.binning not in (None, THRESHOLDS_BINNING):
      raise ValueError(
        f"{name}(thresholds=...) bins the scores at those thresholds; got also "
        f"num_thresholds={self.num_thresholds!r}, binning={self.binning!r}: drop them"
      )
    if self.exact is True:
      raise ValueError(
        f"{name}(exact=True) keeps every score and needs no thresholds; got thresholds="
        f"{list(thresholds)}: drop one of them"
      )
    object.__setattr__(self, "thresholds", thresholds)
    object.__setattr__(self, "num_thresholds", bins)
    object.__setattr__(self, "binning", THRESHOLDS_BINNING)

  def _check_config(self):
    super()._check_config()
    validation.check_positive_int("num_thresholds", self.num_thresholds)
    if not 2 <= self._bin_count() <= MAX_NUM_THRESHOLDS:
      raise ValueError(
        f"num_thresholds must be an int in [2, {MAX_NUM_THRESHOLDS}]; got {self.num_thresholds!r}"
      )
    validation.check_choice("average", self.average, CURVE_AVERAGES)
    if self.thresholds is None:
      validation.check_choice("binning", self.binning, BINNINGS)
    self._check_exact()
    validation.check_flag("weighted", self.weighted)
    if self.weighted and not self._takes_weights:
      raise ValueError(
        f"{type(self).__name__} reads one point of the counted curve and takes no sample "
        "weights; got weighted=True: drop it (AUROC and AUPRC take weighted=True)"
      )
    if self.weighted:
      weighted_curves.check_weighted(self)
    if self.average == "ogb" and self.task != "multilabel":
      raise ValueError(
        f"average='ogb' averages over the tasks of task='multilabel'; got task={self.task!r}"
      )
    if self.average == "samples":
      self._check_samples()

  def _check_samples(self):
    name = type(self).__name__
    if self._row_value is None or self.task != "multilabel":
      raise ValueError(
        f"average='samples' is for task='multilabel' AUROC and AUPRC (one area per row of "
        f"labels); got {name}(task={self.task!r})"
      )
    others = {"exact": self.exact, "thresholds": self.thresholds}
    others["max_fpr"] = getattr(self, "max_fpr", None)
    given = [k for k, v in others.items() if v not in (None, False)]
    if given:
      raise ValueError(
        f"{name}(average='samples') computes each row's area exactly; drop {', '.join(given)}"
      )

  def _check_exact(self):
    name = type(self).__name__
    validation.check_flag("exact", self.exact)
    if not self.exact:
      if self.capacity is not None:
        raise ValueError(
          f"capacity sizes the kept scores of {name}(exact=True); got capacity="
          f"{self.capacity!r} with exact=False: pass exact=True, or drop capacity"
        )
      return
    capacity = self.capacity
    if not validation.is_int(capacity) or not 1 <= capacity <= exact_scores.MAX_CAPACITY:
      raise ValueError(
        f"{name}(exact=True) keeps every counted element: capacity must be an int in [1, "
        f"{exact_scores.MAX_CAPACITY}], the most elements one class column sees (rows x "
        f"spatial elements), e.g. capacity=len(batches) * batch_size; got {self.capacity!r}"
      )

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    if not self.weighted:
      check_no_weights(weights, self)
    if self.average == "ogb":
      target, mask = nan_missing_labels(target, mask)
    scores, truth, valid, invalid = score_elements(self, preds, target, mask, weights)
    if self.weighted:
      return self._weighted_state(scores, truth, valid, invalid, mask, weights)
    if self.exact:
      return {"buffer": ScoreBuffer.of(scores, truth, valid, self._capacity()), "invalid": invalid}
    if self.average == "samples":
      row_value = type(self)._row_value
      assert row_value is not None  # _check_config: average='samples' has a row value
      values, scored = row_value(scores, truth, valid)
      return {
        "sample_scores": ExactSum.of_sum(values, where=scored)[None],
        "samples": ExactCount.of(jnp.sum(scored, dtype=jnp.int32)[None]),
        "invalid": invalid,
      }
    t = self._bin_count()
    columns = scores.shape[-1]
    bins = self._bins(jnp.where(valid, scores, 0.5))
    column = jnp.broadcast_to(jnp.arange(columns), truth.shape)  # inputs may have extra axes
    index = column * (2 * t) + truth.astype(jnp.int32) * t + bins
    flat = jnp.where(valid, index, 2 * t * columns).reshape(-1)
    counts = jnp.zeros((2 * t * columns,), jnp.int32).at[flat].add(1, mode="drop")
    counts = counts.reshape(columns, 2, t)
    return {
      "positives": ExactCount.of(counts[:, 1]),
      "negatives": ExactCount.of(counts[:, 0]),
      "invalid": invalid,
    }

  def _weighted_state(self, scores, truth, valid, invalid, mask, weights):
    """``weighted=True``: each counted element adds its weight to its bin (see
    :mod:`padded_eval.metrics.curves.weighted`); bad weights are counted, not used."""
    w, bad = weighted_curves.element_weights_of(self, truth, mask, weights)
    valid = valid & (w > 0)
    invalid = invalid.merge(self.count_invalid(**{weighted_curves.INVALID_WEIGHT: bad}))
    if self.exact:  # each kept element keeps its weight
      buffer = WeightedScoreBuffer.of(scores, truth, valid, self._capacity(), weights=w)
      return {"buffer": buffer, "invalid": invalid}
    t, columns = self._bin_count(), scores.shape[-1]
    bins = self._bins(jnp.where(valid, scores, 0.5))
    column = jnp.broadcast_to(jnp.arange(columns), truth.shape)
    index = column * (2 * t) + truth.astype(jnp.int32) * t + bins
    index = jnp.where(valid, index, 2 * t * columns)
    sums = weighted_curves.histograms(index, jnp.where(valid, w, 0.0), 2 * t * columns)
    sums = sums.reshape(columns, 2, t)
    return {
      "positives": ExactSum.of(sums[:, 1]),
      "negatives": ExactSum.of(sums[:, 0]),
      "invalid": invalid,
    }

  def _bins(self, scores) -> jax.Array:
    """int32 bin of each score (monotone non-decreasing in the score)."""
    logits = self.from_logits and self.task != "multiclass"
    t = self._bin_count()
    if self.thresholds is not None:  # torchmetrics: sigmoid of logits, then preds >= t
      prob = jax.nn.sigmoid(scores) if logits else scores
      return segments.threshold_bins(prob, self.thresholds)
    if self.binning == "linear":
      prob = jax.nn.sigmoid(scores) if logits else jnp.clip(scores, 0.0, 1.0)
      return jnp.round(prob * (t - 1)).astype(jnp.int32)
    if logits:
      z = scores
    else:
      prob = jnp.clip(scores, 0.0, 1.0)
      z = jnp.log(prob) - jnp.log1p(-prob)  # -inf at 0, +inf at 1: the end bins
    z = jnp.clip(z, -LOGIT_RANGE, LOGIT_RANGE)
    end = LOGIT_RANGE
    if self.binning == "symlog":
      z, end = jnp.sign(z) * jnp.log1p(jnp.abs(z)), SYMLOG_RANGE
    return jnp.round((z + end) * ((t - 1) / (2 * end))).astype(jnp.int32)

  def _counted_bins(self, *, last: bool) -> jax.Array | None:
    """bool ``[T]``: the bins whose elements move the curve (None: all). With explicit
    thresholds torchmetrics' curve has points at the thresholds only: bin 0 (below the first
    threshold) adds nothing, nor (``last=False``, the ROC's trapezoid) the last bin."""
    if self.thresholds is None:
      return None
    index = jnp.arange(self._bin_count())
    return (index > 0) & ((index < self._bin_count() - 1) | last)

  def _check_bound_defined(self):
    if self.thresholds is not None:
      raise ValueError(
        f"{type(self).__name__}(thresholds=...) computes torchmetrics' binned value at those "
        "thresholds, which no bound ties to the exact area; use num_thresholds= or exact=True "
        "for a bounded value"
      )

  def _exact_area(self, buffer: ScoreBuffer) -> jax.Array:
    """float32 ``[L]`` per-column value from the kept scores (AUROC, AUPRC, operating points)."""
    raise ValueError(f"{type(self).__name__} takes no exact=True: use num_thresholds=")

  @abc.abstractmethod
  def _area(self, positives: ExactCount, negatives: ExactCount) -> jax.Array:
    """float32 ``[L]`` per-column value, NaN where undefined."""

  def _averaged(self, per_column) -> jax.Array:
    """``per_column(positives, negatives) -> [L]`` (exact: ``_exact_area(buffer)``) averaged
    by ``average``."""
    positives, negatives = self.positives, self.negatives
    included = self.included_classes()
    if self.exact:
      column_values = lambda: self._exact_area(self.buffer)
      micro_value = lambda: self._exact_area(self.buffer.pooled(included))[0]
      positive_counts, negative_counts = self.buffer.label_counts()
    else:
      kept = np.flatnonzero(included)

      def summed(count):  # exact total over the kept columns, as one column
        return jax.tree.map(lambda limb: limb[None], count[kept].aggregate())

      column_values = lambda: per_column(positives, negatives)
      micro_value = lambda: per_column(summed(positives), summed(negatives))[0]
      positive_counts = column_totals(positives)[:, 0]
      negative_counts = column_totals(negatives)[:, 0]
    if self.task == "binary":
      return column_values()[0]
    if self.average == "micro":
      return micro_value()
    values = column_values()
    usable = jnp.asarray(included) & ~jnp.isnan(values)
    if self.average == "ogb":  # tasks with a positive and a negative label
      usable &= (positive_counts > 0) & (negative_counts > 0)
    if self.average is None:
      return jnp.where(included, values, jnp.nan)
    weighted = self.average == "weighted"
    weight = positive_counts if weighted else jnp.ones_like(values)
    weight = jnp.where(usable, weight, 0.0)
    total = jnp.sum(weight)
    mean = jnp.sum(weight * jnp.where(usable, values, 0.0)) / jnp.where(total > 0, total, 1.0)
    return jnp.where(total > 0, mean, jnp.nan)

  def compute(self) -> jax.Array:
    """Scalar float32 (``[C]`` with ``average=None``); NaN where undefined."""
    if self.average == "samples":  # the mean of the row values; NaN without a row
      count = self.samples.total()[0]
      return jnp.where(count > 0, self.sample_scores.total()[0] / jnp.maximum(count, 1.0), jnp.nan)
    return self._averaged(self._area)

  def _exact_error_bound(self) -> jax.Array:
    value = self.compute()  # exact: 0 where the value is defined
    return jnp.where(jnp.isnan(value), jnp.nan, jnp.zeros_like(value))

  def invalid_report(self) -> list[tuple[str, str, int]]:
    """As for every metric; probabilities outside ``[0, 1]`` are named as the logits they
    usually are, and (``exact=True``) elements beyond ``capacity`` are reported too."""
    hint = f"{PROBABILITY_OUT_OF_RANGE} (logits? pass from_logits=True)"
    report = [
      (name, hint if kind == PROBABILITY_OUT_OF_RANGE else kind, n)
      for name, kind, n in super().invalid_report()
    ]
    dropped = int(np.sum(np.asarray(jax.device_get(self.buffer.dropped), np.int64)))
    if dropped:
      kind = f"element beyond capacity={self.capacity} (value NaN; pass a larger capacity)"
      report.append((self.name, kind, dropped))
    return report

  # --- curves, on the host ---

  def bin_edges(self) -> np.ndarray:
    """float64 ``[num_thresholds]``: the lowest score of each bin, in ``preds``' units.

    ``score >= bin_edges()[k]`` holds exactly for the scores binned at ``k`` or above
    (up to float32 rounding at the edge); the first edge is the lowest score (0, or
    ``-inf`` for logits).
    """
    t = self._bin_count()
    middle = np.arange(t, dtype=np.float64) - 0.5  # bin k starts half a step below k
    logits = self.from_logits and self.task != "multiclass"
    with np.errstate(divide="ignore", over="ignore"):
      if self.thresholds is not None:  # bin 0: below the first threshold
        prob = np.concatenate([[0.0], np.asarray(self.thresholds, np.float32)]).astype(np.float64)
        return np.log(prob) - np.log1p(-prob) if logits else prob
      if self.binning == "linear":
        prob = np.clip(middle / (t - 1), 0.0, 1.0)
        return np.log(prob) - np.log1p(-prob) if logits else prob
      end = SYMLOG_RANGE if self.binning == "symlog" else LOGIT_RANGE
      z = middle * (2 * end / (t - 1)) - end
      if self.binning == "symlog":
        z = np.sign(z) * np.expm1(np.abs(z))
      z[0] = -np.inf  # logits below the range share bin 0
      return z if logits else 1.0 / (1.0 + np.exp(-z))

  def _column_counts(self, class_index):
    """Exact int64 ``(positives [T], negatives [T])`` of the column ``class_index`` names."""
    positives, negatives = self.positives.to_numpy(), self.negatives.to_numpy()
    columns = num_columns(self.task, self.num_classes)
    if positives.shape != (columns, 0 if self.exact else self.num_thresholds):
      raise ValueError(
        f"the state has shape {positives.shape}; expected {(columns, self.num_thresholds)} "
        "(aggregate() a stacked or per-device state first)"
      )
    return self._select_column(positives, negatives, class_index)

  def _select_column(self, positives, negatives, class_index):
    """``(positives[c], negatives[c])`` for the column ``class_index`` names (summed for
    ``"micro"``); ValueError for an index that names no counted class."""
    columns = num_columns(self.task, self.num_classes)
    if self.task == "binary":
      if class_index not in (None, 0):
        raise ValueError(f"class_index must be None for task='binary'; got {class_index!r}")
      return positives[0], negatives[0]
    included = self.included_classes()
    if class_index == "micro":
      return positives[included].sum(0), negatives[included].sum(0)
    if (
      not validation.is_int(class_index)
      or not 0 <= class_index < columns
      or not included[class_index]
    ):
      kept = [c for c in range(columns) if included[c]]
      raise ValueError(
        f"class_index must be a class id of {kept} or 'micro' for task={self.task!r}; "
        f"got {class_index!r}"
      )
    return positives[class_index], negatives[class_index]

  def _points(self, class_index):
    """Cumulative exact ``(tp, fp, thresholds)`` from the highest non-empty bin down (exact:
    from the highest distinct score down, scikit-learn's ``_binary_clf_curve``)."""
    if self.exact:
      return self._exact_points(class_index)
    positives, negatives = self._column_counts(class_index)
    filled = (positives + negatives) > 0
    tp = np.cumsum(positives[filled][::-1])
    fp = np.cumsum(negatives[filled][::-1])
    return tp, fp, self.bin_edges()[filled][::-1]

  def _exact_points(self, class_index):
    buffer = jax.device_get(self.buffer)
    labels = np.asarray(buffer.labels, np.int64)
    used = np.arange(labels.shape[-1]) < np.asarray(buffer.size)[:, None]
    eye = np.eye(len(used), dtype=np.int64)  # column c's row selects c (micro: the included)
    chosen = self._select_column(eye, eye, class_index)[0] > 0
    keep = used & chosen[:, None]
    scores, truth = np.asarray(buffer.scores)[keep], labels[keep]
    weights = getattr(buffer, "weights", None)  # weighted: float64 sums of weights
    weights = np.ones(len(truth), np.int64) if weights is None else np.asarray(weights)[keep]
    order = np.argsort(-scores.astype(np.float64), kind="stable")
    scores, truth, weights = scores[order].astype(np.float64), truth[order], weights[order]
    last = np.r_[np.diff(scores) != 0, True] if len(scores) else np.zeros(0, bool)
    if weights.dtype != np.int64:
      weights = weights.astype(np.float64)
    tp, fp = np.cumsum(truth * weights), np.cumsum((1 - truth) * weights)
    return tp[last], fp[last], scores[last]

  def _per_class(self, one_curve, class_index):
    if self.average == "samples":
      raise ValueError(
        f"{type(self).__name__}(average='samples') keeps per-row areas, not a curve; use "
        "another average (the per-label curves) for curve()"
      )
    if self._pairs():
      raise ValueError("AUROC(multi_class='ovo') keeps class pairs, not per-class curves")
    if self.task != "binary" and class_index is None:
      included = self.included_classes()
      return {c: one_curve(c) for c in range(len(included)) if included[c]}
    return one_curve(class_index)
