"""Every pe.plot function's PNG: its title, axis labels, units and legend text, read from the
matplotlib objects of a figure that was saved with Agg, with the values in them against
float64 numpy / scikit-learn on the real rows (padded rows hold NaN and garbage); and the
reliability diagram's legend covers nothing it draws (issue 28)."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
import sklearn.metrics as skm
from matplotlib.figure import Figure

import padded_eval as pe

M = pe.metrics
N, PAD, CLASSES = 611, 29, 4  # 611 real rows, 29 padded


def _saved(ax, tmp_path, name):
  """Saves the figure as a PNG (which also draws it) and checks the file is an image."""
  path = tmp_path / f"{name}.png"
  ax.figure.savefig(path)
  image = matplotlib.image.imread(path)
  assert image.ndim == 3 and min(image.shape[:2]) > 100
  return ax


def _axes():
  return Figure(figsize=(5.5, 4.5), layout="constrained").subplots()


def _legend(ax):
  return [text.get_text() for text in ax.get_legend().get_texts()]


def _shown(text, prefix, want, bound):
  """``text`` is ``prefix`` and a 4-decimal value within ``bound`` (+ rounding) of ``want``."""
  assert text.startswith(prefix), (text, prefix)
  value = float(text[len(prefix) :].rstrip(")"))
  assert abs(value - want) <= float(bound) + 5e-5, (text, want, bound)


def _padded(preds, target, rng):
  bad = rng.choice(np.array([np.nan, np.inf, 9.0], np.float32), (PAD,) + preds.shape[1:])
  return {
    "preds": np.concatenate([preds.astype(np.float32), bad]),
    "target": np.concatenate([target, rng.integers(-3, 40, PAD)]).astype(np.int32),
    "mask": np.arange(len(target) + PAD) < len(target),
  }


@pytest.fixture(scope="module")
def binary():
  rng = np.random.default_rng(3)
  target = rng.integers(0, 2, N).astype(np.int32)
  scores = (rng.random(N) * 0.6 + 0.4 * target).astype(np.float32)
  return scores, target, _padded(scores, target, rng)


@pytest.fixture(scope="module")
def multiclass():
  rng = np.random.default_rng(4)
  target = rng.integers(0, CLASSES, N).astype(np.int32)
  logits = rng.standard_normal((N, CLASSES)).astype(np.float32) * 1.5
  logits[np.arange(N), target] += 2.0
  return logits, target, _padded(logits, target, rng)


@pytest.mark.parametrize("normalize", [None, "true", "pred", "all"])
def test_confusion_matrix_title_axes_and_colorbar_unit(normalize, multiclass, tmp_path):
  logits, target, batch = multiclass
  metric = M.ConfusionMatrix(num_classes=CLASSES).update(**batch)
  ax = _saved(pe.plot.confusion_matrix(metric, normalize=normalize, ax=_axes()), tmp_path, "cm")
  accuracy = skm.accuracy_score(target, logits.argmax(-1))
  title = ax.get_title().split("\n")
  assert title[0] == "confusion matrix" + (f" (normalize={normalize!r})" if normalize else "")
  assert title[1] == f"accuracy = {accuracy:.4f} over {N} examples"
  assert (ax.get_xlabel(), ax.get_ylabel()) == ("predicted class", "true class")
  colorbar = ax.images[0].colorbar
  unit = {
    None: "examples",
    "true": "fraction of the true class",
    "pred": "fraction of the predicted class",
    "all": "fraction of all examples",
  }
  assert colorbar.ax.get_ylabel() == unit[normalize]
  want = skm.confusion_matrix(target, logits.argmax(-1), normalize=normalize)
  np.testing.assert_allclose(ax.images[0].get_array(), want, rtol=1e-12)


def test_roc_curve_title_axes_and_legend(binary, multiclass, tmp_path):
  scores, target, batch = binary
  metric = M.AUROC().update(**batch)
  ax = _saved(pe.plot.roc_curve(metric, ax=_axes()), tmp_path, "roc")
  area, bound = skm.roc_auc_score(target, scores), metric.error_bound()  # binned: within the bound
  _shown(ax.get_title(), "AUROC = ", area, bound)
  assert (ax.get_xlabel(), ax.get_ylabel()) == ("false positive rate", "true positive rate")
  legend = _legend(ax)
  _shown(legend[0], "area = ", area, bound)
  assert legend[1:] == ["chance"]
  logits, target, batch = multiclass
  metric = M.AUROC(task="multiclass", num_classes=CLASSES).update(**batch)
  ax = _saved(pe.plot.roc_curve(metric, ax=_axes()), tmp_path, "roc_multiclass")
  areas = [skm.roc_auc_score(target == c, logits[:, c]) for c in range(CLASSES)]
  bound = np.max(metric.error_bound())
  legend = _legend(ax)
  for c, a in enumerate(areas):
    _shown(legend[c], f"class {c} (area = ", a, bound)
  assert legend[CLASSES:] == ["chance"]
  _shown(ax.get_title(), "AUROC, macro = ", np.mean(areas), bound)


def test_pr_curve_title_axes_and_legend(binary, tmp_path):
  scores, target, batch = binary
  metric = M.AUPRC().update(**batch)
  ax = _saved(pe.plot.pr_curve(metric, ax=_axes()), tmp_path, "pr")
  area, bound = skm.average_precision_score(target, scores), metric.error_bound()
  _shown(ax.get_title(), "AUPRC = ", area, bound)
  assert (ax.get_xlabel(), ax.get_ylabel()) == ("recall", "precision")
  (legend,) = _legend(ax)
  _shown(legend, "area = ", area, bound)


def _reference_ece(confidence, hit, bins=10):
  count, edges = np.histogram(confidence, np.linspace(0, 1, bins + 1))
  index = np.clip(np.digitize(confidence, edges[1:-1]), 0, bins - 1)
  gaps = [
    abs(hit[index == b].mean() - confidence[index == b].mean()) for b in range(bins) if count[b]
  ]
  return float(np.dot(gaps, count[count > 0]) / len(confidence))


@pytest.mark.parametrize("task", ["binary", "multiclass", "underconfident"])
def test_reliability_diagram_labels_and_a_legend_that_covers_nothing(
  task, binary, multiclass, tmp_path
):
  if task == "multiclass":
    logits, target, batch = multiclass
    metric = M.CalibrationError(10, task="multiclass", num_classes=CLASSES, from_logits=True)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    confidence, hit = probs.max(-1), probs.argmax(-1) == target
    height, x_label, position = "accuracy", "confidence (top class probability)", "mean confidence"
  else:
    if task == "binary":
      confidence, target, batch = binary
    else:  # every row near 0.55 and 95% positive: one tall bar, the upper left is full
      rng = np.random.default_rng(5)
      confidence = (0.5 + 0.1 * rng.random(N)).astype(np.float32)
      target = (rng.random(N) < 0.95).astype(np.int32)
      batch = _padded(confidence, target, rng)
    metric, hit = M.CalibrationError(10), target.astype(np.float64)
    height, x_label = "fraction of positives", "predicted probability"
    position = "mean predicted probability"
  metric = metric.update(**batch)
  ax = _saved(pe.plot.reliability_diagram(metric, ax=_axes()), tmp_path, f"reliability_{task}")
  ece = _reference_ece(confidence.astype(np.float64), hit.astype(np.float64))
  assert _legend(ax) == [
    f"{height} at each bin's {position}",  # the line: (mean confidence, accuracy) per bin
    "perfect calibration",
    f"{height} per bin (ECE = {ece:.4f})",
  ]
  assert (ax.get_xlabel(), ax.get_ylabel()) == (x_label, height)
  assert ax.get_title() == f"reliability diagram, {N} examples (count per bar)"
  assert max(ax.get_yticks()) == 1.0  # the band above 1 holds the legend, not a scale
  # the legend's box, in pixels, holds no bar top, no point of a line, no count text
  box = ax.get_legend().get_window_extent()
  to_pixels = ax.transData.transform
  drawn = [to_pixels(np.column_stack(line.get_data())) for line in ax.lines]
  drawn += [to_pixels([(b.get_x(), b.get_height()), (b.get_x() + b.get_width(), b.get_height())])
            for b in ax.patches]  # fmt: skip
  for points in drawn:
    assert not any(box.contains(x, y) for x, y in points), (task, box, points)
  for text in ax.texts:
    assert not box.overlaps(text.get_window_extent())
