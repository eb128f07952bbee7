"""Property suite, counts: Accuracy and the confusion-count metrics against scikit-learn.

Random labels and scores go through a random padded batching, merge tree and device
count (``metric_checks.evaluate_randomly``); all metrics of one configuration run as one
``pe.Metrics`` collection. Precision, Recall, F1, FBeta, Specificity and JaccardIndex
run for binary, multiclass (score and class-id preds) and multilabel inputs with every
``average``; MatthewsCorrCoef, CohenKappa and ConfusionMatrix for each task they take.

Tolerances, from float32 analysis (``EPS = 2**-24``): counts are exact integers and every
count here is below ``2**24``, so a ratio of counts is exact to one rounding; an
F-score or an average over ``C`` classes adds at most ``C + 4`` roundings:
``rtol = (C + 4) EPS``. MCC and kappa are formed from float32 shares (``count / n``):
``1 - sum(share**2)`` and ``trace - dot(true, pred)`` lose up to ``4 C EPS`` absolute,
which the division by ``sqrt(cov_true * cov_pred)`` (MCC) or by the chance disagreement
(kappa) amplifies; :func:`_mcc_tolerance` and :func:`_kappa_tolerance` propagate exactly
that bound from the float64 reference values.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import sklearn.metrics as skm
from hypothesis import given
from hypothesis import strategies as st
from metric_checks import assert_close, evaluate_randomly

import padded_eval as pe

pytestmark = pytest.mark.filterwarnings("ignore:A single label was found:UserWarning")

EPS = 2.0**-24
SEEDS = st.integers(0, 2**32 - 1)
ROWS = st.integers(1, 40)
C = 4  # multiclass / multilabel width (fixed: one compilation per configuration)
AVERAGES = st.sampled_from(["micro", "macro", "weighted", None])
SCORES = ("precision", "recall", "f1", "f2", "specificity", "jaccard")


def _scores(average, **config):
  kw = dict(config, average=average)
  return pe.Metrics(
    {
      "precision": pe.metrics.Precision(**kw),
      "recall": pe.metrics.Recall(**kw),
      "f1": pe.metrics.F1Score(**kw),
      "f2": pe.metrics.FBetaScore(beta=2.0, **kw),
      "specificity": pe.metrics.Specificity(**kw),
      "jaccard": pe.metrics.JaccardIndex(**kw),
    }
  )


def _specificity(y, p, average, labels):
  """tn / (tn + fp) per label of indicator arrays ``[N, L]``; averages as sklearn's."""
  tn = np.sum(~y & ~p, axis=0).astype(np.float64)
  fp = np.sum(~y & p, axis=0).astype(np.float64)
  per_label = np.divide(tn, tn + fp, out=np.zeros_like(tn), where=tn + fp > 0)
  if average == "micro":
    return np.sum(tn) / np.sum(tn + fp) if np.sum(tn + fp) else 0.0
  if average is None or average == "binary":
    return per_label if average is None else per_label[0]
  support = np.sum(y, axis=0)
  chosen = labels if labels is not None else np.arange(y.shape[1])
  if average == "macro":
    return np.mean(per_label[chosen])
  return np.sum(support * per_label) / np.sum(support) if np.sum(support) else 0.0


def _sklearn_scores(y, p, average, labels=None, indicator=None):
  """The six scores by scikit-learn (specificity by hand), zero_division=0."""
  kw = dict(average=average, zero_division=0, labels=labels)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    out = {
      "precision": skm.precision_score(y, p, **kw),
      "recall": skm.recall_score(y, p, **kw),
      "f1": skm.f1_score(y, p, **kw),
      "f2": skm.fbeta_score(y, p, beta=2.0, **kw),
      "jaccard": skm.jaccard_score(y, p, **kw),
    }
  truth, guess = indicator if indicator is not None else (y, p)
  present = None if labels is None or average != "macro" else labels
  out["specificity"] = _specificity(truth, guess, average, present)
  return out


