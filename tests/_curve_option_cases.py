"""Rows of the metric table for the curve options and curve-family metrics of issue 31, and
their float64 references: scikit-learn where it has the value (``roc_auc_score(max_fpr=)``,
``precision_recall_curve``, ``roc_curve``), else numpy from torchmetrics' documented formulas
(binned curves at explicit thresholds: ``preds >= t`` per threshold, no other point; the
operating points' "best qualifying point, else 0"; EER's ``argmin |fpr - fnr|``).

``BRIER_CASES`` join the main table (imported at the end of ``tests/metric_cases.py``: every
generic check and every test over that table, weights included). ``CURVE_OPTION_CASES`` are
counting metrics, which refuse ``weights=`` (as the classification and curve tables of
``classification/test_classification.py`` / ``curves/test_auc.py``): ``tests/metrics/curves/test_curve_options.py``
runs every generic check on them (garbage padding, merges, jit, scan, pmap and shard_map on
8 devices) and uses the references directly.
"""

from __future__ import annotations

import warnings

import numpy as np
import sklearn.metrics as skm
from metric_cases import MetricCase, padded_batches, real

import padded_eval as pe

M = pe.metrics
C = 3
THRESHOLDS = (0.05, 0.2, 0.35, 0.5, 0.62, 0.8, 0.95)


def points(y, s, thresholds=None, roc=False):
  """``(tp, fp)`` int64 counts of ``s >= v`` from the highest ``v`` down: the distinct scores
  (with the empty point first when ``roc``: torchmetrics' unbinned ROC) or ``thresholds``
  (float32 comparisons, torchmetrics' binned curves)."""
  if thresholds is None:
    v = np.unique(s)[::-1]
  else:
    v = np.asarray(thresholds, np.float32)[::-1]
    s = s.astype(np.float32)
  ge = s[:, None] >= v[None, :]
  tp = np.sum(ge & (y == 1)[:, None], 0).astype(np.int64)
  fp = np.sum(ge & (y == 0)[:, None], 0).astype(np.int64)
  if roc and thresholds is None:
    tp, fp = np.r_[0, tp], np.r_[0, fp]
  return tp, fp


def binned_auroc(y, s, thresholds, max_fpr=None):
  """torchmetrics' binned AUROC: the trapezoid over the thresholds' ROC points only, with
  scikit-learn's interpolation at ``max_fpr`` and McClish's correction."""
  tp, fp = points(y, s, thresholds)
  tpr, fpr = tp / np.sum(y == 1), fp / np.sum(y == 0)
  if max_fpr is not None and max_fpr < 1:
    stop = np.searchsorted(fpr, max_fpr, "right")
    if stop == 0:  # the curve starts right of max_fpr: nothing below it (torchmetrics: index -1)
      tpr, fpr = np.zeros(1), np.zeros(1)
    elif stop < len(fpr):
      y_cut = np.interp(max_fpr, fpr[stop - 1 : stop + 1], tpr[stop - 1 : stop + 1])
      tpr, fpr = np.r_[tpr[:stop], y_cut], np.r_[fpr[:stop], max_fpr]
    low = 0.5 * max_fpr**2
    return 0.5 * (1 + (np.trapezoid(tpr, fpr) - low) / (max_fpr - low))
  return np.trapezoid(tpr, fpr)


def binned_ap(y, s, thresholds):
  """torchmetrics' binned average precision: ``-sum(diff(recall) * precision[:-1])`` over the
  thresholds' points plus (precision 1, recall 0)."""
  tp, fp = points(y, s, thresholds)
  precision = np.where(tp + fp > 0, tp / np.maximum(tp + fp, 1), 1.0)[::-1]
  recall = (tp / np.sum(y == 1))[::-1]
  precision, recall = np.r_[precision, 1.0], np.r_[recall, 0.0]
  return -np.sum(np.diff(recall) * precision[:-1])


