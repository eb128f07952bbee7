"""Property suite, curve options and curve-family metrics (issue 31): partial AUC
(``max_fpr``, exact mode) against scikit-learn, explicit ``thresholds=`` and the operating
points / EER against torchmetrics' formulas, BrierScore against scikit-learn's formula in numpy, each through a
random padded batching, merge tree and device count (``metric_checks.evaluate_randomly``).

Tolerances (``EPS = 2**-24``): the counts are exact; a value is one ratio of counts (the
operating points, EER: ``4 EPS``) or a float32 sum of ``K`` terms of two or three roundings
(areas: ``(K + 4) EPS`` relative, ``K`` the kept elements or thresholds); the Brier score is
a compensated weighted mean of float32 squares (``(C + 8) EPS`` relative).
"""

from __future__ import annotations

import warnings

import metric_cases  # noqa: F401  (the option cases extend its table)
import numpy as np
import sklearn.metrics as skm
from _curve_option_cases import THRESHOLDS, binned_ap, binned_auroc, operating_point
from hypothesis import given
from hypothesis import strategies as st
from metric_checks import assert_close, evaluate_randomly

import padded_eval as pe

M = pe.metrics
EPS = 2.0**-24
SEEDS = st.integers(0, 2**32 - 1)
CAPACITY = 64  # >= the rows of any example (n <= 40)