def _check_scores(got, expected, average, width, what=""):
  for name in SCORES:
    assert_close(got[name], expected[name], rtol=(width + 4) * EPS, atol=0.0, what=f"{name} {what}")


# --- binary ----------------------------------------------------------------------------------


@given(
  seed=SEEDS,
  n=ROWS,
  threshold=st.sampled_from([0.3, 0.5]),
  prevalence=st.sampled_from([0.0, 0.3, 1.0]),
)
def test_binary_scores_match_sklearn(seed, n, threshold, prevalence):
  rng = np.random.default_rng(seed)
  target = (rng.random(n) < prevalence).astype(np.int32)
  preds = rng.random(n).astype(np.float32)
  metric = _scores(None, task="binary", threshold=threshold)
  got = evaluate_randomly(metric, {"preds": preds, "target": target}, rng)
  y, p = target.astype(bool), preds.astype(np.float64) > threshold
  expected = _sklearn_scores(y, p, "binary", indicator=(y[:, None], p[:, None]))
  _check_scores(got, expected, "binary", 1)


# --- multiclass ------------------------------------------------------------------------------


def _multiclass(rng, n, classes):
  """Target ids drawn from a random subset of the C classes (absent classes happen)."""
  target = rng.choice(classes, size=n).astype(np.int32)
  scores = rng.standard_normal((n, C)).astype(np.float32)
  scores[np.arange(n), target] += rng.random(n).astype(np.float32)  # better than chance
  return target, scores


@given(
  seed=SEEDS,
  n=ROWS,
  average=AVERAGES,
  classes=st.sampled_from([[0, 1, 2, 3], [0, 2], [3]]),
  ids=st.booleans(),
)
def test_multiclass_scores_match_sklearn(seed, n, average, classes, ids):
  rng = np.random.default_rng(seed)
  target, scores = _multiclass(rng, n, classes)
  guess = np.argmax(scores, axis=-1).astype(np.int32)
  preds = guess if ids else scores
  got = evaluate_randomly(_scores(average, num_classes=C), {"preds": preds, "target": target}, rng)
  present = np.union1d(target, guess)  # sklearn's default labels: those that occur
  labels = np.arange(C) if average is None else present
  eye = np.eye(C, dtype=bool)
  expected = _sklearn_scores(target, guess, average, labels, indicator=(eye[target], eye[guess]))
  _check_scores(got, expected, average, C, f"average={average}")


def _top_k_indicator(scores, k):
  top = np.argsort(-scores, axis=-1, kind="stable")[:, :k]
  guess = np.zeros(scores.shape, bool)
  np.put_along_axis(guess, top, True, axis=-1)
  return guess


@given(seed=SEEDS, n=st.integers(4, 40))
def test_multiclass_top_k_counts_each_class_once(seed, n):
  """top_k=2: a class is predicted for an element when among its 2 best scores; per class
  tp, fp, fn, tn of those indicators (torchmetrics); macro over classes that occur."""
  rng = np.random.default_rng(seed)
  target, scores = _multiclass(rng, n, [0, 1, 2, 3])
  metric = _scores("macro", num_classes=C, top_k=2)
  got = evaluate_randomly(metric, {"preds": scores, "target": target}, rng)
  y, p = np.eye(C, dtype=bool)[target], _top_k_indicator(scores, 2)
  tp, fp, fn = (np.sum(a & b, 0) for a, b in ((y, p), (~y, p), (y, ~p)))
  tn = n - tp - fp - fn
  present = tp + fp + fn > 0
  with np.errstate(invalid="ignore", divide="ignore"):
    expected = {
      "precision": np.nan_to_num(tp / (tp + fp)),
      "recall": np.nan_to_num(tp / (tp + fn)),
      "specificity": np.nan_to_num(tn / (tn + fp)),
    }
  for name, per_class in expected.items():
    assert_close(got[name], np.mean(per_class[present]), rtol=(C + 4) * EPS, atol=0.0, what=name)


