"""pe.plot: the drawn data equal the exact states; PNGs with Agg; matplotlib loaded lazily.

Every figure is a ``matplotlib.figure.Figure`` (Agg when saved, no GUI). The drawn data are
read back from the Axes (image array, line data, bar heights) and compared with float64
numpy / scikit-learn references on the real rows; padded rows hold NaN and garbage.
"""

from __future__ import annotations

import subprocess
import sys

import matplotlib
import numpy as np
import pytest
import sklearn.metrics as skm
from matplotlib.figure import Figure

import padded_eval as pe

M = pe.metrics
PAD = 32


def _axes():
  return Figure(figsize=(5, 4)).subplots()


def _padded(preds, target, rng):
  bad = rng.choice(np.array([np.nan, np.inf, 9.0], np.float32), (PAD,) + preds.shape[1:])
  garbage = rng.integers(-3, 40, (PAD,) + target.shape[1:]).astype(np.int32)
  return {
    "preds": np.concatenate([preds.astype(np.float32), bad]),
    "target": np.concatenate([target.astype(np.int32), garbage]),
    "mask": np.arange(len(target) + PAD) < len(target),
  }


def _multiclass(rng, n=600, classes=4):
  target = rng.integers(0, classes, n)
  logits = rng.standard_normal((n, classes)) * 1.5
  logits[np.arange(n), target] += 2.0
  return logits.astype(np.float32), target.astype(np.int32)


def _saves_png(ax, path):
  ax.figure.savefig(path)
  image = matplotlib.image.imread(path)
  assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_importing_padded_eval_does_not_import_matplotlib():
  code = (
    "import sys, padded_eval as pe; assert callable(pe.plot.roc_curve); "
    "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))"
  )
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.strip() == "[]"


# --- confusion matrix -------------------------------------------------------------------


@pytest.mark.parametrize("normalize", [None, "true", "pred", "all"])
def test_confusion_matrix_image_is_the_counts(normalize, tmp_path):
  rng = np.random.default_rng(0)
  logits, target = _multiclass(rng)
  metric = M.ConfusionMatrix(4).update(**_padded(logits, target, rng))
  ax = pe.plot.confusion_matrix(metric, labels=list("abcd"), normalize=normalize, ax=_axes())
  drawn = np.asarray(ax.images[0].get_array())
  expected = skm.confusion_matrix(target, logits.argmax(-1), normalize=normalize)
  np.testing.assert_allclose(drawn, expected, rtol=1e-15)
  assert [t.get_text() for t in ax.get_xticklabels()] == list("abcd")
  assert ax.get_xlabel() == "predicted class" and ax.get_ylabel() == "true class"
  assert len(ax.texts) == 16  # one value per cell
  accuracy = np.mean(logits.argmax(-1) == target)
  assert f"accuracy = {accuracy:.4f}" in ax.get_title()
  _saves_png(ax, tmp_path / "confusion.png")


def test_confusion_matrix_many_classes_has_no_cell_text_and_few_ticks():
  rng = np.random.default_rng(1)
  target = rng.integers(0, 100, 3000).astype(np.int32)
  preds = np.where(rng.random(3000) < 0.6, target, rng.integers(0, 100, 3000)).astype(np.int32)
  metric = M.ConfusionMatrix(100).update(preds=preds, target=target)
  ax = pe.plot.confusion_matrix(metric, ax=_axes())
  np.testing.assert_array_equal(ax.images[0].get_array(), skm.confusion_matrix(target, preds))
  assert len(ax.texts) == 0 and len(ax.get_xticks()) <= pe.plot.MAX_TICKS


def test_confusion_matrix_binary_multilabel_and_result_array():
  rng = np.random.default_rng(2)
  target = (rng.random((300, 3)) < 0.5).astype(np.int32)
  scores = rng.random((300, 3)).astype(np.float32)
  multilabel = M.ConfusionMatrix(3, task="multilabel").update(preds=scores, target=target)
  ax = pe.plot.confusion_matrix(multilabel, class_index=1, ax=_axes())
  expected = skm.confusion_matrix(target[:, 1], scores[:, 1] > 0.5)
  np.testing.assert_array_equal(ax.images[0].get_array(), expected)
  binary = M.ConfusionMatrix(task="binary").update(preds=scores[:, 0], target=target[:, 0])
  ax = pe.plot.confusion_matrix(binary, ax=_axes())
  np.testing.assert_array_equal(ax.images[0].get_array(), binary.counts())
  # a masked_eval result holds the computed [C, C] matrix: it can be drawn too
  ax = pe.plot.confusion_matrix(np.asarray(binary.compute()), normalize="true", ax=_axes())
  np.testing.assert_allclose(
    ax.images[0].get_array(),
    skm.confusion_matrix(target[:, 0], scores[:, 0] > 0.5, normalize="true"),
  )


