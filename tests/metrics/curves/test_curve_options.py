"""Curve options and curve-family metrics of issue 31 against scikit-learn and torchmetrics'
formulas (float64 numpy, ``tests/_curve_option_cases.py``): ``thresholds=[...]``,
``max_fpr``, the operating points, EER and BrierScore, on garbage-padded uneven batches,
through ``masked_eval`` on every backend (8 devices), and the configuration errors.
"""

from __future__ import annotations

import metric_cases  # noqa: F401  (imports the option cases after the table they extend)
import numpy as np
import pytest
import sklearn.metrics as skm
from _curve_option_cases import (
  CURVE_OPTION_CASES,
  THRESHOLDS,
  binned_ap,
  binned_auroc,
  operating_point,
)
from _metrics_shared import CHECKS

import padded_eval as pe

M = pe.metrics


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__.removeprefix("check_"))
@pytest.mark.parametrize("case", CURVE_OPTION_CASES, ids=lambda case: case.name)
def test_metric_protocol(case, check):
  """Every generic check of tests/metric_checks.py on every curve-option row."""
  check(case)


def _padded(preds, target, rng, pad=37):
  bad = rng.choice(np.array([np.nan, np.inf, -np.inf, 7.0], np.float32), (pad,) + preds.shape[1:])
  junk = rng.integers(-5, 50, (pad,) + target.shape[1:]).astype(np.int32)
  mask = np.arange(len(preds) + pad) < len(preds)
  return {
    "preds": np.concatenate([preds.astype(np.float32), bad]),
    "target": np.concatenate([target.astype(np.int32), junk]),
    "mask": mask,
  }


def _close_scores(rng, n):
  """Scores with exact ties (3 decimals) and near-ties 1e-7 apart, prevalence 0.3."""
  target = (rng.random(n) < 0.3).astype(np.int32)
  scores = np.clip(rng.normal(0.45 + 0.15 * target, 0.2), 0, 1)
  scores = np.round(scores, 3).astype(np.float32)
  scores[:30] = np.float32(0.4) + np.float32(1e-7) * (np.arange(30) % 3)
  return scores, target


@pytest.mark.parametrize("max_fpr", [0.01, 0.1, 0.25, 0.5, 1.0])
def test_max_fpr_matches_sklearn(max_fpr):
  rng = np.random.default_rng(3)
  scores, target = _close_scores(rng, 5_000)
  batch = _padded(scores, target, rng)
  expected = skm.roc_auc_score(target, scores, max_fpr=max_fpr)
  exact = M.AUROC(max_fpr=max_fpr, exact=True, capacity=6_000).update(**batch)
  assert abs(float(exact.compute()) - expected) < 1e-6
  binned = M.AUROC(max_fpr=max_fpr).update(**batch)
  error = abs(float(binned.compute()) - expected)
  assert error <= float(binned.error_bound()) + 1e-6  # near-ties share a bin


def test_max_fpr_multilabel_matches_sklearn_per_label_and_micro():
  rng = np.random.default_rng(4)
  target = (rng.random((400, 3)) < 0.4).astype(np.int32)
  scores = np.round(np.clip(rng.normal(0.4 + 0.2 * target, 0.25), 0, 1), 2).astype(np.float32)
  batch = _padded(scores, target, rng)
  for average in ("macro", "micro", "weighted", None):
    expected = skm.roc_auc_score(target, scores, max_fpr=0.2, average=average)
    for config in ({"exact": True, "capacity": 450}, {"num_thresholds": 101, "binning": "linear"}):
      metric = M.AUROC(task="multilabel", num_classes=3, average=average, max_fpr=0.2, **config)
      np.testing.assert_allclose(metric.update(**batch).compute(), expected, atol=1e-6)


@pytest.mark.parametrize("task", ["binary", "multilabel", "multiclass"])
def test_thresholds_match_torchmetrics_formulas(task):
  rng = np.random.default_rng(5)
  n, c = 300, 3
  if task == "multiclass":
    logits = rng.standard_normal((n, c)) * 2
    scores = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).astype(np.float32)
    target = rng.integers(0, c, n).astype(np.int32)
    columns = [((target == k).astype(int), scores[:, k]) for k in range(c)]
  else:
    shape = (n,) if task == "binary" else (n, c)
    target = (rng.random(shape) < 0.4).astype(np.int32)
    scores = rng.random(shape).astype(np.float32)
    columns = (
      [(target, scores)] if task == "binary" else [(target[:, k], scores[:, k]) for k in range(c)]
    )
  batch = _padded(scores, target, rng)
  config = {} if task == "binary" else {"task": task, "num_classes": c, "average": None}
  for thresholds in (list(THRESHOLDS), 21, np.array([0.0, 0.5, 1.0])):
    grid = np.linspace(0, 1, thresholds) if isinstance(thresholds, int) else thresholds
    for cls, value in (
      (M.AUROC, lambda y, s: binned_auroc(y, s, grid)),
      (M.AUROC, None),
      (M.AUPRC, lambda y, s: binned_ap(y, s, grid)),
    ):
      extra = {} if value is not None else {"max_fpr": 0.3}
      value = value or (lambda y, s: binned_auroc(y, s, grid, max_fpr=0.3))
      got = cls(thresholds=thresholds, **extra, **config).update(**batch).compute()
      expected = [value(y, s) for y, s in columns]
      np.testing.assert_allclose(got, expected if task != "binary" else expected[0], atol=2e-6)