# --- multilabel ------------------------------------------------------------------------------


@given(seed=SEEDS, n=ROWS, average=AVERAGES)
def test_multilabel_scores_match_sklearn(seed, n, average):
  """Every label occurs in the target (labels absent from both: see the test below)."""
  rng = np.random.default_rng(seed)
  target = (rng.random((n, C)) < 0.4).astype(np.int32)
  target[rng.integers(n, size=C), np.arange(C)] = 1
  preds = rng.random((n, C)).astype(np.float32)
  metric = _scores(average, task="multilabel", num_classes=C)
  got = evaluate_randomly(metric, {"preds": preds, "target": target}, rng)
  y, p = target.astype(bool), preds.astype(np.float64) > 0.5
  expected = _sklearn_scores(y, p, average, labels=None)
  _check_scores(got, expected, average, C, f"average={average}")


@given(seed=SEEDS, n=ROWS)
def test_multilabel_macro_averages_every_label(seed, n):
  rng = np.random.default_rng(seed)
  target = (rng.random((n, C)) < 0.5).astype(np.int32)
  preds = rng.random((n, C)).astype(np.float32)
  target[:, -1], preds[:, -1] = 0, 0.1  # the last label occurs nowhere
  metric = _scores("macro", task="multilabel", num_classes=C)
  got = evaluate_randomly(metric, {"preds": preds, "target": target}, rng)
  y, p = target.astype(bool), preds.astype(np.float64) > 0.5
  _check_scores(got, _sklearn_scores(y, p, "macro"), "macro", C)


# --- MCC, Cohen's kappa, confusion matrix ------------------------------------------------------


def _mcc_tolerance(table):
  """The bound of the module docstring, from the float64 shares of ``table``."""
  share = table / np.sum(table)
  true, pred = share.sum(1), share.sum(0)
  cov_true, cov_pred = 1 - true @ true, 1 - pred @ pred
  if cov_true <= 0 or cov_pred <= 0:
    return 0.0  # undefined: exactly 0
  mcc = (np.trace(share) - true @ pred) / np.sqrt(cov_true * cov_pred)
  width = len(table)
  return (
    4 * width * EPS / np.sqrt(cov_true * cov_pred)
    + abs(mcc) * width * EPS * (1 / cov_true + 1 / cov_pred)
    + 2 * EPS
  )


def _kappa_tolerance(kappa):
  """``1 - observed / chance``: ``C**2``-term float32 sums, relative ``4 (C**2 + 3) EPS``."""
  return 4 * (C * C + 3) * EPS * abs(1 - kappa) + 2 * EPS


@given(seed=SEEDS, n=ROWS, classes=st.sampled_from([[0, 1, 2, 3], [1, 2], [2]]))
def test_multiclass_matrix_metrics_match_sklearn(seed, n, classes):
  rng = np.random.default_rng(seed)
  target, scores = _multiclass(rng, n, classes)
  metric = pe.Metrics(
    {
      "mcc": pe.metrics.MatthewsCorrCoef(num_classes=C),
      "kappa": pe.metrics.CohenKappa(num_classes=C),
      "kappa_linear": pe.metrics.CohenKappa(num_classes=C, weights="linear"),
      "kappa_quadratic": pe.metrics.CohenKappa(num_classes=C, weights="quadratic"),
      "matrix": pe.metrics.ConfusionMatrix(C),
      "matrix_true": pe.metrics.ConfusionMatrix(C, normalize="true"),
      "matrix_all": pe.metrics.ConfusionMatrix(C, normalize="all"),
    }
  )
  got = evaluate_randomly(metric, {"preds": scores, "target": target}, rng)
  guess = np.argmax(scores, axis=-1)
  table = skm.confusion_matrix(target, guess, labels=range(C)).astype(np.float64)
  assert_close(got["matrix"], table, atol=0.0, what="matrix")
  rows = table.sum(1, keepdims=True)
  true_normalized = np.divide(table, rows, out=np.zeros_like(table), where=rows > 0)
  assert_close(got["matrix_true"], true_normalized, rtol=2 * EPS, atol=0.0, what="true")
  assert_close(got["matrix_all"], table / n, rtol=2 * EPS, atol=0.0, what="all")
  if (
    len(np.unique(target)) > 1 and len(np.unique(guess)) > 1
  ):  # else: the constant-input test below
    expected_mcc = skm.matthews_corrcoef(target, guess)
    assert_close(got["mcc"], expected_mcc, atol=_mcc_tolerance(table), what="mcc")
  for key, weights in (
    ("kappa", None),
    ("kappa_linear", "linear"),
    ("kappa_quadratic", "quadratic"),
  ):
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      kappa = skm.cohen_kappa_score(target, guess, labels=range(C), weights=weights)
    kappa = 0.0 if np.isnan(kappa) else kappa  # documented: undefined kappa computes 0
    assert_close(got[key], kappa, atol=_kappa_tolerance(kappa), what=key)


