"""``AUROC(exact=True)`` / ``AUPRC(exact=True)`` against scikit-learn (issue 26).

The binned default is within ``error_bound()`` of the exact value, not within a fixed
1e-3: on scores 0.5 and 0.5001 with target [0, 1] it gives 0.5, scikit-learn 1.0, and its
bound covers the gap; the exact mode gives 1.0. The exact mode keeps every counted score
(``capacity`` per column) and is checked through ``masked_eval`` on every backend (one
trace), on 203 rows (batch 32, 8 devices) with ties, near-ties and garbage in padded rows.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import sklearn.metrics as skm

import padded_eval as pe

M = pe.metrics
N, BATCH = 203, 32
CAPACITY = 7 * BATCH  # len(batches) * batch_size


@pytest.mark.parametrize("kind", ["AUROC", "AUPRC"])
def test_close_scores_binned_within_bound_exact_equals_sklearn(kind):
  preds, target = np.array([0.5, 0.5001], np.float32), np.array([0, 1])
  expected = 1.0  # sklearn: roc_auc_score and average_precision_score
  assert skm.roc_auc_score(target, preds) == skm.average_precision_score(target, preds) == 1.0
  binned = getattr(M, kind)().update(preds=preds, target=target)
  assert float(binned.compute()) == pytest.approx(0.5)
  assert abs(float(binned.compute()) - expected) <= float(binned.error_bound())
  exact = getattr(M, kind)(exact=True, capacity=2).update(preds=preds, target=target)
  assert float(exact.compute()) == expected
  assert float(exact.error_bound()) == 0.0


def _data(seed=0, n=N):
  """Scores with many exact ties (2 decimals), near-ties 1e-7 apart and +-0.0."""
  rng = np.random.default_rng(seed)
  scores = np.round(rng.random(n), 2).astype(np.float32)
  scores[:20] = np.float32(0.3) + np.float32(1e-7) * (np.arange(20) % 3)
  scores[20:24] = [0.0, -0.0, 0.0, -0.0]
  target = (rng.random(n) < 0.4).astype(np.int32)
  return scores, target


TRACES = []


def _step(params, batch):
  del params
  TRACES.append(1)
  return pe.Metrics(
    {
      "auroc": M.AUROC(exact=True, capacity=CAPACITY),
      "ap": M.AUPRC(exact=True, capacity=CAPACITY),
    }
  ).batch_updates(preds=batch["s"], target=batch["y"], mask=batch["mask"])


def test_exact_through_masked_eval_matches_sklearn(backend):
  scores, target = _data()
  batches = pe.pad_batches({"s": scores, "y": target}, BATCH, pad_value={"s": np.nan, "y": 7})
  assert len(batches) * BATCH == CAPACITY
  TRACES.clear()
  results = pe.masked_eval(_step, None, batches, backend=backend)
  assert len(TRACES) <= 2  # the state's shape (eval_shape) and the step: one trace each
  scores64 = scores.astype(np.float64)
  assert abs(results["auroc"] - skm.roc_auc_score(target, scores64)) < 1e-6
  assert abs(results["ap"] - skm.average_precision_score(target, scores64)) < 1e-6
  assert results["num_examples"] == N


@pytest.mark.parametrize("average", ["macro", "weighted", "micro", None])
@pytest.mark.parametrize("task", ["multiclass", "multilabel"])
def test_exact_averages_match_sklearn(task, average):
  rng = np.random.default_rng(3)
  c = 4
  if task == "multiclass":
    target = rng.integers(0, c, N).astype(np.int32)
    logits = np.round(rng.standard_normal((N, c)), 1).astype(np.float32)
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    preds, truth = probs.astype(np.float32), np.eye(c, dtype=np.int32)[target]
  else:
    target = (rng.random((N, c)) < 0.3).astype(np.int32)
    preds, truth = np.round(rng.random((N, c)), 2).astype(np.float32), target
  config = dict(task=task, num_classes=c, average=average, exact=True, capacity=CAPACITY)

  def step(params, batch):
    del params
    metrics = pe.Metrics({"auroc": M.AUROC(**config), "ap": M.AUPRC(**config)})
    return metrics.batch_updates(preds=batch["p"], target=batch["y"], mask=batch["mask"])

  batches = pe.pad_batches({"p": preds, "y": target}, BATCH, pad_value={"p": np.nan, "y": -3})
  results = pe.masked_eval(step, None, batches, backend="jit")
  scores = preds.astype(np.float64)
  np.testing.assert_allclose(
    results["auroc"], skm.roc_auc_score(truth, scores, average=average), atol=1e-6
  )
  np.testing.assert_allclose(
    results["ap"], skm.average_precision_score(truth, scores, average=average), atol=1e-6
  )


def test_exact_ogb_average_precision():
  """OGB's mean AP over tasks with a positive and a negative label, NaN labels missing."""
  rng = np.random.default_rng(5)
  c = 5
  labels = (rng.random((N, c)) < 0.1).astype(np.float32)
  labels[rng.random((N, c)) < 0.4] = np.nan
  labels[:, 4] = np.where(np.isnan(labels[:, 4]), np.nan, 0.0)  # a task without positives
  scores = np.round(rng.standard_normal((N, c)), 1).astype(np.float32)
  metric = M.AUPRC(
    task="multilabel", num_classes=c, average="ogb", from_logits=True, exact=True, capacity=N
  )
  got = float(metric.update(preds=scores, target=labels).compute())
  aps = []
  for j in range(c):
    known = ~np.isnan(labels[:, j])
    y = labels[known, j]
    if y.sum() > 0 and (y == 0).sum() > 0:
      aps.append(skm.average_precision_score(y, scores[known, j].astype(np.float64)))
  assert len(aps) == 4
  assert abs(got - np.mean(aps)) < 1e-6