def operating_point(kind, rate, y, s, thresholds=None):
  """torchmetrics' ``*At*`` value (0 without a qualifying point) and EER, per formula."""
  p, n = np.sum(y == 1), np.sum(y == 0)
  if p == 0 or (kind not in ("recall_at_precision", "precision_at_recall") and n == 0):
    return np.nan
  tp, fp = points(y, s, thresholds, roc=kind in ("sensitivity", "specificity", "eer"))
  if kind in ("recall_at_precision", "precision_at_recall"):
    if thresholds is None:  # scikit-learn's curve: the same points, highest threshold last
      precision, recall, _ = skm.precision_recall_curve(y, s)
      precision, recall = precision[:-1], recall[:-1]
    else:
      keep = tp + fp > 0
      precision, recall = tp[keep] / (tp + fp)[keep], tp[keep] / p
    if kind == "recall_at_precision":
      chosen = recall[precision >= rate]
    else:
      chosen = precision[recall >= rate]
    return np.max(chosen) if chosen.size else 0.0
  tpr, fpr = tp / p, fp / n
  if kind == "sensitivity":
    chosen = tpr[1 - fpr >= rate]
  elif kind == "specificity":
    chosen = (1 - fpr)[tpr >= rate]
  else:  # eer: the first point from the highest threshold with the smallest |fpr - fnr|
    gap = np.abs(fp * p - (p - tp) * n)  # exact: |fpr - fnr| * p * n
    i = int(np.argmin(gap))
    return 0.5 * (fpr[i] + 1 - tpr[i])
  return np.max(chosen) if chosen.size else 0.0


def per_column(task, value, average="macro"):
  """``value(y, s) -> float`` of each class column (one-vs-rest), averaged like our metrics."""

  def reference(bs):
    s, t = real(bs, "preds"), real(bs, "target")
    if task == "binary":
      return value(t, s)
    if task == "multiclass":
      columns = [((t == c).astype(int), s[:, c]) for c in range(C)]
    else:
      columns = [(t[:, c], s[:, c]) for c in range(C)]
    values = np.array([value(y, x) for y, x in columns])
    if average is None:
      return values
    return np.nanmean(values)

  return reference


def _scores(task):
  def fields(rng, b):
    if task == "multiclass":
      logits = rng.standard_normal((b, C)) * 2
      preds = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
      target = rng.integers(0, C, b)
    else:
      shape = (b,) if task == "binary" else (b, C)
      target = (rng.random(shape) < 0.4).astype(np.int32)
      preds = np.clip(rng.normal(0.4 + 0.25 * target, 0.25), 0, 1)
    if task != "multiclass":  # ties: scores on a grid of 1/50
      preds = np.round(preds * 50) / 50
    return {"preds": preds.astype(np.float32), "target": target.astype(np.int32)}

  return lambda rng: padded_batches(rng, fields, batch_size=16, num_batches=4)


def _case(name, make, task, value, average="macro", atol=2e-6):
  return MetricCase(name, make, _scores(task), per_column(task, value, average), 1e-5, atol)


def _config(task, average="macro"):
  return {"task": task, "num_classes": None if task == "binary" else C, "average": average}