@given(seed=SEEDS, n=ROWS, prevalence=st.sampled_from([0.1, 0.5]))
def test_binary_and_multilabel_matrix_metrics_match_sklearn(seed, n, prevalence):
  rng = np.random.default_rng(seed)
  target = (rng.random((n, C)) < prevalence).astype(np.int32)
  preds = np.clip(0.6 * target + 0.7 * rng.random((n, C)), 0, 1).astype(np.float32)
  fields = {"preds": preds, "target": target}
  label = pe.Metrics(
    {
      "mcc": pe.metrics.MatthewsCorrCoef(task="multilabel", num_classes=C),
      "matrix": pe.metrics.ConfusionMatrix(C, task="multilabel"),
    }
  )
  got = evaluate_randomly(label, fields, rng)
  y, p = target.astype(bool), preds.astype(np.float64) > 0.5
  assert_close(got["matrix"], skm.multilabel_confusion_matrix(y, p), atol=0.0)
  summed = skm.confusion_matrix(y.ravel(), p.ravel(), labels=[0, 1]).astype(np.float64)
  mcc = skm.matthews_corrcoef(y.ravel(), p.ravel())
  assert_close(got["mcc"], mcc, atol=_mcc_tolerance(summed), what="multilabel mcc")
  binary = pe.Metrics(
    {
      "mcc": pe.metrics.MatthewsCorrCoef(task="binary"),
      "kappa": pe.metrics.CohenKappa(task="binary"),
      "matrix": pe.metrics.ConfusionMatrix(task="binary"),
    }
  )
  got = evaluate_randomly(binary, {"preds": preds[:, 0], "target": target[:, 0]}, rng)
  table = skm.confusion_matrix(y[:, 0], p[:, 0], labels=[0, 1]).astype(np.float64)
  assert_close(got["matrix"], table, atol=0.0)
  mcc = skm.matthews_corrcoef(y[:, 0], p[:, 0])
  assert_close(got["mcc"], mcc, atol=_mcc_tolerance(table), what="binary mcc")
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    kappa = np.nan_to_num(skm.cohen_kappa_score(y[:, 0], p[:, 0], labels=[0, 1]))
  assert_close(got["kappa"], kappa, atol=_kappa_tolerance(kappa), what="binary kappa")


@given(
  seed=SEEDS,
  n=st.sampled_from([31, 41, 47, 55, 61, 82]),
  task=st.sampled_from(["binary", "multiclass"]),
  constant_preds=st.booleans(),
)
def test_mcc_of_constant_inputs_is_zero(seed, n, task, constant_preds):
  """A constant target (and preds): sklearn's MCC is 0 (undefined, a variance is 0)."""
  rng = np.random.default_rng(seed)
  target = np.zeros(n, np.int32)
  preds = target if constant_preds else rng.integers(0, 2, n).astype(np.int32)
  metric = pe.metrics.MatthewsCorrCoef(task=task, num_classes=None if task == "binary" else C)
  got = evaluate_randomly(metric, {"preds": preds, "target": target}, rng)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "a single label was found"
    expected = skm.matthews_corrcoef(target, preds)
  assert_close(got, expected, atol=0.0)


