"""OGB's mean average precision (``average="ogb"``) and the multilabel curve state for
many tasks (issue 20), against a numpy implementation of OGB's evaluator rule on
scikit-learn's per-task ``average_precision_score`` / ``roc_auc_score``.

The rule (ogb.graphproppred.Evaluator, "ap" / "rocauc"): for each task, if it has at
least one label 1 and one label 0, score it on the rows whose label is not NaN; the
result is the mean over those tasks. Padded rows hold NaN / inf / garbage.
"""

import jax
import numpy as np
import pytest
import sklearn.metrics as skm

import padded_eval as pe
from padded_eval import metrics as M
from padded_eval.metrics.classification._formatting import LOGIT_EVIDENCE
from padded_eval.metrics.curves import histogram as curves

PAD = 6
GRID = 1000  # scores k / 1000 with num_thresholds=1001 linear bins: exact mode


def ogb_rule(y_true, y_pred, score):
  """OGB's evaluator rule in numpy float64 (NaN when no task qualifies; OGB raises)."""
  values = []
  for task in range(y_true.shape[1]):
    column = y_true[:, task]
    if np.sum(column == 1) > 0 and np.sum(column == 0) > 0:
      labelled = ~np.isnan(column)
      values.append(score(column[labelled], y_pred[labelled, task]))
  return np.mean(values) if values else np.nan


def molpcba_like(n, tasks, seed, on_grid=False):
  """float labels (5% positive, 30% NaN) and scores; tasks 0-2 are degenerate."""
  rng = np.random.default_rng(seed)
  labels = (rng.random((n, tasks)) < 0.05).astype(np.float32)
  labels[rng.random((n, tasks)) < 0.3] = np.nan
  labels[:, 0] = np.where(np.isnan(labels[:, 0]), np.nan, 1.0)  # positives only
  labels[:, 1] = np.where(np.isnan(labels[:, 1]), np.nan, 0.0)  # negatives only
  labels[:, 2] = np.nan  # no label at all
  labels[0, 3], labels[1, 3] = 1.0, 0.0  # at least one mixed task
  logits = rng.normal(0.0, 2.0, (n, tasks)) + 2.5 * np.nan_to_num(labels)
  probs = 1.0 / (1.0 + np.exp(-logits))
  if on_grid:
    probs = np.round(probs * GRID) / GRID
  return labels, probs.astype(np.float32)


def padded(rng, preds, labels):
  garbage = rng.choice([np.nan, np.inf, -np.inf, 7.5, -3.0], size=(PAD,) + preds.shape[1:])
  return {
    "preds": np.concatenate([preds, garbage.astype(np.float32)]),
    "target": np.concatenate([labels, rng.permutation(garbage).astype(np.float32)]),
    "mask": np.arange(len(preds) + PAD) < len(preds),
  }


def jit_update(metric, batch):
  return jax.jit(lambda m, b: m.update(**b))(metric, batch)


@pytest.mark.parametrize(
  "make,score",
  [(M.AUPRC, skm.average_precision_score), (M.AUROC, skm.roc_auc_score)],
  ids=["auprc", "auroc"],
)
def test_ogb_average_matches_the_rule_exactly_on_grid_scores(make, score):
  labels, probs = molpcba_like(400, 10, seed=0, on_grid=True)
  batch = padded(np.random.default_rng(1), probs, labels)
  metric = make(
    task="multilabel", num_classes=10, average="ogb", num_thresholds=GRID + 1, binning="linear"
  )
  metric = jit_update(metric, batch)
  want = ogb_rule(labels.astype(np.float64), probs.astype(np.float64), score)
  np.testing.assert_allclose(float(metric.compute()), want, rtol=0, atol=1e-6)
  reported = [kind for kind in metric.invalid_kinds if kind != LOGIT_EVIDENCE]  # never reported
  assert metric.invalid_counts() == {kind: 0 for kind in reported}  # NaN: missing


def test_macro_scores_a_task_without_negatives_as_one_and_ogb_does_not():
  labels, probs = molpcba_like(400, 10, seed=2, on_grid=True)
  kw = dict(task="multilabel", num_classes=10, num_thresholds=GRID + 1, binning="linear")
  ogb = M.AUPRC(average="ogb", **kw).update(preds=probs, target=labels)
  per_task = np.asarray(
    M.AUPRC(average=None, ignore_index=-1, **kw)
    .update(preds=probs, target=np.where(np.isnan(labels), -1, labels).astype(np.int32))
    .compute()
  )
  assert per_task[0] == pytest.approx(1.0)  # task 0 has positives only: macro counts it
  want = ogb_rule(labels.astype(np.float64), probs.astype(np.float64), skm.average_precision_score)
  assert float(ogb.compute()) == pytest.approx(want, abs=1e-6)
  assert np.nanmean(per_task) > want + 1e-3


def test_int_targets_with_ignore_index_equal_nan_labels():
  labels, probs = molpcba_like(300, 8, seed=3)
  kw = dict(task="multilabel", num_classes=8, average="ogb")
  with_nan = M.AUPRC(**kw).update(preds=probs, target=labels)
  ints = np.where(np.isnan(labels), -1, labels).astype(np.int32)
  with_ints = M.AUPRC(ignore_index=-1, **kw).update(preds=probs, target=ints)
  assert float(with_nan.compute()) == float(with_ints.compute())


