"""AUROC.curve / AUPRC.curve / CalibrationError.bins against numpy and scikit-learn.

References are float64 numpy on the real rows only (``score >= threshold`` at every
returned threshold, histograms of the confidences) and scikit-learn's ``roc_curve``,
``precision_recall_curve`` and ``calibration_curve``. Padded rows hold NaN / inf scores
and garbage labels, and are masked out.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import sklearn.metrics as skm
from sklearn.calibration import calibration_curve
from sklearn.preprocessing import label_binarize

import padded_eval as pe

M = pe.metrics
PAD = 64  # padded rows appended to every data set


def _padded(preds, target, rng):
  """Appends PAD rows of NaN / inf scores and garbage labels; returns the update keywords."""
  bad = rng.choice(np.array([np.nan, np.inf, -np.inf, 7.0], np.float32), (PAD,) + preds.shape[1:])
  garbage = rng.integers(-5, 50, (PAD,) + target.shape[1:]).astype(np.int32)
  mask = np.concatenate([np.ones(len(target), bool), np.zeros(PAD, bool)])
  return {
    "preds": np.concatenate([preds.astype(np.float32), bad]),
    "target": np.concatenate([target.astype(np.int32), garbage]),
    "mask": mask,
  }


def _binary(rng, n=3000, *, from_logits=False, grid=None):
  target = (rng.random(n) < 0.3).astype(np.int32)
  logits = rng.normal(np.where(target == 1, 1.0, -1.0), 1.5)
  scores = logits if from_logits else 1.0 / (1.0 + np.exp(-logits))
  if grid is not None:
    scores = np.round(scores * grid) / grid
  return scores.astype(np.float32), target


# --- rates at the returned thresholds -------------------------------------------------------


@pytest.mark.parametrize(
  "binning, from_logits, num_thresholds",
  [
    ("logit", False, 65_537),
    ("logit", True, 4097),
    ("linear", False, 4097),
    ("linear", True, 513),
    ("symlog", False, 4097),
    ("symlog", True, 4097),
  ],
)
def test_roc_and_pr_rates_are_those_of_score_at_least_threshold(
  binning, from_logits, num_thresholds
):
  rng = np.random.default_rng(1)
  scores, target = _binary(rng, from_logits=from_logits)
  inputs = _padded(scores, target, rng)
  config = {"binning": binning, "from_logits": from_logits}
  fpr, tpr, thresholds = M.AUROC(num_thresholds, **config).update(**inputs).curve()
  precision, recall, pr_thresholds = M.AUPRC(num_thresholds, **config).update(**inputs).curve()
  assert np.isinf(thresholds[0]) and (fpr[0], tpr[0]) == (0, 0) and (fpr[-1], tpr[-1]) == (1, 1)
  assert np.all(np.diff(thresholds) < 0) and np.all(np.diff(pr_thresholds) > 0)
  np.testing.assert_array_equal(pr_thresholds, thresholds[1:][::-1])
  assert len(thresholds) > 100  # many points: the check below is not vacuous
  positives, negatives = scores[target == 1], scores[target == 0]
  worst = 0
  for threshold, fp_rate, tp_rate in zip(thresholds[1:], fpr[1:], tpr[1:]):
    tp, fp = np.sum(positives >= threshold), np.sum(negatives >= threshold)
    # The documented bound: only scores within float32 rounding of the bin edge may differ.
    atol = 1e-5 if from_logits else 1e-7
    near = np.sum(np.isclose(scores, threshold, rtol=2e-5, atol=atol))
    off = abs(round(tp_rate * len(positives)) - tp) + abs(round(fp_rate * len(negatives)) - fp)
    assert off <= near, (threshold, off, near)
    worst = max(worst, off)
  assert worst <= 2
  # Precision and recall are the same counts, in increasing threshold order.
  tp_counts = np.round(tpr[1:][::-1] * len(positives))
  fp_counts = np.round(fpr[1:][::-1] * len(negatives))
  np.testing.assert_allclose(recall[:-1], tp_counts / len(positives), rtol=1e-12)
  np.testing.assert_allclose(precision[:-1], tp_counts / (tp_counts + fp_counts), rtol=1e-12)
  assert (precision[-1], recall[-1]) == (1.0, 0.0)


@pytest.mark.parametrize(
  "binning, grid, from_logits", [("linear", 1000, False), ("logit", 8, True)]
)
def test_curves_equal_sklearn_on_grid_scores(binning, grid, from_logits):
  # linear bins of 1001 thresholds hold the scores k / 1000; logit bins of 1025 hold k / 8.
  rng = np.random.default_rng(2)
  scores, target = _binary(rng, 2000, from_logits=from_logits, grid=grid)
  inputs = _padded(scores, target, rng)
  config = {"binning": binning, "from_logits": from_logits}
  num_thresholds = 1001 if binning == "linear" else 1025
  auroc = M.AUROC(num_thresholds, **config).update(**inputs)
  fpr, tpr, thresholds = auroc.curve()
  ref_fpr, ref_tpr, ref_thresholds = skm.roc_curve(target, scores, drop_intermediate=False)
  np.testing.assert_allclose(fpr, ref_fpr, rtol=1e-14, atol=0)
  np.testing.assert_allclose(tpr, ref_tpr, rtol=1e-14, atol=0)
  # Each threshold is its bin's lowest score: at or below sklearn's (the score itself),
  # above the next lower score.
  assert np.all(thresholds[1:] <= ref_thresholds[1:])
  assert np.all(thresholds[1:-1] > ref_thresholds[2:])
  auprc = M.AUPRC(num_thresholds, **config).update(**inputs)
  precision, recall, pr_thresholds = auprc.curve()
  ref_precision, ref_recall, ref_pr_thresholds = skm.precision_recall_curve(target, scores)
  np.testing.assert_allclose(precision, ref_precision, rtol=1e-14, atol=0)
  np.testing.assert_allclose(recall, ref_recall, rtol=1e-14, atol=0)
  assert len(pr_thresholds) == len(ref_pr_thresholds)
  assert np.all(pr_thresholds <= ref_pr_thresholds)


# --- areas --------------------------------------------------------------------------------


def _roc_area(curve):
  fpr, tpr, _ = curve
  return np.trapezoid(tpr, fpr)


def _pr_area(curve):
  precision, recall, _ = curve
  return -np.sum(np.diff(recall) * precision[:-1])


def test_area_under_returned_curve_is_compute_binary():
  rng = np.random.default_rng(3)
  scores, target = _binary(rng)
  inputs = _padded(scores, target, rng)
  auroc = M.AUROC().update(**inputs)
  auprc = M.AUPRC().update(**inputs)
  assert _roc_area(auroc.curve()) == pytest.approx(float(auroc.compute()), abs=2e-6)
  assert _pr_area(auprc.curve()) == pytest.approx(float(auprc.compute()), abs=2e-6)
  # and the binned default is close to the exact areas
  assert _roc_area(auroc.curve()) == pytest.approx(skm.roc_auc_score(target, scores), abs=1e-4)
  assert _pr_area(auprc.curve()) == pytest.approx(
    skm.average_precision_score(target, scores), abs=1e-3
  )


def _multiclass(rng, n=1500, classes=4, ignore=None):
  target = rng.integers(0, classes, n)
  if ignore is not None:
    target = np.where(rng.random(n) < 0.1, ignore, target)
  scores = np.round(rng.random((n, classes)) * 1000) / 1000  # grid scores, one-vs-rest
  return scores.astype(np.float32), target.astype(np.int32)


@pytest.mark.parametrize("kind", ["auroc", "auprc"])
def test_multiclass_curves_per_class_and_micro(kind):
  rng = np.random.default_rng(4)
  scores, target = _multiclass(rng, ignore=2)
  inputs = _padded(scores, target, rng)
  make = M.AUROC if kind == "auroc" else M.AUPRC
  area = _roc_area if kind == "auroc" else _pr_area
  config = {"task": "multiclass", "num_classes": 4, "binning": "linear", "ignore_index": 2}
  per_class = make(1001, average=None, **config).update(**inputs)
  curves = per_class.curve()
  assert sorted(curves) == [0, 1, 3]  # the ignored class id has no curve
  keep = target != 2
  truth = label_binarize(target[keep], classes=range(4))
  for c, curve in curves.items():
    if kind == "auroc":
      reference = skm.roc_curve(truth[:, c], scores[keep, c], drop_intermediate=False)[:2]
    else:
      reference = skm.precision_recall_curve(truth[:, c], scores[keep, c])[:2]
    for got, expected in zip(curve[:2], reference):
      np.testing.assert_allclose(got, expected, rtol=1e-14, atol=0)
    assert area(curve) == pytest.approx(float(per_class.compute()[c]), abs=2e-6)
    np.testing.assert_array_equal(per_class.curve(class_index=c)[0], curve[0])
  micro = make(1001, average="micro", **config).update(**inputs)
  assert area(micro.curve("micro")) == pytest.approx(float(micro.compute()), abs=2e-6)
  macro = make(1001, average="macro", **config).update(**inputs)
  assert np.mean([area(c) for c in curves.values()]) == pytest.approx(
    float(macro.compute()), abs=2e-6
  )


def test_multilabel_curve_per_label():
  rng = np.random.default_rng(5)
  target = (rng.random((800, 3)) < 0.4).astype(np.int32)
  scores = (np.round(rng.random((800, 3)) * 1000) / 1000).astype(np.float32)
  metric = M.AUROC(1001, task="multilabel", num_classes=3, binning="linear")
  curves = metric.update(**_padded(scores, target, rng)).curve()
  assert sorted(curves) == [0, 1, 2]
  for j, (fpr, tpr, _) in curves.items():
    ref_fpr, ref_tpr, _ = skm.roc_curve(target[:, j], scores[:, j], drop_intermediate=False)
    np.testing.assert_allclose(fpr, ref_fpr, rtol=1e-14, atol=0)
    np.testing.assert_allclose(tpr, ref_tpr, rtol=1e-14, atol=0)


def test_empty_and_one_class_curves():
  fpr, tpr, thresholds = M.AUROC().curve()
  assert np.isnan(fpr).all() and np.isnan(tpr).all() and np.isinf(thresholds).all()
  only_positives = M.AUROC().update(preds=np.array([0.2, 0.7], np.float32), target=np.ones(2, int))
  fpr, tpr, _ = only_positives.curve()
  assert np.isnan(fpr).all() and tpr.tolist() == [0.0, 0.5, 1.0]
  precision, recall, _ = (
    M.AUPRC().update(preds=np.array([0.2, 0.7], np.float32), target=np.zeros(2, int)).curve()
  )
  assert np.isnan(recall[:-1]).all() and precision[:-1].tolist() == [0.0, 0.0]


def test_curve_errors_name_the_argument():
  binary = M.AUROC().update(preds=np.array([0.2, 0.7], np.float32), target=np.array([0, 1]))
  with pytest.raises(ValueError, match="class_index must be None for task='binary'; got 1"):
    binary.curve(class_index=1)
  multi = M.AUPRC(task="multiclass", num_classes=3, ignore_index=1)
  for bad in (1, 3, -1, "macro", 1.0, True):
    with pytest.raises(ValueError, match=r"class_index must be a class id of \[0, 2\]"):
      multi.curve(class_index=bad)
  two = jax.tree.map(lambda *xs: np.stack(xs), binary, binary)
  with pytest.raises(ValueError, match="aggregate"):
    two.curve()
  with pytest.raises(ValueError, match="aggregate"):
    jax.tree.map(lambda *xs: np.stack(xs), M.CalibrationError(), M.CalibrationError()).bins()


def test_bin_edges_are_the_lowest_score_of_each_bin():
  edges = M.AUROC(5, binning="linear").bin_edges()
  np.testing.assert_allclose(edges, [0.0, 0.125, 0.375, 0.625, 0.875])
  logit_edges = M.AUROC(5, from_logits=True).bin_edges()
  np.testing.assert_allclose(logit_edges, [-np.inf, -48.0, -16.0, 16.0, 48.0])
  symlog_edges = M.AUROC(5, from_logits=True, binning="symlog").bin_edges()
  half = np.log1p(64.0) / 2  # bins of sign(z) log1p(|z|) centred on -2h, -h, 0, h, 2h
  z = np.array([-1.5, -0.5, 0.5, 1.5]) * half
  np.testing.assert_allclose(symlog_edges, [-np.inf, *(np.sign(z) * np.expm1(np.abs(z)))])


# --- calibration bins ---------------------------------------------------------------------


def _bins_reference(confidence, hit, n_bins):
  """numpy histograms of the confidences: (mean confidence, accuracy, count) per bin."""
  edges = np.linspace(0.0, 1.0, n_bins + 1)
  count, _ = np.histogram(confidence, edges)
  total, _ = np.histogram(confidence, edges, weights=confidence)
  hits, _ = np.histogram(confidence, edges, weights=hit.astype(np.float64))
  with np.errstate(invalid="ignore", divide="ignore"):
    return total / count, hits / count, count


def test_binary_bins_match_numpy_histogram_and_sklearn():
  rng = np.random.default_rng(6)
  scores, target = _binary(rng, 4000)
  metric = M.CalibrationError(12).update(**_padded(scores, target, rng))
  mean_confidence, accuracy, count = metric.bins()
  ref_confidence, ref_accuracy, ref_count = _bins_reference(scores.astype(np.float64), target, 12)
  np.testing.assert_array_equal(count, ref_count)
  assert count.dtype == np.int64 and count.sum() == 4000
  np.testing.assert_allclose(accuracy, ref_accuracy, rtol=1e-15, equal_nan=True)
  np.testing.assert_allclose(mean_confidence, ref_confidence, rtol=1e-6, equal_nan=True)
  prob_true, prob_pred = calibration_curve(target, scores, n_bins=12)
  filled = count > 0
  np.testing.assert_allclose(accuracy[filled], prob_true, rtol=1e-15)
  np.testing.assert_allclose(mean_confidence[filled], prob_pred, rtol=1e-6)
  share = count[filled] / count.sum()
  ece = np.sum(share * np.abs(accuracy[filled] - mean_confidence[filled]))
  assert ece == pytest.approx(float(metric.compute()), abs=1e-6)


def test_multiclass_bins_match_numpy_histogram():
  rng = np.random.default_rng(7)
  target = rng.integers(0, 5, 3000).astype(np.int32)
  logits = rng.standard_normal((3000, 5)) * 2.0
  logits[np.arange(3000), target] += 1.5
  metric = M.CalibrationError(15, task="multiclass", num_classes=5, from_logits=True)
  mean_confidence, accuracy, count = metric.update(**_padded(logits, target, rng)).bins()
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  reference = _bins_reference(probs.max(-1), probs.argmax(-1) == target, 15)
  np.testing.assert_array_equal(count, reference[2])
  np.testing.assert_allclose(accuracy, reference[1], rtol=1e-15, equal_nan=True)
  np.testing.assert_allclose(mean_confidence, reference[0], rtol=2e-6, equal_nan=True)
  assert np.isnan(mean_confidence[0]) and count[0] == 0  # confidence >= 1/5: bin 0 empty


def test_multiclass_logits_curve_rates_are_those_of_softmax_at_least_threshold():
  rng = np.random.default_rng(8)
  target = rng.integers(0, 3, 1500).astype(np.int32)
  logits = rng.standard_normal((1500, 3)) * 2.0
  logits[np.arange(1500), target] += 1.0
  metric = M.AUROC(4097, task="multiclass", num_classes=3, from_logits=True)
  curves = metric.update(**_padded(logits, target, rng)).curve()
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)  # thresholds are in softmax probability units
  for c, (fpr, tpr, thresholds) in curves.items():
    scores, truth = probs[:, c], target == c
    assert len(thresholds) > 100
    for threshold, fp_rate, tp_rate in zip(thresholds[1:], fpr[1:], tpr[1:]):
      tp, fp = np.sum(scores[truth] >= threshold), np.sum(scores[~truth] >= threshold)
      near = np.sum(np.isclose(scores, threshold, rtol=2e-5, atol=1e-7))  # float32 softmax
      off = abs(round(tp_rate * truth.sum()) - tp) + abs(round(fp_rate * (~truth).sum()) - fp)
      assert off <= near, (c, threshold, off, near)