CURVE_OPTION_CASES = [
  _case(
    "auroc_thresholds_binary",
    lambda: M.AUROC(thresholds=list(THRESHOLDS)),
    "binary",
    lambda y, s: binned_auroc(y, s, THRESHOLDS),
  ),
  _case(
    "auprc_thresholds_multilabel_none",
    lambda: M.AUPRC(thresholds=THRESHOLDS, **_config("multilabel", None)),
    "multilabel",
    lambda y, s: binned_ap(y, s, THRESHOLDS),
    average=None,
  ),
  _case(
    "auroc_max_fpr_exact_binary",
    lambda: M.AUROC(max_fpr=0.3, exact=True, capacity=64),
    "binary",
    lambda y, s: skm.roc_auc_score(y, s, max_fpr=0.3),
  ),
  _case(
    "auroc_max_fpr_linear_multilabel",
    lambda: M.AUROC(51, binning="linear", max_fpr=0.4, **_config("multilabel")),
    "multilabel",
    lambda y, s: skm.roc_auc_score(y, s, max_fpr=0.4),
  ),
  _case(
    "recall_at_precision_exact_binary",
    lambda: M.RecallAtFixedPrecision(min_precision=0.61, exact=True, capacity=64),
    "binary",
    lambda y, s: operating_point("recall_at_precision", 0.61, y, s),
  ),
  _case(
    "precision_at_recall_thresholds_multiclass",
    lambda: M.PrecisionAtFixedRecall(min_recall=0.5, thresholds=11, **_config("multiclass")),
    "multiclass",
    lambda y, s: operating_point("precision_at_recall", 0.5, y, s, np.linspace(0, 1, 11)),
  ),
  _case(
    "sensitivity_at_specificity_exact_multilabel",
    lambda: M.SensitivityAtSpecificity(
      min_specificity=0.7, exact=True, capacity=64, **_config("multilabel", None)
    ),
    "multilabel",
    lambda y, s: operating_point("sensitivity", 0.7, y, s),
    average=None,
  ),
  _case(
    "specificity_at_sensitivity_linear_binary",
    lambda: M.SpecificityAtSensitivity(min_sensitivity=0.8, num_thresholds=51, binning="linear"),
    "binary",
    lambda y, s: operating_point("specificity", 0.8, y, s),
  ),
  _case(
    "eer_exact_multiclass",
    lambda: M.EER(exact=True, capacity=64, **_config("multiclass")),
    "multiclass",
    lambda y, s: operating_point("eer", None, y, s),
  ),
  _case(
    "eer_thresholds_binary",
    lambda: M.EER(thresholds=THRESHOLDS),
    "binary",
    lambda y, s: operating_point("eer", None, y, s, THRESHOLDS),
  ),
]


def _brier_fields(task, logits):
  def fields(rng, b):
    weights = rng.uniform(0.1, 2.0, b).astype(np.float32)
    if task == "multiclass":
      preds = rng.standard_normal((b, C)) * 2
      if not logits:
        preds = np.exp(preds) / np.exp(preds).sum(-1, keepdims=True)
      target = rng.integers(0, C, b)
    else:
      preds = rng.standard_normal(b) * 2 if logits else rng.random(b)
      target = np.where(rng.random(b) < 0.15, -1, (rng.random(b) < 0.4).astype(int))
    return {
      "preds": preds.astype(np.float32),
      "target": target.astype(np.int32),
      "weights": weights,
    }

  return lambda rng: padded_batches(rng, fields, batch_size=16, num_batches=4)


def _brier_reference(task, logits):
  def reference(bs):
    preds, target, weights = real(bs, "preds"), real(bs, "target"), real(bs, "weights")
    if task == "multiclass":
      if logits:
        preds = np.exp(preds - preds.max(-1, keepdims=True))
        preds /= preds.sum(-1, keepdims=True)
      with warnings.catch_warnings():  # float32 rows sum to 1 within 1e-7 only
        warnings.simplefilter("ignore", UserWarning)
        return skm.brier_score_loss(target, preds, sample_weight=weights, labels=range(C))
    keep = target != -1
    preds = 1 / (1 + np.exp(-preds)) if logits else preds
    return skm.brier_score_loss(target[keep], preds[keep], sample_weight=weights[keep])

  return reference


BRIER_CASES = [
  MetricCase(
    "brier_multiclass_weighted",
    lambda: M.BrierScore(num_classes=C),
    _brier_fields("multiclass", False),
    _brier_reference("multiclass", False),
  ),
  MetricCase(
    "brier_multiclass_logits_weighted",
    lambda: M.BrierScore(num_classes=C, from_logits=True),
    _brier_fields("multiclass", True),
    _brier_reference("multiclass", True),
  ),
  MetricCase(
    "brier_binary_logits_ignore_weighted",
    lambda: M.BrierScore(task="binary", from_logits=True, ignore_index=-1),
    _brier_fields("binary", True),
    _brier_reference("binary", True),
  ),
]