def test_thresholds_with_logits_compare_sigmoid_probabilities():
  rng = np.random.default_rng(6)
  target = (rng.random(200) < 0.5).astype(np.int32)
  logits = (rng.standard_normal(200) + target).astype(np.float32)
  probs = (1 / (1 + np.exp(-logits.astype(np.float64)))).astype(np.float32)
  batch = _padded(logits, target, rng)
  got = M.AUPRC(thresholds=THRESHOLDS, from_logits=True).update(**batch).compute()
  assert abs(float(got) - binned_ap(target, probs, THRESHOLDS)) < 1e-5


def test_thresholds_curve_points_are_the_thresholds():
  rng = np.random.default_rng(7)
  target = (rng.random(500) < 0.4).astype(np.int32)
  scores = rng.random(500).astype(np.float32)
  metric = M.AUROC(thresholds=THRESHOLDS).update(**_padded(scores, target, rng))
  fpr, tpr, thresholds = metric.curve()
  for f, t, edge in zip(fpr[1:], tpr[1:], thresholds[1:]):
    chosen = scores >= np.float32(edge)
    assert t == np.mean(chosen[target == 1]) and f == np.mean(chosen[target == 0])
  assert set(np.float32(thresholds[1:-1])) <= set(np.float32(THRESHOLDS))


@pytest.mark.parametrize(
  "kind,cls,argname,rate",
  [
    ("recall_at_precision", "RecallAtFixedPrecision", "min_precision", 0.5),
    ("precision_at_recall", "PrecisionAtFixedRecall", "min_recall", 0.77),
    ("sensitivity", "SensitivityAtSpecificity", "min_specificity", 0.9),
    ("specificity", "SpecificityAtSensitivity", "min_sensitivity", 0.3),
    ("eer", "EER", None, None),
  ],
)
def test_operating_points_exact_and_thresholds(kind, cls, argname, rate):
  rng = np.random.default_rng(8)
  scores, target = _close_scores(rng, 2_000)
  batch = _padded(scores, target, rng)
  rates = {} if argname is None else {argname: rate}
  exact = getattr(M, cls)(exact=True, capacity=2_100, **rates).update(**batch)
  assert abs(float(exact.compute()) - operating_point(kind, rate, target, scores)) < 1e-6
  binned = getattr(M, cls)(thresholds=THRESHOLDS, **rates).update(**batch)
  expected = operating_point(kind, rate, target, scores, THRESHOLDS)
  assert abs(float(binned.compute()) - expected) < 1e-6


def test_operating_points_without_a_qualifying_point_are_0_and_undefined_nan():
  preds, target = np.array([0.9, 0.8, 0.1], np.float32), np.array([0, 0, 1], np.int32)
  assert (
    float(M.RecallAtFixedPrecision(min_precision=0.9).update(preds=preds, target=target).compute())
    == 0.0
  )
  only_negatives = {"preds": preds, "target": np.zeros(3, np.int32)}
  assert np.isnan(float(M.EER(exact=True, capacity=3).update(**only_negatives).compute()))
  assert np.isnan(
    float(M.SensitivityAtSpecificity(min_specificity=0.5).update(**only_negatives).compute())
  )


@pytest.mark.parametrize("exact", [True, False])
def test_operating_points_keep_a_rate_equal_to_the_required_one(exact):
  """A point whose rate is exactly the required one qualifies (20 of 25 negatives below the
  threshold is a specificity of 0.8): XLA must not make the division by the class total a
  reciprocal multiply, whose float32 result (20 / 25 = 0.79999995) left the point out."""
  positives, negatives = [0.95] * 9 + [0.3] * 6, [0.8] * 5 + [0.1] * 20
  preds = np.array(positives + negatives, np.float32)
  target = np.array([1] * 15 + [0] * 25, np.int32)
  mode = {"exact": True, "capacity": 64} if exact else {"thresholds": THRESHOLDS}
  thresholds = None if exact else THRESHOLDS
  metrics = {
    "sensitivity": (M.SensitivityAtSpecificity, "min_specificity", 20 / 25),
    "specificity": (M.SpecificityAtSensitivity, "min_sensitivity", 9 / 15),
    "precision_at_recall": (M.PrecisionAtFixedRecall, "min_recall", 9 / 15),
  }
  for kind, (cls, argname, rate) in metrics.items():
    got = float(cls(**mode, **{argname: rate}).update(preds=preds, target=target).compute())
    expected = operating_point(kind, rate, target, preds, thresholds)
    assert abs(got - expected) < 1e-6, (kind, got, expected)


TRACES = []