def _scores(rng, n, step):
  target = (rng.random(n) < 0.4).astype(np.int32)
  target[:2] = [0, 1]  # both classes occur
  k = rng.integers(0, 100 // step + 1, size=n) * step + rng.integers(0, 30) * target
  return (np.clip(k, 0, 100) / 100).astype(np.float32), target


@given(
  seed=SEEDS,
  n=st.integers(2, 40),
  step=st.sampled_from([1, 10, 50]),
  max_fpr=st.sampled_from([0.05, 0.3, 0.7, 1.0]),
)
def test_partial_auc_and_thresholds_match_references(seed, n, step, max_fpr):
  rng = np.random.default_rng(seed)
  preds, target = _scores(rng, n, step)
  metric = pe.Metrics(
    {
      "pauc": M.AUROC(max_fpr=max_fpr, exact=True, capacity=CAPACITY),
      "auroc_t": M.AUROC(thresholds=THRESHOLDS, max_fpr=max_fpr),
      "ap_t": M.AUPRC(thresholds=THRESHOLDS),
    }
  )
  got = evaluate_randomly(metric, {"preds": preds, "target": target}, rng)
  rtol = (CAPACITY + 4) * EPS
  scores = preds.astype(np.float64)
  assert_close(got["pauc"], skm.roc_auc_score(target, scores, max_fpr=max_fpr), rtol=rtol, atol=EPS)
  expected = binned_auroc(target, preds, THRESHOLDS, max_fpr)
  assert_close(got["auroc_t"], expected, rtol=rtol, atol=4 * EPS)
  assert_close(got["ap_t"], binned_ap(target, preds, THRESHOLDS), rtol=rtol, atol=4 * EPS)


@given(
  seed=SEEDS,
  n=st.integers(2, 40),
  step=st.sampled_from([1, 10, 50]),
  rate=st.sampled_from([0.0, 0.35, 0.8, 1.0]),
  exact=st.booleans(),
)
def test_operating_points_match_torchmetrics_formulas(seed, n, step, rate, exact):
  rng = np.random.default_rng(seed)
  preds, target = _scores(rng, n, step)
  mode = {"exact": True, "capacity": CAPACITY} if exact else {"thresholds": THRESHOLDS}
  thresholds = None if exact else THRESHOLDS
  metric = pe.Metrics(
    {
      "recall_at_precision": M.RecallAtFixedPrecision(min_precision=rate, **mode),
      "precision_at_recall": M.PrecisionAtFixedRecall(min_recall=rate, **mode),
      "sensitivity": M.SensitivityAtSpecificity(min_specificity=rate, **mode),
      "specificity": M.SpecificityAtSensitivity(min_sensitivity=rate, **mode),
      "eer": M.EER(**mode),
    }
  )
  got = evaluate_randomly(metric, {"preds": preds, "target": target}, rng)
  for kind, value in got.items():
    expected = operating_point(kind, rate, target, preds, thresholds)
    assert_close(value, expected, rtol=4 * EPS, atol=4 * EPS, what=kind)


@given(
  seed=SEEDS,
  n=st.integers(1, 40),
  logits=st.booleans(),
  c=st.integers(2, 5),
  scale_by_half=st.sampled_from(["auto", True, False]),
)
def test_brier_score_matches_sklearn(seed, n, logits, c, scale_by_half):
  """scikit-learn's formula; ``scale_by_half="auto"`` halves two columns only."""
  rng = np.random.default_rng(seed)
  raw = (rng.standard_normal((n, c)) * 3).astype(np.float32)
  probs = np.exp(raw.astype(np.float64) - raw.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  preds = raw if logits else probs.astype(np.float32)
  target = rng.integers(0, c, n).astype(np.int32)
  weights = rng.uniform(0.0, 3.0, n).astype(np.float32)
  metric = M.BrierScore(num_classes=c, from_logits=logits, scale_by_half=scale_by_half)
  fields = {"preds": preds, "target": target, "weights": weights}
  got = evaluate_randomly(metric, fields, rng)
  reference = probs if logits else preds.astype(np.float64)
  if weights.sum() == 0:
    return
  onehot = np.eye(c)[target]
  expected = np.sum(weights * np.sum((reference - onehot) ** 2, -1)) / np.sum(weights)
  if scale_by_half is True or (scale_by_half == "auto" and c == 2):
    expected /= 2
  assert_close(got, expected, rtol=(c + 8) * 1e-6 if logits else (c + 8) * EPS, atol=EPS)


@given(
  seed=SEEDS,
  n=st.integers(1, 40),
  labels=st.integers(2, 7),
  step=st.sampled_from([0.0, 0.25]),
  auprc=st.booleans(),
)
def test_multilabel_samples_average_matches_sklearn(seed, n, labels, step, auprc):
  """average="samples": the mean of per-row areas, any batching and device count, ties."""
  rng = np.random.default_rng(seed)
  target = (rng.random((n, labels)) < 0.5).astype(np.int32)
  probs = rng.random((n, labels))
  probs = (np.round(probs / step) * step if step else probs).astype(np.float32)
  cls, reference = (M.AUPRC, skm.average_precision_score) if auprc else (M.AUROC, skm.roc_auc_score)
  metric = cls(task="multilabel", num_classes=labels, average="samples")
  got = evaluate_randomly(metric, {"preds": probs, "target": target}, rng)
  rows = np.ones(n, bool) if auprc else (target.min(1) == 0) & (target.max(1) == 1)
  if not rows.any():
    assert np.isnan(got)
    return
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # sklearn: a row without positives has AP 0
    expected = reference(target[rows], probs[rows].astype(np.float64), average="samples")
  # each row value is one ratio of integer counts (one rounding), then a compensated mean
  assert_close(got, expected, rtol=8 * EPS, atol=1e-7)


@given(seed=SEEDS, n=st.integers(2, 40), average=st.sampled_from(["macro", "weighted"]))
def test_one_vs_one_auroc_matches_sklearn_on_grid_scores(seed, n, average):
  """multi_class="ovo" with binning="linear" on 0.01-grid probabilities: every distinct score
  has its own bin, so the value is scikit-learn's (ties as half a pair) at any batching."""
  rng = np.random.default_rng(seed)
  cuts = np.sort(rng.integers(0, 101, (n, 2)), -1)
  edges = np.concatenate([np.zeros((n, 1), int), cuts, np.full((n, 1), 100)], -1)
  probs = (np.diff(edges, axis=-1) / 100).astype(np.float32)
  target = rng.integers(0, 3, n).astype(np.int32)
  metric = M.AUROC(
    101, task="multiclass", num_classes=3, average=average, multi_class="ovo", binning="linear"
  )
  got = evaluate_randomly(metric, {"preds": probs, "target": target}, rng)
  if len(np.unique(target)) < 3:  # sklearn needs every column's class in y_true
    return
  expected = skm.roc_auc_score(target, probs.astype(np.float64), multi_class="ovo", average=average)
  assert_close(got, expected, rtol=32 * EPS, atol=1e-7)


@given(
  seed=SEEDS,
  n=st.integers(2, 40),
  step=st.sampled_from([1, 10, 50]),
  integer=st.booleans(),
  max_fpr=st.sampled_from([None, 0.3, 1.0]),
)
def test_sample_weights_match_sklearn_on_grid_scores(seed, n, step, integer, max_fpr):
  """weighted=True on 0.01-grid scores (a bin each with binning="linear", and exact=True):
  scikit-learn's ``sample_weight`` value at any batching, merge tree and device count; zero
  weights included (they count nothing), integer weights exact."""
  rng = np.random.default_rng(seed)
  preds, target = _scores(rng, n, step)
  weights = rng.integers(0, 4, n) if integer else rng.uniform(0.0, 3.0, n) * (rng.random(n) < 0.8)
  weights = weights.astype(np.float32)
  weights[:2] = np.maximum(weights[:2], 0.5)  # both classes weigh something
  grid = {"num_thresholds": 101, "binning": "linear", "weighted": True}
  exact = {"exact": True, "capacity": CAPACITY, "weighted": True}
  metric = pe.Metrics(
    {
      "auroc": M.AUROC(max_fpr=max_fpr, **grid),
      "ap": M.AUPRC(**grid),
      "auroc_exact": M.AUROC(max_fpr=max_fpr, **exact),
      "ap_exact": M.AUPRC(**exact),
    }
  )
  got = evaluate_randomly(metric, {"preds": preds, "target": target, "weights": weights}, rng)
  scores, w = preds.astype(np.float64), weights.astype(np.float64)
  expected = skm.roc_auc_score(target, scores, sample_weight=w, max_fpr=max_fpr)
  # weighted sums: float32 per batch, compensated after; one product and division per bin
  rtol = 128 * EPS
  assert_close(got["auroc"], expected, rtol=rtol, atol=4 * EPS, what="auroc")
  assert_close(got["auroc_exact"], expected, rtol=rtol, atol=4 * EPS, what="auroc_exact")
  expected = skm.average_precision_score(target, scores, sample_weight=w)
  assert_close(got["ap"], expected, rtol=rtol, atol=4 * EPS, what="ap")
  assert_close(got["ap_exact"], expected, rtol=rtol, atol=4 * EPS, what="ap_exact")