# --- Accuracy ----------------------------------------------------------------------------------


@given(seed=SEEDS, n=ROWS, top_k=st.sampled_from([1, 2]), weighted=st.booleans())
def test_accuracy_matches_sklearn(seed, n, top_k, weighted):
  rng = np.random.default_rng(seed)
  target, scores = _multiclass(rng, n, [0, 1, 2, 3])
  weights = rng.uniform(0.1, 2.0, n).astype(np.float32) if weighted else None
  fields = {"preds": scores, "target": target, **({"weights": weights} if weighted else {})}
  got = evaluate_randomly(pe.metrics.Accuracy(top_k=top_k), fields, rng)
  w = None if weights is None else weights.astype(np.float64)
  expected = skm.top_k_accuracy_score(target, scores, k=top_k, labels=range(C), sample_weight=w)
  # Sums of at most 16 weights (0/1 hits times weights): 16 EPS, plus the division.
  assert_close(got, expected, rtol=20 * EPS, atol=0.0)


@given(seed=SEEDS, n=ROWS, average=AVERAGES, weighted=st.booleans())
def test_accuracy_average_matches_sklearn(seed, n, average, weighted):
  """Accuracy(average=...) (torchmetrics' MulticlassAccuracy): per-class recall, averaged
  over the classes in the target or the predictions (sklearn's recall_score on them)."""
  rng = np.random.default_rng(seed)
  target, scores = _multiclass(rng, n, [0, 1, 3])
  weights = rng.uniform(0.1, 2.0, n).astype(np.float32) if weighted else None
  fields = {"preds": scores, "target": target, **({"weights": weights} if weighted else {})}
  got = evaluate_randomly(pe.metrics.Accuracy(average=average, num_classes=C), fields, rng)
  w = None if weights is None else weights.astype(np.float64)
  pred = np.argmax(scores, -1)
  if average is None:
    labels = list(range(C))
  else:
    labels = sorted(set(target.tolist()) | set(pred.tolist()))
  expected = skm.recall_score(
    target, pred, labels=labels, average=average, sample_weight=w, zero_division=0
  )
  if average == "micro":
    expected = skm.accuracy_score(target, pred, sample_weight=w)
  # sums of at most 40 weights per class, a ratio and a mean over C classes
  assert_close(got, expected, rtol=(40 + C + 4) * EPS, atol=1e-7)


@given(seed=SEEDS, n=ROWS, average=AVERAGES)
def test_multilabel_accuracy_matches_sklearn(seed, n, average):
  """MultilabelAccuracy: each label's accuracy_score on its column, averaged."""
  rng = np.random.default_rng(seed)
  target = (rng.random((n, C)) < 0.4).astype(np.int32)
  probs = rng.random((n, C)).astype(np.float32)
  metric = pe.metrics.Accuracy(task="multilabel", average=average, num_classes=C)
  got = evaluate_randomly(metric, {"preds": probs, "target": target}, rng)
  guess = (probs > 0.5).astype(np.int32)
  per_label = np.array([skm.accuracy_score(target[:, j], guess[:, j]) for j in range(C)])
  support = target.sum(0).astype(np.float64)
  if average == "micro":
    expected = skm.accuracy_score(target.ravel(), guess.ravel())
  elif average is None:
    expected = per_label
  elif average == "weighted":
    expected = np.sum(support * per_label) / np.sum(support) if support.sum() else 0.0
  else:
    expected = np.mean(per_label)
  assert_close(got, expected, rtol=(C + 4) * EPS, atol=1e-7)