def _step(params, batch):
  del params
  TRACES.append(1)
  return pe.Metrics(
    {
      "pauc": M.AUROC(max_fpr=0.2, exact=True, capacity=8 * 32),
      "auroc_thresholds": M.AUROC(thresholds=THRESHOLDS),
      "ap_thresholds": M.AUPRC(thresholds=THRESHOLDS),
      "eer": M.EER(exact=True, capacity=8 * 32),
      "rec_at_prec": M.RecallAtFixedPrecision(min_precision=0.6, exact=True, capacity=8 * 32),
      "brier": M.BrierScore(task="binary"),
    }
  ).batch_updates(preds=batch["s"], target=batch["y"], mask=batch["mask"])


def test_through_masked_eval_on_every_backend(backend):
  rng = np.random.default_rng(9)
  scores, target = _close_scores(rng, 203)
  batches = pe.pad_batches({"s": scores, "y": target}, 32)
  TRACES.clear()
  results = pe.masked_eval(_step, None, batches, backend=backend)
  assert len(TRACES) == 1 and results["num_examples"] == 203
  expected = {
    "pauc": skm.roc_auc_score(target, scores, max_fpr=0.2),
    "auroc_thresholds": binned_auroc(target, scores, THRESHOLDS),
    "ap_thresholds": binned_ap(target, scores, THRESHOLDS),
    "eer": operating_point("eer", None, target, scores),
    "rec_at_prec": operating_point("recall_at_precision", 0.6, target, scores),
    "brier": skm.brier_score_loss(target, scores),
  }
  for name, value in expected.items():
    assert abs(results[name] - value) < 2e-6, name


BAD_CONFIGS = [
  (lambda: M.AUROC(thresholds=[0.5, 0.2]), "thresholds"),
  (lambda: M.AUROC(thresholds=[0.2, 1.5]), "thresholds"),
  (lambda: M.AUPRC(thresholds=1), "thresholds"),
  (lambda: M.AUPRC(thresholds="0.5"), "thresholds"),
  (lambda: M.AUROC(11, thresholds=[0.5]), "num_thresholds"),
  (lambda: M.AUROC(thresholds=[0.5], binning="linear"), "binning"),
  (lambda: M.AUROC(thresholds=[0.5], exact=True, capacity=8), "exact"),
  (lambda: M.AUROC(max_fpr=0.0), "max_fpr"),
  (lambda: M.AUROC(max_fpr=1.5), "max_fpr"),
  (lambda: M.AUROC(max_fpr=True), "max_fpr"),
  (lambda: M.RecallAtFixedPrecision(min_precision=1.2), "min_precision"),
  (lambda: M.SpecificityAtSensitivity(min_sensitivity="high"), "min_sensitivity"),
  (lambda: M.BrierScore(task="multilabel", num_classes=3), "task"),
  (lambda: M.BrierScore(), "num_classes"),
]


@pytest.mark.parametrize("make,argname", BAD_CONFIGS, ids=[a for _, a in BAD_CONFIGS])
def test_bad_config_names_the_argument(make, argname):
  with pytest.raises(ValueError, match=argname):
    make()


def test_error_bound_refused_for_thresholds():
  metric = M.AUROC(thresholds=THRESHOLDS).update(
    preds=np.array([0.3, 0.6]), target=np.array([0, 1])
  )
  with pytest.raises(ValueError, match="thresholds"):
    metric.error_bound()


@pytest.mark.parametrize("scale_by_half", ["auto", True, False])
@pytest.mark.parametrize(
  "task,num_classes", [("binary", None), ("multiclass", 2), ("multiclass", 4)]
)
def test_brier_scale_by_half_matches_sklearn(task, num_classes, scale_by_half):
  """scikit-learn's ``scale_by_half``: "auto" halves the two-column sum (binary, or multiclass
  with two classes), True always, False never; padded rows hold NaN."""
  rng = np.random.default_rng(3)
  n, b = 37, 8
  classes = num_classes or 2
  target = rng.integers(0, classes, n)
  probs = rng.dirichlet(np.ones(classes), n).astype(np.float32)
  preds = probs[:, 1] if task == "binary" else probs
  weights = rng.uniform(0.1, 2.0, n).astype(np.float32)
  metric = M.BrierScore(task=task, num_classes=num_classes, scale_by_half=scale_by_half)
  for start in range(0, n, b):
    rows = slice(start, start + b)
    real = preds[rows].shape[0]
    pad = lambda x, fill: np.concatenate([x, np.full((b - real,) + x.shape[1:], fill, x.dtype)])
    metric = metric.update(
      preds=pad(preds[rows], np.nan),
      target=pad(target[rows].astype(np.int32), 7),
      weights=pad(weights[rows], np.nan),
      mask=np.arange(b) < real,
    )
  proba = preds.astype(np.float64)
  if task == "multiclass":  # the float32 rows, renormalized: scikit-learn checks they sum to 1
    proba = proba / proba.sum(-1, keepdims=True)
  expected = skm.brier_score_loss(
    target,
    proba,
    sample_weight=weights.astype(np.float64),
    scale_by_half=scale_by_half,
    labels=range(classes),
  )
  np.testing.assert_allclose(float(metric.compute()), expected, rtol=2e-6)


def test_brier_scale_by_half_refuses_other_values():
  with pytest.raises(ValueError, match="scale_by_half"):
    M.BrierScore(num_classes=3, scale_by_half="yes")