def test_exact_curves_match_sklearn():
  scores, target = _data(seed=2)
  metric = M.AUROC(exact=True, capacity=N).update(preds=scores, target=target)
  fpr, tpr, thresholds = metric.curve()
  ref_fpr, ref_tpr, ref_thr = skm.roc_curve(target, scores, drop_intermediate=False)
  np.testing.assert_allclose(fpr, ref_fpr, atol=1e-12)
  np.testing.assert_allclose(tpr, ref_tpr, atol=1e-12)
  np.testing.assert_array_equal(thresholds[1:], ref_thr[1:])
  precision, recall, thr = (
    M.AUPRC(exact=True, capacity=N).update(preds=scores, target=target).curve()
  )
  ref_p, ref_r, ref_t = skm.precision_recall_curve(target, scores)
  np.testing.assert_allclose(precision, ref_p, atol=1e-12)
  np.testing.assert_allclose(recall, ref_r, atol=1e-12)
  np.testing.assert_array_equal(thr, ref_t)


def _small_step(capacity, params, batch):
  del params
  metric = M.AUROC(exact=True, capacity=capacity)
  return metric.batch_updates(preds=batch["s"], target=batch["y"], mask=batch["mask"])


def test_elements_beyond_capacity_are_reported_not_dropped():
  scores, target = _data()
  batches = pe.pad_batches({"s": scores, "y": target}, BATCH, pad_value={"s": np.nan, "y": 7})
  step = functools.partial(_small_step, 150)
  with pytest.raises(ValueError, match=r"53 x 'element beyond capacity=150"):
    pe.masked_eval(step, None, batches, backend="jit")
  results = pe.masked_eval(step, None, batches, backend="shard_map", on_invalid="ignore")
  assert np.isnan(results["auroc"])


@pytest.mark.parametrize(
  "config, match",
  [
    (dict(exact=True), "capacity must be an int"),
    (dict(exact=True, capacity=0), "capacity must be an int"),
    (dict(capacity=10), "capacity sizes the kept scores"),
    (dict(exact="yes", capacity=10), "exact must be True or False"),
  ],
)
def test_bad_exact_config_names_the_argument(config, match):
  for kind in (M.AUROC, M.AUPRC):
    with pytest.raises(ValueError, match=match):
      kind(**config)


def _logit_step(params, batch):
  del params
  return M.AUROC().batch_updates(preds=batch["s"], target=batch["y"], mask=batch["mask"])


def test_logits_without_from_logits_are_reported_with_the_fix():
  rng = np.random.default_rng(1)
  logits = (3 * rng.standard_normal(N)).astype(np.float32)
  target = (rng.random(N) < 0.5).astype(np.int32)
  outside = int(np.sum((logits < 0) | (logits > 1)))
  batches = pe.pad_batches({"s": logits, "y": target}, BATCH, pad_value={"s": 5.0, "y": 0})
  with pytest.raises(ValueError, match=rf"{outside} x .*pass from_logits=True"):
    pe.masked_eval(_logit_step, None, batches, backend="jit")