def test_confusion_matrix_errors_name_the_argument():
  metric = M.ConfusionMatrix(3)
  with pytest.raises(ValueError, match="normalize"):
    pe.plot.confusion_matrix(metric, normalize="rows", ax=_axes())
  with pytest.raises(ValueError, match="labels has 2 entries; expected 3"):
    pe.plot.confusion_matrix(metric, labels=["a", "b"], ax=_axes())
  with pytest.raises(
    ValueError, match="m must be a padded_eval.metrics.ConfusionMatrix.*; got AUROC"
  ):
    pe.plot.confusion_matrix(M.AUROC(), ax=_axes())
  with pytest.raises(ValueError, match="class_index must be a label id"):
    pe.plot.confusion_matrix(M.ConfusionMatrix(3, task="multilabel"), ax=_axes())


# --- curves -------------------------------------------------------------------------------


def _lines(ax):
  return {line.get_label(): line for line in ax.get_lines()}


def test_roc_curve_lines_are_the_curves(tmp_path):
  rng = np.random.default_rng(3)
  target = (rng.random(800) < 0.3).astype(np.int32)
  scores = np.round(rng.random(800) * 1000) / 1000 * (0.5 + target) / 1.5
  scores = scores.astype(np.float32)
  metric = M.AUROC(binning="linear").update(**_padded(scores, target, rng))
  ax = pe.plot.roc_curve(metric, ax=_axes())
  lines = _lines(ax)
  area = skm.roc_auc_score(target, scores)
  (label,) = [k for k in lines if k != "chance"]
  assert label == f"area = {area:.4f}"
  fpr, tpr, _ = skm.roc_curve(target, scores, drop_intermediate=False)
  np.testing.assert_allclose(lines[label].get_xdata(), fpr, atol=1e-12)
  np.testing.assert_allclose(lines[label].get_ydata(), tpr, atol=1e-12)
  np.testing.assert_array_equal(lines["chance"].get_xydata(), [[0, 0], [1, 1]])
  assert ax.get_xlabel() == "false positive rate" and ax.get_ylabel() == "true positive rate"
  assert ax.get_title() == f"AUROC = {float(metric.compute()):.4f}"
  _saves_png(ax, tmp_path / "roc.png")


@pytest.mark.parametrize("kind", ["roc", "pr"])
def test_multiclass_curves_one_line_per_class(kind):
  rng = np.random.default_rng(4)
  logits, target = _multiclass(rng)
  config = {"task": "multiclass", "num_classes": 4, "from_logits": True}
  make = M.AUROC if kind == "roc" else M.AUPRC
  inputs = _padded(logits, target, rng)
  metric = make(**config).update(**inputs)
  areas = np.asarray(make(average=None, **config).update(**inputs).compute())
  draw = pe.plot.roc_curve if kind == "roc" else pe.plot.pr_curve
  ax = draw(metric, ax=_axes())
  lines = _lines(ax)
  curves = metric.curve()
  assert sorted(k for k in lines if k.startswith("class")) == [
    f"class {c} (area = {a:.4f})" for c, a in enumerate(areas)
  ]
  for c, curve in curves.items():
    (line,) = [v for k, v in lines.items() if k.startswith(f"class {c} ")]
    x, y = (curve[0], curve[1]) if kind == "roc" else (curve[1], curve[0])
    np.testing.assert_array_equal(line.get_xdata(), x)
    np.testing.assert_array_equal(line.get_ydata(), y)
    if kind == "pr":
      assert line.get_drawstyle() == "steps-post"
  one = draw(metric, ax=_axes(), class_index=2)
  assert len([k for k in _lines(one) if k != "chance"]) == 1
  assert f"= {float(metric.compute()):.4f}" in ax.get_title()


