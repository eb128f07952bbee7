"""Property suite, the confusion family's peer options and new metrics against scikit-learn.

Random labels go through a random padded batching, merge tree and device count
(``metric_checks.evaluate_randomly``). Tolerances as in test_properties_classification.py:
a ratio of exact counts is one rounding, an average over ``C`` classes ``C + 4``
(``rtol = (C + 4) EPS``); a mean over ``n`` samples of per-sample scores adds ``n``
roundings (``rtol = (n + C + 4) EPS``).
"""

from __future__ import annotations

import warnings

import numpy as np
import sklearn.metrics as skm
from hypothesis import given
from hypothesis import strategies as st
from metric_checks import assert_close, evaluate_randomly

import padded_eval as pe

M = pe.metrics
EPS = 2.0**-24
SEEDS = st.integers(0, 2**32 - 1)
ROWS = st.integers(1, 40)
C = 4
NAN = float("nan")


def _quiet(fn, *args, **kw):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    return fn(*args, **kw)


@given(
  seed=SEEDS,
  n=ROWS,
  average=st.sampled_from(["micro", "macro", "weighted", None]),
  zero_division=st.sampled_from([0, 1, NAN]),
  classes=st.sampled_from([[0, 1, 2, 3], [0, 2], [3]]),
)
def test_zero_division_matches_sklearn(seed, n, average, zero_division, classes):
  rng = np.random.default_rng(seed)
  target = rng.choice(classes, n).astype(np.int32)
  preds = rng.choice([0, 1, 3], n).astype(np.int32)  # class 2 never predicted
  kw = dict(num_classes=C, average=average, zero_division=zero_division)
  metric = pe.Metrics(
    {"precision": M.Precision(**kw), "recall": M.Recall(**kw), "f1": M.F1Score(**kw)}
  )
  got = evaluate_randomly(metric, {"preds": preds, "target": target}, rng)
  labels = {"labels": list(range(C))} if average is None else {}
  for name, fn in (
    ("precision", skm.precision_score),
    ("recall", skm.recall_score),
    ("f1", skm.f1_score),
  ):
    want = _quiet(fn, target, preds, average=average, zero_division=zero_division, **labels)
    assert_close(got[name], want, rtol=(C + 4) * EPS, atol=0.0, what=f"{name} {average}")


@given(seed=SEEDS, n=ROWS, prevalence=st.sampled_from([0.1, 0.5]))
def test_new_metrics_match_sklearn(seed, n, prevalence):
  rng = np.random.default_rng(seed)
  target = rng.integers(0, C, n).astype(np.int32)
  preds = np.where(rng.random(n) < prevalence, target, rng.integers(0, C, n)).astype(np.int32)
  metric = pe.Metrics(
    {
      "balanced": M.BalancedAccuracy(num_classes=C),
      "hamming": M.HammingLoss(num_classes=C),
      "zero_one": M.ZeroOneLoss(num_classes=C),
      "stats": M.StatScores(num_classes=C),
    }
  )
  got = evaluate_randomly(metric, {"preds": preds, "target": target}, rng)
  tol = dict(rtol=(C + 4) * EPS, atol=0.0)
  assert_close(got["balanced"], _quiet(skm.balanced_accuracy_score, target, preds), **tol)
  assert_close(got["hamming"], skm.hamming_loss(target, preds), **tol)
  assert_close(got["zero_one"], skm.zero_one_loss(target, preds), **tol)
  mcm = skm.multilabel_confusion_matrix(target, preds, labels=list(range(C)))
  tn, fp, fn, tp = mcm[:, 0, 0], mcm[:, 0, 1], mcm[:, 1, 0], mcm[:, 1, 1]
  assert_close(got["stats"], np.stack([tp, fp, tn, fn, tp + fn], -1), atol=0.0)


@given(seed=SEEDS, n=ROWS, zero_division=st.sampled_from([0, 1]))
def test_multilabel_samples_average_matches_sklearn(seed, n, zero_division):
  rng = np.random.default_rng(seed)
  target = (rng.random((n, C)) < 0.3).astype(np.int32)
  preds = rng.random((n, C)).astype(np.float32)
  kw = dict(task="multilabel", num_classes=C, average="samples", zero_division=zero_division)
  metric = pe.Metrics({"f1": M.F1Score(**kw), "jaccard": M.JaccardIndex(**kw)})
  got = evaluate_randomly(metric, {"preds": preds, "target": target}, rng)
  guess = preds > 0.5
  tol = dict(rtol=(n + C + 4) * EPS, atol=(n + C + 4) * EPS)
  for name, fn in (("f1", skm.f1_score), ("jaccard", skm.jaccard_score)):
    want = fn(target, guess, average="samples", zero_division=zero_division)
    assert_close(got[name], want, **tol, what=name)


@given(seed=SEEDS, n=ROWS, average=st.sampled_from(["micro", "macro", "weighted"]))
def test_samplewise_is_the_mean_of_per_row_sklearn_scores(seed, n, average):
  rng = np.random.default_rng(seed)
  target = rng.integers(0, C, (n, 5)).astype(np.int32)
  preds = rng.integers(0, C, (n, 5)).astype(np.int32)
  metric = M.Recall(num_classes=C, average=average, multidim_average="samplewise")
  got = evaluate_randomly(metric, {"preds": preds, "target": target}, rng)
  rows = [
    _quiet(skm.recall_score, t, p, average=average, zero_division=0) for t, p in zip(target, preds)
  ]
  tol = (n + C + 4) * EPS
  assert_close(got, np.mean(rows), rtol=tol, atol=tol)