def test_labels_other_than_nan_0_1_are_counted_invalid():
  labels, probs = molpcba_like(50, 4, seed=4)
  labels[5, 3], labels[6, 3] = 0.5, np.inf
  metric = M.AUPRC(task="multilabel", num_classes=4, average="ogb").update(
    preds=probs, target=labels
  )
  assert metric.invalid_counts()["target out of range"] == 2


def test_ogb_average_needs_multilabel_and_float_labels_need_it():
  with pytest.raises(ValueError, match="average"):
    M.AUPRC(average="ogb")  # task="binary"
  labels, probs = molpcba_like(20, 4, seed=5)
  with pytest.raises(ValueError, match="target"):
    M.AUPRC(task="multilabel", num_classes=4).update(preds=probs, target=labels)


def test_no_qualifying_task_is_nan():
  probs = np.full((5, 3), 0.5, np.float32)
  labels = np.ones((5, 3), np.float32)
  metric = M.AUPRC(task="multilabel", num_classes=3, average="ogb").update(
    preds=probs, target=labels
  )
  assert np.isnan(metric.compute())


@pytest.mark.parametrize("backend", ["pmap", "jit"])
def test_masked_eval_over_devices_matches_the_rule(backend):
  labels, probs = molpcba_like(203, 16, seed=6, on_grid=True)
  data = {"probs": probs, "labels": labels}
  metric = M.AUPRC(
    task="multilabel", num_classes=16, average="ogb", num_thresholds=GRID + 1, binning="linear"
  )

  def step_fn(params, batch):
    del params
    return metric.batch_updates(preds=batch["probs"], target=batch["labels"], mask=batch["mask"])

  batches = pe.pad_batches(data, 64, pad_value=np.nan)
  results = pe.masked_eval(step_fn, None, batches, backend=backend)
  want = ogb_rule(labels.astype(np.float64), probs.astype(np.float64), skm.average_precision_score)
  assert results["num_examples"] == 203
  np.testing.assert_allclose(results["auprc"], want, rtol=0, atol=1e-6)


# --- the default state for many tasks, and its error bound -------------------------------


def state_bytes(metric):
  return sum(x.nbytes for x in jax.tree.leaves((metric.positives, metric.negatives)))


def test_default_state_is_at_most_16_mib_for_many_tasks_and_unchanged_for_few():
  many = M.AUPRC(task="multilabel", num_classes=128)
  assert state_bytes(many) <= 16 * 2**20
  assert (many.num_thresholds, many.binning) == (4097, "symlog")
  binary = M.AUPRC()
  assert binary.num_thresholds == curves.DEFAULT_NUM_THRESHOLDS == 65_537  # unchanged
  assert binary.binning == "logit"
  multiclass = M.AUROC(task="multiclass", num_classes=10)
  assert (multiclass.num_thresholds, multiclass.binning) == (65_537, "logit")
  assert M.AUPRC(task="multilabel", num_classes=15).num_thresholds == 65_537
  assert M.AUPRC(task="multilabel", num_classes=16).num_thresholds == 32_769
  assert M.AUPRC(task="multilabel", num_classes=1000).num_thresholds == 1025
  for classes in (1, 15, 16, 17, 64, 127, 128, 129, 1000, 5000):
    metric = M.AUROC(task="multilabel", num_classes=classes)
    assert state_bytes(metric) <= 16 * 2**20 or metric.num_thresholds == 257
    assert state_bytes(metric) > 8 * 2**20 or metric.num_thresholds == 65_537


@pytest.mark.parametrize("from_logits", [False, True], ids=["probs", "logits"])
@pytest.mark.parametrize("spread", [1.0, 4.0, 12.0])
def test_default_ap_error_is_within_the_bound(spread, from_logits):
  """128 tasks, default 4_097 bins: per task |AP - sklearn| <= error_bound() (+ float32)."""
  rng = np.random.default_rng(int(spread * 10) + from_logits)
  n, tasks = 1000, 128
  truth = rng.random((n, tasks)) < rng.uniform(0.01, 0.5, tasks)
  logits = rng.normal(0.0, spread, (n, tasks)) + spread * truth
  probs = 1.0 / (1.0 + np.exp(-logits))
  preds = (logits if from_logits else probs).astype(np.float32)
  metric = M.AUPRC(task="multilabel", num_classes=tasks, average=None, from_logits=from_logits)
  batch = padded(rng, preds, truth.astype(np.float32))
  batch["target"] = np.where(batch["mask"][:, None], batch["target"], 0).astype(np.int32)
  metric = jit_update(metric, batch)
  got, bound = np.asarray(metric.compute()), np.asarray(metric.error_bound())
  ranked = preds.astype(np.float64)
  want = np.array([skm.average_precision_score(truth[:, t], ranked[:, t]) for t in range(tasks)])
  error = np.abs(got - want)
  assert np.all(error <= bound + 2e-6), (error.max(), bound[np.argmax(error - bound)])
  if spread < 12:  # at 12, float32 probabilities saturate at 1.0: real ties, exact anyway
    assert bound.max() < 0.05  # the bound is informative, not vacuous
  macro = M.AUPRC(task="multilabel", num_classes=tasks, from_logits=from_logits)
  macro = jit_update(macro, batch)
  assert abs(float(macro.compute()) - want.mean()) <= float(macro.error_bound()) + 2e-6
