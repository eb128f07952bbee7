"""The table of metric cases that ``tests/metric_checks.py`` runs every generic check on.

Each :class:`MetricCase` is one row: a metric factory, a generator of padded batches
(keyword dicts with a ``"mask"``; every element the mask leaves out is NaN, inf or
garbage) and an independent float64 reference (numpy / scikit-learn / scipy) that
sees only the real elements.

How to add a case (a new metric is one row, not a new test file):

1. Write a reference ``reference(batches) -> np.ndarray`` in float64 that reads the
   real elements with :func:`real` (``real(batches, "preds")`` concatenates
   ``batch["preds"][batch["mask"]]`` over the batches; a ``[B, T]`` mask selects tokens).
2. Append ``MetricCase(name, make=lambda: MyMetric(...), data=..., reference=...)`` to
   ``CASES`` (here, or ``CASES.append(...)`` from your own module imported below).
   ``data(rng) -> list[dict]`` builds the padded batches; :func:`padded_batches` does it
   from per-field generators ``{key: lambda rng, shape: array}`` and poisons the
   padded elements for you. Keep the batch size a multiple of 8 (the tests' device
   count) and the sizes small: every case is jitted, scanned, pmapped and shard_mapped.
3. ``pytest tests/metrics/test_base.py -k my_case`` runs every check on it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import family_references as fam
import numpy as np
import scipy.special
import scipy.stats
import sklearn.metrics

import padded_eval as pe

BATCH_SIZE = 16
NUM_BATCHES = 3
_FLOAT_GARBAGE = np.array([np.nan, np.inf, -np.inf, 3e38, -1e30, 7.0], np.float64)


@dataclasses.dataclass(frozen=True)
class MetricCase:
  """One row of the table.

  Attributes:
    name: the test id.
    make: builds the empty metric.
    data: ``data(rng) -> list of batch keyword dicts`` of equal shapes, each with a bool
      ``"mask"`` of shape ``[B]`` or ``[B, T]``; padded elements hold garbage.
    reference: float64 value over the real elements of the batches.
    rtol, atol: tolerance against the reference.
    same_update_as: the name of a row whose metric differs from this one in ``compute`` options
      only (R2Score's ``adjusted=``, ``multioutput=``, ``force_finite=``), on the same data: its
      states are bit for bit that row's (``tests/metrics/test_base.py`` checks it), so the
      checks of the update path under jit, scan, pmap and shard_map run on that row alone.
  """

  name: str
  make: Callable[[], pe.Metric]
  data: Callable[[np.random.Generator], list[dict]]
  reference: Callable[[list[dict]], np.ndarray]
  rtol: float = 2e-5
  atol: float = 2e-6
  same_update_as: str = ""

  def batches(self, seed: int = 0) -> list[dict]:
    return self.data(np.random.default_rng(seed))


def poison(batch: dict, rng: np.random.Generator) -> dict:
  """A copy of ``batch`` whose masked-out elements hold fresh NaN/inf/garbage."""
  mask = batch["mask"]
  out = {"mask": mask}
  for key, value in batch.items():
    if key == "mask":
      continue
    value = np.array(value, copy=True)
    padded = np.broadcast_to(
      ~mask.reshape(mask.shape + (1,) * (value.ndim - mask.ndim)), value.shape
    )
    if np.issubdtype(value.dtype, np.floating):
      garbage = rng.choice(_FLOAT_GARBAGE, size=value.shape)
    elif np.issubdtype(value.dtype, np.integer):
      garbage = rng.integers(-(2**30), 2**30, size=value.shape)
    else:
      garbage = rng.random(value.shape) < 0.5
    with np.errstate(over="ignore"):  # 3e38 becomes inf in float16: garbage either way
      out[key] = np.where(padded, garbage, value).astype(value.dtype)
  return out


def padded_batches(
  rng,
  fields,
  *,
  token_axis: int | None = None,
  num_batches: int = NUM_BATCHES,
  batch_size: int = BATCH_SIZE,
) -> list[dict]:
  """Batches from ``fields = {key: lambda rng, batch_size: array [batch_size, ...]}``.

  ``fields`` may also be one callable ``(rng, batch_size) -> {key: array}`` (for
  fields drawn together, e.g. correlated pairs).

  The mask is ``[B]`` (about 70% real rows; the last batch has 3 real rows), or
  ``[B, T]`` with ``T = token_axis`` (a random real length per row, some rows empty).
  """
  batches = []
  for step in range(num_batches):
    if token_axis is None:
      mask = rng.random(batch_size) < 0.7
      if step == num_batches - 1:
        mask = np.arange(batch_size) < 3
    else:
      lengths = rng.integers(0, token_axis + 1, size=batch_size)
      mask = np.arange(token_axis)[None, :] < lengths[:, None]
    if callable(fields):
      batch = {key: np.asarray(value) for key, value in fields(rng, batch_size).items()}
    else:
      batch = {key: np.asarray(make(rng, batch_size)) for key, make in fields.items()}
    batches.append(poison({**batch, "mask": mask}, rng))
  return batches


def real(batches: list[dict], key: str) -> np.ndarray:
  """``batch[key][batch["mask"]]`` over all batches, as float64 (ints stay ints)."""
  parts = [np.asarray(b[key])[np.asarray(b["mask"])] for b in batches]
  values = np.concatenate(parts)
  return values.astype(np.float64) if np.issubdtype(values.dtype, np.floating) else values


def _normal(*tail, loc=0.0, scale=1.0, dtype=np.float32):
  return lambda rng, b: (loc + scale * rng.standard_normal((b,) + tail)).astype(dtype)


def _ints(high, *tail):
  return lambda rng, b: rng.integers(0, high, size=(b,) + tail).astype(np.int32)


def _positive(*tail):
  return lambda rng, b: rng.uniform(0.1, 2.0, size=(b,) + tail).astype(np.float32)


# --- references (float64, real elements only) -------------------------------------------


def _weighted_mean(values, weights=None):
  if weights is None:
    return np.mean(values)
  weights = np.broadcast_to(
    weights.reshape(weights.shape + (1,) * (values.ndim - weights.ndim)), values.shape
  )
  return np.sum(weights * values) / np.sum(weights)


def _weighted_std(values, weights, ddof):
  mean = np.sum(weights * values) / np.sum(weights)
  return np.sqrt(np.sum(weights * (values - mean) ** 2) / (np.sum(weights) - ddof))


def _weighted_pearson(x, y, w):
  mx, my = np.sum(w * x) / np.sum(w), np.sum(w * y) / np.sum(w)
  cxy = np.sum(w * (x - mx) * (y - my))
  return cxy / np.sqrt(np.sum(w * (x - mx) ** 2) * np.sum(w * (y - my) ** 2))


def _perplexity(batches, ignore_index=None):
  logits = real(batches, "preds").astype(np.float64)
  logits = logits.reshape(-1, logits.shape[-1])
  target = real(batches, "target").reshape(-1)
  keep = np.ones(target.shape, bool) if ignore_index is None else target != ignore_index
  logits, target = logits[keep], target[keep].astype(np.int64)
  log_probs = logits - scipy.special.logsumexp(logits, axis=-1, keepdims=True)
  return np.exp(-np.mean(np.take_along_axis(log_probs, target[:, None], -1)))


def _top_k_accuracy(batches, k):
  scores, target = real(batches, "preds"), real(batches, "target")
  order = np.argsort(-scores, axis=-1, kind="stable")[:, :k]
  hits = np.any(order == target[:, None], axis=-1).astype(np.float64)
  return np.sum(real(batches, "weights") * hits) / np.sum(real(batches, "weights"))


def _ignored_tokens(rng, b):
  target = rng.integers(0, 11, size=(b, 6)).astype(np.int32)
  return np.where(rng.random((b, 6)) < 0.2, -100, target).astype(np.int32)


_REGRESSION = {"preds": _normal(), "target": _normal(loc=0.5)}
_REGRESSION_3 = {"preds": _normal(3), "target": _normal(3, loc=0.5, scale=2.0)}


def _correlated_pair(rng, batch_size, weighted=False):
  x = rng.standard_normal(batch_size)
  fields = {
    "preds": (3.0 + x).astype(np.float32),
    "target": (-1.0 + 0.6 * x + 0.8 * rng.standard_normal(batch_size)).astype(np.float32),
  }
  if weighted:
    fields["weights"] = _positive()(rng, batch_size)
  return fields


CASES: list[MetricCase] = [
  MetricCase(
    "mean",
    lambda: pe.metrics.Mean(),
    lambda rng: padded_batches(rng, {"values": _normal(loc=3.0)}),
    lambda bs: np.mean(real(bs, "values")),
  ),
  MetricCase(
    "mean_weighted_tokens",
    lambda: pe.metrics.Mean("loss"),
    lambda rng: padded_batches(rng, {"loss": _normal(5), "weights": _positive(5)}, token_axis=5),
    lambda bs: _weighted_mean(real(bs, "loss"), real(bs, "weights")),
  ),
  MetricCase(
    "mean_float16",
    lambda: pe.metrics.Mean(),
    lambda rng: padded_batches(rng, {"values": _normal(3, loc=3.0, dtype=np.float16)}),
    lambda bs: np.mean(real(bs, "values")),
  ),
  MetricCase(
    "accuracy",
    lambda: pe.metrics.Accuracy(),
    lambda rng: padded_batches(rng, {"preds": _normal(5), "target": _ints(5)}),
    lambda bs: sklearn.metrics.accuracy_score(real(bs, "target"), np.argmax(real(bs, "preds"), -1)),
  ),
  MetricCase(
    "accuracy_top3_weighted",
    lambda: pe.metrics.Accuracy(top_k=3),
    lambda rng: padded_batches(
      rng, {"preds": _normal(7), "target": _ints(7), "weights": _positive()}
    ),
    lambda bs: _top_k_accuracy(bs, 3),
  ),
  MetricCase(
    "mse",
    lambda: pe.metrics.MSE(),
    lambda rng: padded_batches(rng, _REGRESSION_3),
    lambda bs: sklearn.metrics.mean_squared_error(real(bs, "target"), real(bs, "preds")),
  ),
  MetricCase(
    "mae",
    lambda: pe.metrics.MAE(),
    lambda rng: padded_batches(rng, _REGRESSION),
    lambda bs: sklearn.metrics.mean_absolute_error(real(bs, "target"), real(bs, "preds")),
  ),
  MetricCase(
    "rmse",
    lambda: pe.metrics.RMSE(),
    lambda rng: padded_batches(rng, _REGRESSION),
    lambda bs: np.sqrt(sklearn.metrics.mean_squared_error(real(bs, "target"), real(bs, "preds"))),
  ),
  MetricCase(
    "std",
    lambda: pe.metrics.Std(),
    lambda rng: padded_batches(rng, {"values": _normal(loc=-2.0, scale=3.0)}),
    lambda bs: np.std(real(bs, "values")),
  ),
  MetricCase(
    "std_mean_1e4",
    lambda: pe.metrics.Std(),
    lambda rng: padded_batches(rng, {"values": _normal(4, loc=1e4)}),
    lambda bs: np.std(real(bs, "values")),
    rtol=1e-4,
  ),
  MetricCase(
    "std_ddof1_weighted_tokens",
    lambda: pe.metrics.Std(ddof=1, argname="x"),
    lambda rng: padded_batches(
      rng, {"x": _normal(4, loc=7.0), "weights": _positive(4)}, token_axis=4
    ),
    lambda bs: _weighted_std(real(bs, "x"), real(bs, "weights"), 1),
  ),
  MetricCase(
    "r2",
    lambda: pe.metrics.R2Score(),
    lambda rng: padded_batches(rng, _REGRESSION),
    lambda bs: sklearn.metrics.r2_score(real(bs, "target"), real(bs, "preds")),
    atol=2e-5,
  ),
  MetricCase(
    "r2_multioutput_uniform",
    lambda: pe.metrics.R2Score(num_outputs=3),
    lambda rng: padded_batches(rng, _REGRESSION_3),
    lambda bs: sklearn.metrics.r2_score(real(bs, "target"), real(bs, "preds")),
    atol=2e-5,
  ),
  MetricCase(
    "r2_raw_weighted",
    lambda: pe.metrics.R2Score(num_outputs=3, multioutput="raw_values"),
    lambda rng: padded_batches(rng, {**_REGRESSION_3, "weights": _positive()}),
    lambda bs: sklearn.metrics.r2_score(
      real(bs, "target"),
      real(bs, "preds"),
      sample_weight=real(bs, "weights"),
      multioutput="raw_values",
    ),
    atol=2e-5,
  ),
  MetricCase(
    "r2_variance_weighted",
    lambda: pe.metrics.R2Score(num_outputs=3, multioutput="variance_weighted"),
    lambda rng: padded_batches(rng, _REGRESSION_3),
    lambda bs: sklearn.metrics.r2_score(
      real(bs, "target"), real(bs, "preds"), multioutput="variance_weighted"
    ),
    atol=2e-5,
    same_update_as="r2_multioutput_uniform",
  ),
  MetricCase(
    "pearson",
    lambda: pe.metrics.PearsonCorrelation(),
    lambda rng: padded_batches(rng, _correlated_pair),
    lambda bs: scipy.stats.pearsonr(real(bs, "preds"), real(bs, "target"))[0],
  ),
  MetricCase(
    "pearson_weighted",
    lambda: pe.metrics.PearsonCorrelation(),
    lambda rng: padded_batches(rng, lambda r, b: _correlated_pair(r, b, weighted=True)),
    lambda bs: _weighted_pearson(real(bs, "preds"), real(bs, "target"), real(bs, "weights")),
  ),
  MetricCase(
    "pearson_two_outputs",
    lambda: pe.metrics.PearsonCorrelation(num_outputs=2),
    lambda rng: padded_batches(rng, {"preds": _normal(2), "target": _normal(2)}),
    lambda bs: np.array(
      [scipy.stats.pearsonr(real(bs, "preds")[:, j], real(bs, "target")[:, j])[0] for j in range(2)]
    ),
    atol=2e-5,
  ),
  MetricCase(
    "perplexity_tokens",
    lambda: pe.metrics.Perplexity(),
    lambda rng: padded_batches(
      rng, {"preds": _normal(6, 11, scale=2.0), "target": _ints(11, 6)}, token_axis=6
    ),
    _perplexity,
  ),
  MetricCase(
    "perplexity_ignore_index_row_mask",
    lambda: pe.metrics.Perplexity(ignore_index=-100),
    lambda rng: padded_batches(
      rng, {"preds": _normal(6, 11, scale=2.0), "target": _ignored_tokens}
    ),
    lambda bs: _perplexity(bs, ignore_index=-100),
  ),
]

# --- ranking, images, regression extras, classification report (issue 29) ------------------
# batches and references: tests/family_references.py


def _poisoned(make):
  return lambda rng: [poison(b, rng) for b in make(rng)]


def _ranking(name, metric, reference_name, k=None, **batches):
  return MetricCase(
    name,
    metric,
    _poisoned(lambda rng: fam.ranking_batches(rng, **batches)),
    fam.ranking_reference(reference_name, k),
    rtol=1e-6,
    atol=1e-7,
  )


def _msle_inputs(rng, b):
  return {"preds": rng.uniform(-0.5, 3.0, (b, 3)), "target": rng.uniform(-0.5, 3.0, (b, 3))}


CASES += [
  _ranking("recall_at_3", lambda: pe.metrics.RecallAtK(3), "recall", 3),
  _ranking("recall_at_2_graded", lambda: pe.metrics.RecallAtK(2), "recall", 2, graded=True),
  _ranking("precision_at_3", lambda: pe.metrics.PrecisionAtK(3), "precision", 3),
  _ranking(
    "precision_all_weighted",
    lambda: pe.metrics.PrecisionAtK(),
    "precision",
    weighted=True,
    row_mask=True,
  ),
  _ranking("mrr", lambda: pe.metrics.MRR(), "mrr"),
  _ranking("mrr_row_mask", lambda: pe.metrics.MRR(), "mrr", row_mask=True),
  _ranking("map_at_4", lambda: pe.metrics.MAPAtK(4), "map", 4),
  _ranking("map_all_weighted", lambda: pe.metrics.MAPAtK(), "map", weighted=True, row_mask=True),
  _ranking("ndcg_at_3_ties", lambda: pe.metrics.NDCGAtK(3), "ndcg", 3, graded=True),
  _ranking("ndcg_all_ties", lambda: pe.metrics.NDCGAtK(), "ndcg", graded=True),
  _ranking("ndcg_at_5_binary", lambda: pe.metrics.NDCGAtK(5), "ndcg", 5),
  MetricCase(
    "psnr",
    lambda: pe.metrics.PSNR(1.0),
    _poisoned(lambda rng: fam.image_batches(rng, (5, 4, 3))),
    fam.psnr_reference(1.0),
    rtol=1e-6,
    atol=0.0,
  ),
  MetricCase(
    "psnr_weighted_range_255",
    lambda: pe.metrics.PSNR(255.0),
    _poisoned(lambda rng: fam.image_batches(rng, (4, 6), weighted=True)),
    fam.psnr_reference(255.0),
    rtol=1e-6,
    atol=0.0,
  ),
  MetricCase(
    "ssim",
    lambda: pe.metrics.SSIM(1.0),
    _poisoned(lambda rng: fam.image_batches(rng, (12, 13, 2))),
    fam.ssim_reference(1.0),
    rtol=1e-5,
    atol=0.0,
  ),
  MetricCase(
    "ssim_valid_skimage_one_channel",
    lambda: pe.metrics.SSIM(1.0, padding="valid"),
    _poisoned(lambda rng: fam.image_batches(rng, (14, 11))),
    fam.ssim_reference(1.0, fam.ssim_skimage),
    rtol=1e-5,
    atol=0.0,
  ),
  MetricCase(
    "dice_segmentation",
    lambda: pe.metrics.Dice(num_classes=4),
    lambda rng: padded_batches(rng, {"preds": _ints(4, 6, 5), "target": _ints(4, 6, 5)}),
    lambda bs: sklearn.metrics.f1_score(
      real(bs, "target").ravel(), real(bs, "preds").ravel(), average="macro"
    ),
    rtol=1e-6,
    atol=0.0,
  ),
  MetricCase(
    "mape",
    lambda: pe.metrics.MAPE(),
    lambda rng: padded_batches(rng, {"preds": _normal(3), "target": _normal(3, loc=0.5)}),
    lambda bs: sklearn.metrics.mean_absolute_percentage_error(
      real(bs, "target"), real(bs, "preds")
    ),
    rtol=1e-6,
    atol=0.0,
  ),
  MetricCase(
    "mape_weighted",
    lambda: pe.metrics.MAPE(),
    lambda rng: padded_batches(rng, {**_REGRESSION, "weights": _positive()}),
    lambda bs: sklearn.metrics.mean_absolute_percentage_error(
      real(bs, "target"), real(bs, "preds"), sample_weight=real(bs, "weights")
    ),
    rtol=1e-6,
    atol=0.0,
  ),
  MetricCase(
    "msle",
    lambda: pe.metrics.MSLE(),
    lambda rng: padded_batches(
      rng, lambda r, b: {k: v.astype(np.float32) for k, v in _msle_inputs(r, b).items()}
    ),
    lambda bs: sklearn.metrics.mean_squared_log_error(real(bs, "target"), real(bs, "preds")),
    rtol=1e-6,
    atol=0.0,
  ),
  MetricCase(
    "msle_weighted_tokens",
    lambda: pe.metrics.MSLE(),
    lambda rng: padded_batches(
      rng, {"preds": _positive(5), "target": _positive(5), "weights": _positive(5)}, token_axis=5
    ),
    lambda bs: sklearn.metrics.mean_squared_log_error(
      real(bs, "target"), real(bs, "preds"), sample_weight=real(bs, "weights")
    ),
    rtol=1e-6,
    atol=0.0,
  ),
  MetricCase(
    "explained_variance",
    lambda: pe.metrics.ExplainedVariance(),
    lambda rng: padded_batches(rng, _correlated_pair),
    lambda bs: sklearn.metrics.explained_variance_score(real(bs, "target"), real(bs, "preds")),
    rtol=1e-6,
    atol=1e-7,
  ),
  MetricCase(
    "explained_variance_raw_weighted",
    lambda: pe.metrics.ExplainedVariance(num_outputs=3, multioutput="raw_values"),
    lambda rng: padded_batches(rng, {**_REGRESSION_3, "weights": _positive()}),
    lambda bs: sklearn.metrics.explained_variance_score(
      real(bs, "target"),
      real(bs, "preds"),
      sample_weight=real(bs, "weights"),
      multioutput="raw_values",
    ),
    rtol=1e-6,
    atol=1e-7,
  ),
  MetricCase(
    "classification_report",
    lambda: pe.metrics.ClassificationReport(5),
    lambda rng: padded_batches(rng, {"preds": _normal(5), "target": _ints(4)}),
    lambda bs: fam.report_table(bs, 5),
    rtol=1e-6,
    atol=0.0,
  ),
]

# Families in their own modules: each appends its rows to CASES when imported (last: they use
# the above; a module imported first imports this one, and then appends once all the same).
import metric_cases_text  # noqa: E402, F401

# --- issue 31: the confusion family's new metrics (one row each; more in
# tests/metrics/classification/test_stat_scores.py) -------------------------------------------------------


def _multilabel_fields(rng, b, labels=4):
  return {
    "preds": rng.random((b, labels)).astype(np.float32),
    "target": (rng.random((b, labels)) < 0.4).astype(np.int32),
  }


def _stat_scores_reference(bs):
  """sklearn's per-label [[tn, fp], [fn, tp]] as torchmetrics' [tp, fp, tn, fn, support]."""
  mcm = sklearn.metrics.multilabel_confusion_matrix(
    real(bs, "target"), (real(bs, "preds") > 0.5).astype(np.int32)
  )
  tn, fp, fn, tp = mcm[:, 0, 0], mcm[:, 0, 1], mcm[:, 1, 0], mcm[:, 1, 1]
  return np.stack([tp, fp, tn, fn, tp + fn], -1).astype(np.float64)


CASES += [
  MetricCase(
    "stat_scores_multilabel",
    lambda: pe.metrics.StatScores(task="multilabel", num_classes=4),
    lambda rng: padded_batches(rng, _multilabel_fields),
    _stat_scores_reference,
  ),
  MetricCase(
    "balanced_accuracy_multiclass",
    lambda: pe.metrics.BalancedAccuracy(num_classes=5),
    lambda rng: padded_batches(rng, {"preds": _normal(5), "target": _ints(5)}),
    lambda bs: sklearn.metrics.balanced_accuracy_score(
      real(bs, "target"), np.argmax(real(bs, "preds"), -1)
    ),
  ),
  MetricCase(
    "hamming_loss_multilabel",
    lambda: pe.metrics.HammingLoss(task="multilabel", num_classes=4),
    lambda rng: padded_batches(rng, _multilabel_fields),
    lambda bs: sklearn.metrics.hamming_loss(real(bs, "target"), real(bs, "preds") > 0.5),
  ),
  MetricCase(
    "zero_one_loss_multilabel",
    lambda: pe.metrics.ZeroOneLoss(task="multilabel", num_classes=4),
    lambda rng: padded_batches(rng, _multilabel_fields),
    lambda bs: sklearn.metrics.zero_one_loss(real(bs, "target"), real(bs, "preds") > 0.5),
  ),
  MetricCase(
    "npv_binary",
    lambda: pe.metrics.NPV(task="binary"),
    lambda rng: padded_batches(
      rng, {"preds": lambda r, b: r.random(b).astype(np.float32), "target": _ints(2)}
    ),
    lambda bs: np.mean(real(bs, "target")[real(bs, "preds") <= 0.5] == 0),
  ),
]


def _samplewise_f1(bs):
  """sklearn's macro F1 of each real row's 6 elements, averaged over rows."""
  rows = zip(real(bs, "preds"), real(bs, "target"))
  return np.mean([sklearn.metrics.f1_score(t, np.argmax(p, -1), average="macro") for p, t in rows])


CASES += [
  MetricCase(
    "f1_samplewise_multiclass_macro",
    lambda: pe.metrics.F1Score(num_classes=4, multidim_average="samplewise"),
    lambda rng: padded_batches(rng, {"preds": _normal(6, 4), "target": _ints(4, 6)}),
    _samplewise_f1,
  ),
  MetricCase(
    "precision_multilabel_samples",
    lambda: pe.metrics.Precision(task="multilabel", num_classes=4, average="samples"),
    lambda rng: padded_batches(rng, _multilabel_fields),
    lambda bs: sklearn.metrics.precision_score(
      real(bs, "target"), real(bs, "preds") > 0.5, average="samples", zero_division=0
    ),
  ),
]
CASES.append(
  MetricCase(
    "f1_weighted_multiclass_sample_weights",
    lambda: pe.metrics.F1Score(num_classes=5, average="weighted", weighted=True),
    lambda rng: padded_batches(
      rng, {"preds": _normal(5), "target": _ints(5), "weights": _positive()}
    ),
    lambda bs: sklearn.metrics.f1_score(
      real(bs, "target"),
      np.argmax(real(bs, "preds"), -1),
      average="weighted",
      sample_weight=real(bs, "weights"),
    ),
  )
)

# --- BrierScore (issue 31): rows and references in their module (with the curve options')
from _curve_option_cases import BRIER_CASES  # noqa: E402

CASES += BRIER_CASES


# --- issue 31: R2Score adjusted= / force_finite= / multioutput weights ------------------------


def _constant_column(rng, b):
  target = (0.5 + 2.0 * rng.standard_normal((b, 3))).astype(np.float32)
  target[:, 1] = 2.0  # SS_tot == 0 on output 1
  return target


def _adjusted_r2(bs, k, **kwargs):
  """torchmetrics' adjusted R2 on scikit-learn's score; ``n`` the real rows."""
  r2 = sklearn.metrics.r2_score(real(bs, "target"), real(bs, "preds"), **kwargs)
  n = len(real(bs, "target"))
  return 1.0 - (1.0 - r2) * (n - 1) / (n - k - 1)


def _r2_not_finite(bs):
  with np.errstate(divide="ignore", invalid="ignore"):  # SS_res / 0: -inf, as asked
    return sklearn.metrics.r2_score(
      real(bs, "target"), real(bs, "preds"), multioutput="raw_values", force_finite=False
    )


_R2_WEIGHTS = (0.2, 0.0, 1.3)
CASES += [
  MetricCase(
    "r2_adjusted",
    lambda: pe.metrics.R2Score(adjusted=3),
    lambda rng: padded_batches(rng, _REGRESSION),
    lambda bs: _adjusted_r2(bs, 3),
    atol=2e-5,
    same_update_as="r2",
  ),
  MetricCase(
    "r2_adjusted_raw",
    lambda: pe.metrics.R2Score(num_outputs=3, multioutput="raw_values", adjusted=2),
    lambda rng: padded_batches(rng, _REGRESSION_3),
    lambda bs: _adjusted_r2(bs, 2, multioutput="raw_values"),
    atol=2e-5,
    same_update_as="r2_multioutput_uniform",
  ),
  MetricCase(
    "r2_multioutput_array_weighted",
    lambda: pe.metrics.R2Score(num_outputs=3, multioutput=_R2_WEIGHTS),
    lambda rng: padded_batches(rng, {**_REGRESSION_3, "weights": _positive()}),
    lambda bs: sklearn.metrics.r2_score(
      real(bs, "target"),
      real(bs, "preds"),
      sample_weight=real(bs, "weights"),
      multioutput=np.array(_R2_WEIGHTS),
    ),
    atol=2e-5,
    same_update_as="r2_raw_weighted",
  ),
  MetricCase(
    "r2_force_finite_false_raw",
    lambda: pe.metrics.R2Score(num_outputs=3, multioutput="raw_values", force_finite=False),
    lambda rng: padded_batches(rng, {"preds": _normal(3), "target": _constant_column}),
    lambda bs: _r2_not_finite(bs),
    atol=2e-5,
  ),
]


# --- issue 31: MSE / MAE / RMSE per output (scikit-learn multioutput=, sample_weight=) --------


def _sk_per_output(fn, multioutput):
  def reference(bs):
    weights = np.array(multioutput) if isinstance(multioutput, tuple) else multioutput
    return fn(
      real(bs, "target"),
      real(bs, "preds"),
      sample_weight=real(bs, "weights"),
      multioutput=weights,
    )

  return reference


CASES += [
  MetricCase(
    f"{name}_{label}_weighted",
    lambda cls=cls, mo=mo: cls(num_outputs=3, multioutput=mo),
    lambda rng: padded_batches(rng, {**_REGRESSION_3, "weights": _positive()}),
    _sk_per_output(fn, mo),
  )
  for name, cls, fn, label, mo in [
    ("mse", pe.metrics.MSE, sklearn.metrics.mean_squared_error, "raw", "raw_values"),
    ("mae", pe.metrics.MAE, sklearn.metrics.mean_absolute_error, "array", _R2_WEIGHTS),
    ("rmse", pe.metrics.RMSE, sklearn.metrics.root_mean_squared_error, "raw", "raw_values"),
  ]
]


# --- issue 31: Accuracy average= / multilabel / ignore_index (torchmetrics' MulticlassAccuracy and
# MultilabelAccuracy semantics; more rows in tests/metrics/classification/test_accuracy.py) -------------


def _macro_recall_seen(bs, ignore_index):
  target, pred = real(bs, "target"), np.argmax(real(bs, "preds"), -1)
  keep = target != ignore_index
  target, pred, w = target[keep], pred[keep], real(bs, "weights")[keep]
  seen = sorted((set(target.tolist()) | set(pred.tolist())) - {ignore_index})
  return sklearn.metrics.recall_score(
    target, pred, labels=seen, average="macro", sample_weight=w, zero_division=0
  )


CASES += [
  MetricCase(
    "accuracy_macro_ignore_index_weighted",
    lambda: pe.metrics.Accuracy(average="macro", num_classes=5, ignore_index=1),
    lambda rng: padded_batches(
      rng, {"preds": _normal(5), "target": _ints(5), "weights": _positive()}
    ),
    lambda bs: _macro_recall_seen(bs, 1),
  ),
  MetricCase(
    "accuracy_multilabel_per_label",
    lambda: pe.metrics.Accuracy(task="multilabel", average=None, num_classes=4),
    lambda rng: padded_batches(rng, _multilabel_fields),
    lambda bs: np.mean(real(bs, "target") == (real(bs, "preds") > 0.5), axis=0),
  ),
]


CASES.append(
  MetricCase(
    "hinge_crammer_singer_weighted",
    lambda: pe.metrics.HingeLoss(task="multiclass", num_classes=5),
    lambda rng: padded_batches(
      rng, {"preds": _normal(5), "target": _ints(5), "weights": _positive()}
    ),
    lambda bs: sklearn.metrics.hinge_loss(
      real(bs, "target"), real(bs, "preds"), labels=range(5), sample_weight=real(bs, "weights")
    ),
  )
)


def _log_auc(bs, lo=0.01, hi=0.5):
  """torchmetrics' _binary_logauc_compute (float64) on the exact ROC curve: end points
  interpolated and sorted in, the trapezoid over log10(fpr) between them, over the decades."""
  fpr, tpr, _ = sklearn.metrics.roc_curve(
    real(bs, "target"), real(bs, "preds"), drop_intermediate=False
  )
  tpr = np.sort(np.concatenate([tpr, np.interp([lo, hi], fpr, tpr)]))
  fpr = np.sort(np.concatenate([fpr, [lo, hi]]))
  first, last = np.where(fpr == lo)[0][-1], np.where(fpr == hi)[0][-1]
  x, y = np.log10(fpr[first : last + 1]), tpr[first : last + 1]
  return np.trapezoid(y, x) / np.log10(hi / lo)


CASES.append(
  MetricCase(
    "log_auc_exact",
    lambda: pe.metrics.LogAUC(fpr_range=(0.01, 0.5), exact=True, capacity=48),
    lambda rng: padded_batches(
      rng, {"preds": lambda r, b: r.random(b).astype(np.float32), "target": _ints(2)}
    ),
    _log_auc,
  )
)


def _row_auroc_mean(bs):
  target, scores = real(bs, "target"), real(bs, "preds")
  rows = (target.min(1) == 0) & (target.max(1) == 1)  # sklearn scores rows of two classes
  return sklearn.metrics.roc_auc_score(target[rows], scores[rows], average="samples")


CASES.append(
  MetricCase(
    "auroc_multilabel_samples",
    lambda: pe.metrics.AUROC(task="multilabel", num_classes=4, average="samples"),
    lambda rng: padded_batches(rng, _multilabel_fields),
    _row_auroc_mean,
  )
)


def _grid_probs(rng, b, classes=3):
  """Probability rows on the 0.01 grid that sum to 1 (binning="linear" bins them exactly)."""
  cuts = np.sort(rng.integers(0, 101, (b, classes - 1)), -1)
  edges = np.concatenate([np.zeros((b, 1), int), cuts, np.full((b, 1), 100)], -1)
  return {
    "preds": (np.diff(edges, axis=-1) / 100).astype(np.float32),
    "target": rng.integers(0, classes, b).astype(np.int32),
  }


CASES.append(
  MetricCase(
    "auroc_ovo_weighted_grid",
    lambda: pe.metrics.AUROC(
      101, task="multiclass", num_classes=3, average="weighted", multi_class="ovo", binning="linear"
    ),
    lambda rng: padded_batches(rng, _grid_probs),
    lambda bs: sklearn.metrics.roc_auc_score(
      real(bs, "target"), real(bs, "preds"), multi_class="ovo", average="weighted"
    ),
  )
)

# --- issue 31, regression half: rank correlations, similarities, deviances, EV options -------
from _regression_cases import REGRESSION_CASES  # noqa: E402

CASES += REGRESSION_CASES

# --- issue 31: AUROC / AUPRC sample weights (weighted=True; grid scores, a bin each) ---------


def _weighted_grid_fields(rng, b, labels=4):
  return {
    "preds": (rng.integers(0, 101, (b, labels)) / 100).astype(np.float32),
    "target": (rng.random((b, labels)) < 0.4).astype(np.int32),
    "weights": rng.uniform(0.0, 3.0, b).astype(np.float32),
  }


for _name, _cls, _reference in (
  ("auroc_multilabel_sample_weight", pe.metrics.AUROC, sklearn.metrics.roc_auc_score),
  ("auprc_multilabel_sample_weight", pe.metrics.AUPRC, sklearn.metrics.average_precision_score),
):
  CASES.append(
    MetricCase(
      _name,
      functools.partial(
        _cls, 101, task="multilabel", num_classes=4, binning="linear", weighted=True
      ),
      lambda rng: padded_batches(rng, _weighted_grid_fields),
      lambda bs, ref=_reference: ref(
        real(bs, "target"), real(bs, "preds"), sample_weight=real(bs, "weights")
      ),
    )
  )
