"""LogAUC (issue 31) against a float64 numpy transcription of torchmetrics 1.9's
``_binary_logauc_compute`` on scikit-learn's ROC curve (``roc_curve(drop_intermediate=False)``,
torchmetrics' ``thresholds=None`` curve) and on torchmetrics' binned curve (``thresholds=``),
on garbage-padded uneven batches and 8 devices."""

from __future__ import annotations

import numpy as np
import pytest
import sklearn.metrics as skm
from metric_cases import MetricCase, padded_batches, real
from metric_checks import (
  check_eager,
  check_jit_traces_once,
  check_masked_eval_on_8_devices,
  check_pmap,
)

import padded_eval as pe

M = pe.metrics
C = 3
CAPACITY = 48
THRESHOLDS = np.linspace(0, 1, 11)


def _torchmetrics_logauc(fpr, tpr, fpr_range):
  """torchmetrics' _binary_logauc_compute (float64): interpolated end points, sorted, then the
  trapezoid over log10(fpr) between them, over the width in decades."""
  fpr_range = np.asarray(fpr_range, np.float64)
  if fpr.size < 2:
    return 0.0
  tpr = np.sort(np.concatenate([tpr, np.interp(fpr_range, fpr, tpr)]))
  fpr = np.sort(np.concatenate([fpr, fpr_range]))
  with np.errstate(divide="ignore"):
    log_fpr, bounds = np.log10(fpr), np.log10(fpr_range)
  lo = np.where(log_fpr == bounds[0])[0][-1]
  hi = np.where(log_fpr == bounds[1])[0][-1]
  return np.trapezoid(tpr[lo : hi + 1], log_fpr[lo : hi + 1]) / (bounds[1] - bounds[0])


def _roc(truth, scores, thresholds):
  if thresholds is None:
    fpr, tpr, _ = skm.roc_curve(truth, scores, drop_intermediate=False)
    return fpr, tpr
  scores = scores.astype(np.float32)
  t = thresholds.astype(np.float32)[::-1]  # torchmetrics flips: fpr ascending
  above = scores[None, :] >= t[:, None]
  tp, fp = np.sum(above & (truth == 1), 1), np.sum(above & (truth == 0), 1)
  return fp / np.sum(truth == 0), tp / np.sum(truth == 1)


def _data(task):
  def fields(rng, b):
    if task == "binary":
      target = rng.integers(0, 2, b)
      preds = 1 / (1 + np.exp(-(1.5 * target - 0.75 + rng.standard_normal(b))))
    elif task == "multilabel":
      target = (rng.random((b, C)) < 0.5).astype(np.int64)
      preds = 1 / (1 + np.exp(-(1.5 * target - 0.75 + rng.standard_normal((b, C)))))
    else:
      target = rng.integers(0, C, b)
      logits = 2.0 * np.eye(C)[target] + rng.standard_normal((b, C))
      preds = np.exp(logits) / np.sum(np.exp(logits), -1, keepdims=True)
    return {"preds": preds.astype(np.float32), "target": target.astype(np.int32)}

  return lambda rng: padded_batches(rng, fields, batch_size=16)


def _reference(task, average, thresholds, fpr_range):
  def reference(bs):
    target, scores = real(bs, "target"), real(bs, "preds")
    if task == "binary":
      return _torchmetrics_logauc(*_roc(target, scores, thresholds), fpr_range)
    truth = target if task == "multilabel" else np.eye(C, dtype=np.int64)[target]
    per_class = np.array(
      [
        _torchmetrics_logauc(*_roc(truth[:, c], scores[:, c], thresholds), fpr_range)
        for c in range(C)
      ]
    )
    return per_class if average is None else np.mean(per_class)

  return reference


def _case(task, average="macro", thresholds=None, fpr_range=(0.001, 0.1)):
  num_classes = None if task == "binary" else C
  exact = thresholds is None
  return MetricCase(
    f"logauc_{task}_{average}_{'exact' if exact else 'thresholds'}_{fpr_range[0]}",
    lambda: M.LogAUC(
      task=task,
      num_classes=num_classes,
      average=average,
      fpr_range=fpr_range,
      exact=exact,
      capacity=CAPACITY if exact else None,
      thresholds=None if exact else THRESHOLDS.tolist(),
    ),
    _data(task),
    _reference(task, average, thresholds, fpr_range),
  )


CASES = [
  _case(task, average, thresholds, fpr_range)
  for task, average in (
    ("binary", "macro"),
    ("multiclass", None),
    ("multiclass", "macro"),
    ("multilabel", None),
  )
  for thresholds in (None, THRESHOLDS)
  for fpr_range in ((0.001, 0.1), (0.05, 0.7))
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_torchmetrics_definition(case):
  check_eager(case)


@pytest.mark.parametrize(
  "name", ["logauc_multiclass_macro_exact_0.05", "logauc_binary_macro_thresholds_0.001"]
)
def test_device_checks(name):
  case = next(c for c in CASES if c.name == name)
  check_pmap(case)
  check_jit_traces_once(case)


@pytest.mark.parametrize("case", CASES[::3], ids=lambda c: c.name)
def test_through_masked_eval_on_8_devices(case):
  check_masked_eval_on_8_devices(case, atol=1e-6)


def test_perfect_ranking_is_one_and_no_negatives_is_nan():
  probs, labels = np.array([0.1, 0.2, 0.8, 0.9]), np.array([0, 0, 1, 1])
  m = M.LogAUC(exact=True, capacity=4).update(preds=probs, target=labels)
  np.testing.assert_allclose(float(m.compute()), 1.0, rtol=1e-6)
  m = M.LogAUC(exact=True, capacity=4).update(preds=probs, target=np.ones(4, np.int32))
  assert np.isnan(float(m.compute()))


@pytest.mark.parametrize("bad", [(0.0, 0.1), (0.2, 0.1), (0.1, 1.5), (0.1,), "0.1", (True, 0.5)])
def test_bad_fpr_range_names_the_argument(bad):
  with pytest.raises(ValueError, match="fpr_range"):
    M.LogAUC(fpr_range=bad)