@given(seed=SEEDS, n=ROWS, binary=st.booleans(), scale=st.sampled_from([0.1, 3.0, 1e4]))
def test_hinge_loss_matches_sklearn(seed, n, binary, scale):
  """HingeLoss against scikit-learn's hinge_loss at any batching, scale and weights."""
  rng = np.random.default_rng(seed)
  weights = rng.uniform(0.1, 2.0, n).astype(np.float32)
  if binary:
    target = rng.integers(0, 2, n).astype(np.int32)
    scores = (scale * rng.standard_normal(n)).astype(np.float32)
    metric, labels = pe.metrics.HingeLoss(task="binary"), None
  else:
    target, scores = _multiclass(rng, n, [0, 1, 2, 3])
    scores = (scale * scores).astype(np.float32)
    metric, labels = pe.metrics.HingeLoss(task="multiclass", num_classes=C), list(range(C))
  fields = {"preds": scores, "target": target, "weights": weights}
  got = evaluate_randomly(metric, fields, rng)
  expected = skm.hinge_loss(target, scores.astype(np.float64), labels=labels, sample_weight=weights)
  if binary and len(np.unique(target)) == 1:  # scikit-learn's LabelBinarizer makes a lone class -1
    margins = np.where(target == 1, 1.0, -1.0) * scores.astype(np.float64)
    expected = np.average(np.maximum(1.0 - margins, 0.0), weights=weights)
  # each loss (1 - margin) rounded in float32 relative to the scores' scale, then compensated sums
  assert_close(got, expected, rtol=8 * EPS, atol=4 * EPS * (1 + 2 * scale))


# --- invalid values (issue 12 findings) --------------------------------------------------------


@given(seed=SEEDS, n=st.integers(4, 40))
def test_nan_scores_rank_worst(seed, n):
  rng = np.random.default_rng(seed)
  target, scores = _multiclass(rng, n, [0, 1, 2, 3])
  scores[rng.random((n, C)) < 0.3] = np.nan
  scores[:, 0] = np.where(np.isnan(scores[:, 0]), 0.0, scores[:, 0])  # one real score a row
  worst = np.where(np.isnan(scores), -np.inf, scores)
  metric = pe.Metrics({"top1": pe.metrics.Accuracy(), "top2": pe.metrics.Accuracy(top_k=2)})
  got = evaluate_randomly(metric, {"preds": scores, "target": target}, rng)
  scored = ~np.isnan(scores[np.arange(n), target])  # a NaN score is never a hit, even in the top k
  for key, k in (("top1", 1), ("top2", 2)):
    expected = np.mean(np.any(_top_k_ranks(worst, k) == target[:, None], axis=-1) & scored)
    assert_close(got[key], expected, rtol=20 * EPS, atol=0.0, what=key)


def _top_k_ranks(scores, k):
  return np.argsort(-scores, axis=-1, kind="stable")[:, :k]


@given(seed=SEEDS, n=st.integers(4, 40))
def test_out_of_range_predicted_ids_are_wrong_predictions(seed, n):
  """A predicted id outside [0, C) is a miss of the true class and predicts no class."""
  rng = np.random.default_rng(seed)
  target = rng.integers(0, C, n).astype(np.int32)
  preds = np.where(rng.random(n) < 0.5, target, rng.choice([-1, C, 99], n)).astype(np.int32)
  metric = pe.Metrics(
    {"recall": pe.metrics.Recall(num_classes=C, average="micro"), "accuracy": pe.metrics.Accuracy()}
  )
  got = evaluate_randomly(metric, {"preds": preds, "target": target}, rng)
  hits = np.mean(preds == target)
  assert_close(got["accuracy"], hits, rtol=20 * EPS, atol=0.0, what="accuracy")
  assert_close(got["recall"], hits, rtol=(C + 4) * EPS, atol=0.0, what="recall")