def test_pr_curve_matches_sklearn_on_grid_scores(tmp_path):
  rng = np.random.default_rng(5)
  target = (rng.random(700) < 0.4).astype(np.int32)
  scores = (np.round(rng.random(700) * 1000) / 1000).astype(np.float32)
  metric = M.AUPRC(1001, binning="linear").update(**_padded(scores, target, rng))
  ax = pe.plot.pr_curve(metric, ax=_axes())
  (line,) = ax.get_lines()
  precision, recall, _ = skm.precision_recall_curve(target, scores)
  np.testing.assert_allclose(line.get_xdata(), recall, atol=1e-12)
  np.testing.assert_allclose(line.get_ydata(), precision, atol=1e-12)
  assert line.get_label() == f"area = {skm.average_precision_score(target, scores):.4f}"
  assert ax.get_xlabel() == "recall" and ax.get_ylabel() == "precision"
  _saves_png(ax, tmp_path / "pr.png")


# --- reliability --------------------------------------------------------------------------


def test_reliability_diagram_bars_are_the_bins(tmp_path):
  rng = np.random.default_rng(6)
  logits, target = _multiclass(rng, 1000)
  metric = M.CalibrationError(10, task="multiclass", num_classes=4, from_logits=True)
  metric = metric.update(**_padded(logits, target, rng))
  ax = pe.plot.reliability_diagram(metric, ax=_axes())
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  confidence, hit = probs.max(-1), probs.argmax(-1) == target
  count, _ = np.histogram(confidence, np.linspace(0, 1, 11))
  hits, _ = np.histogram(confidence, np.linspace(0, 1, 11), weights=hit.astype(np.float64))
  filled = count > 0
  bars = ax.patches
  assert len(bars) == filled.sum()
  np.testing.assert_allclose([b.get_x() for b in bars], np.arange(10)[filled] / 10, atol=1e-12)
  np.testing.assert_allclose([b.get_height() for b in bars], hits[filled] / count[filled])
  np.testing.assert_allclose([b.get_width() for b in bars], 0.1)
  lines = _lines(ax)
  mean_confidence, accuracy, _ = metric.bins()
  np.testing.assert_array_equal(
    lines["accuracy at each bin's mean confidence"].get_xdata(), mean_confidence[filled]
  )
  np.testing.assert_array_equal(
    lines["accuracy at each bin's mean confidence"].get_ydata(), accuracy[filled]
  )
  legend = [t.get_text() for t in ax.get_legend().get_texts()]
  assert f"accuracy per bin (ECE = {float(metric.compute()):.4f})" in legend
  assert ax.get_xlabel().startswith("confidence") and ax.get_ylabel() == "accuracy"
  _saves_png(ax, tmp_path / "reliability.png")


@pytest.mark.parametrize(
  "draw, metric, expected",
  [
    ("roc_curve", M.AUPRC(), "AUROC"),
    ("pr_curve", M.AUROC(), "AUPRC"),
    ("reliability_diagram", M.AUROC(), "CalibrationError"),
    ("roc_curve", {"auroc": 0.9, "num_examples": 10}, "AUROC"),
  ],
)
def test_wrong_metric_type_is_a_value_error(draw, metric, expected):
  with pytest.raises(ValueError, match=f"m must be a padded_eval.metrics.{expected}, a collection"):
    getattr(pe.plot, draw)(metric, ax=_axes())


def test_class_choice_errors_and_pyplot_default():
  metric = M.AUROC(task="multiclass", num_classes=3)
  with pytest.raises(ValueError, match="class_index must be a class id"):
    pe.plot.roc_curve(metric, ax=_axes(), class_index=5)
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  ax = pe.plot.reliability_diagram(M.CalibrationError())  # ax=None: a new pyplot figure
  assert ax.figure in [plt.figure(n) for n in plt.get_fignums()]
  plt.close(ax.figure)


# --- masked_eval results ------------------------------------------------------------------


def _garbage_padding(batches, rng):
  """The padded batches with NaN / huge / out-of-range values in every padded row."""
  for batch in batches:
    batch = dict(batch)
    pad = ~batch["mask"]
    preds = batch["preds"].copy()
    preds[pad] = rng.choice(np.array([np.nan, np.inf, 3e38], np.float32), preds[pad].shape)
    target = batch["target"].copy()
    target[pad] = rng.integers(-5, 50, target[pad].shape)
    batch.update(preds=preds, target=target)
    yield batch


def _evaluate(metrics, preds, target, backend, rng):
  def step(params, batch):
    del params
    return metrics.batch_updates(preds=batch["preds"], target=batch["target"], mask=batch["mask"])

  batches = pe.pad_batches({"preds": preds, "target": target}, 64)  # 1003 rows: 16 batches
  return pe.masked_eval(step, None, list(_garbage_padding(batches, rng)), backend=backend)


@pytest.mark.parametrize("backend", ["jit", "pmap"])
def test_masked_eval_result_draws_curves_and_confusion(backend, tmp_path):
  rng = np.random.default_rng(7)
  target = (rng.random(1003) < 0.35).astype(np.int32)
  scores = np.clip(rng.normal(0.4 + 0.2 * target, 0.2), 0, 1)
  scores = (np.round(scores * 1000) / 1000).astype(np.float32)  # on the bins' grid: exact
  metrics = pe.Metrics(
    {
      "auroc": M.AUROC(1001, binning="linear"),
      "auprc": M.AUPRC(1001, binning="linear"),
      "cm": M.ConfusionMatrix(task="binary"),
    }
  )
  results = _evaluate(metrics, scores, target, backend, rng)
  assert results["num_examples"] == 1003 and isinstance(results, dict)
  assert results["auroc"] == pytest.approx(skm.roc_auc_score(target, scores), abs=1e-6)
  roc = pe.plot.roc_curve(results, ax=_axes())
  (label,) = [k for k in _lines(roc) if k != "chance"]
  fpr, tpr, _ = skm.roc_curve(target, scores, drop_intermediate=False)
  np.testing.assert_allclose(_lines(roc)[label].get_xdata(), fpr, atol=1e-12)
  np.testing.assert_allclose(_lines(roc)[label].get_ydata(), tpr, atol=1e-12)
  pr = pe.plot.pr_curve(results, ax=_axes())
  precision, recall, _ = skm.precision_recall_curve(target, scores)
  np.testing.assert_allclose(pr.get_lines()[0].get_xdata(), recall, atol=1e-12)
  np.testing.assert_allclose(pr.get_lines()[0].get_ydata(), precision, atol=1e-12)
  cm = pe.plot.confusion_matrix(results, ax=_axes())
  np.testing.assert_array_equal(
    cm.images[0].get_array(), skm.confusion_matrix(target, scores > 0.5)
  )
  _saves_png(roc, tmp_path / "roc.png")


def test_masked_eval_result_draws_reliability_and_picks_by_name():
  rng = np.random.default_rng(8)
  logits, target = _multiclass(rng, 1003)
  config = {"task": "multiclass", "num_classes": 4, "from_logits": True}
  metrics = pe.Metrics(
    {
      "ece": M.CalibrationError(10, **config),
      "cm": M.ConfusionMatrix(4),
      "cm_true": M.ConfusionMatrix(4, normalize="true"),
    }
  )
  results = _evaluate(metrics, logits, target, "shard_map", rng)
  ax = pe.plot.reliability_diagram(results, ax=_axes())
  probs = np.exp(logits.astype(np.float64) - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  count, _ = np.histogram(probs.max(-1), np.linspace(0, 1, 11))
  hit = (probs.argmax(-1) == target).astype(np.float64)
  hits, _ = np.histogram(probs.max(-1), np.linspace(0, 1, 11), weights=hit)
  filled = count > 0
  np.testing.assert_allclose([b.get_height() for b in ax.patches], hits[filled] / count[filled])
  with pytest.raises(ValueError, match=r"holds 2 ConfusionMatrix metrics \['cm', 'cm_true'\]"):
    pe.plot.confusion_matrix(results, ax=_axes())
  ax = pe.plot.confusion_matrix(results, name="cm", ax=_axes())
  np.testing.assert_array_equal(
    ax.images[0].get_array(), skm.confusion_matrix(target, logits.argmax(-1))
  )


def test_results_pickle_with_their_metric_and_values_alone_cannot_be_drawn(tmp_path):
  import pickle

  rng = np.random.default_rng(9)
  logits, target = _multiclass(rng, 203)
  results = _evaluate(pe.Metrics([M.ConfusionMatrix(4)]), logits, target, "jit", rng)
  again = pickle.loads(pickle.dumps(results))
  assert again.keys() == results.keys() and isinstance(again.metric, pe.Metrics)
  np.testing.assert_array_equal(again["confusionmatrix"], results["confusionmatrix"])
  counts = again.metric.children["confusionmatrix"].counts()
  np.testing.assert_array_equal(counts, skm.confusion_matrix(target, logits.argmax(-1)))
  values = pe.results.EvalResults(dict(results))  # no metric (a finished checkpoint_dir has it)
  with pytest.raises(ValueError, match="values alone"):
    pe.plot.confusion_matrix(values, ax=_axes())
