"""Regressions of issue 31's wrong values: CohenKappa near 0, merges of states of different
shapes, compute() of a stacked per-device state, and torchmetrics' top-k rule.

Each test failed on the code before the fix. References are scikit-learn (or numpy in
float64) on the real rows only; padded rows hold NaN, inf and ints far outside any range.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
import sklearn.metrics as skm
from metric_checks import with_garbage_rows

import padded_eval as pe

M = pe.metrics
_FLOAT_GARBAGE = np.array([np.nan, np.inf, -np.inf, 7.0, -3.0, 0.5], np.float32)


def _padded(rng, pad=5, **arrays):
  return with_garbage_rows(rng, arrays, pad, _FLOAT_GARBAGE, 2**30)


_jit_update = jax.jit(lambda m, b: m.update(**b))  # one program per metric, options and shapes
_jit_compute = jax.jit(lambda m: m.compute())


def _kappa(metric, batch, split=3):
  """``metric`` updated batch by batch (``split`` uneven pieces), computed under jit."""
  n = len(batch["mask"])
  edges = np.linspace(0, n, split + 1).astype(int)
  state = metric
  for a, b in zip(edges[:-1], edges[1:]):
    state = _jit_update(state, {k: v[a:b] for k, v in batch.items()})
  return float(_jit_compute(state))


# --- CohenKappa from exact integer products ------------------------------------------------


def test_kappa_of_chance_agreement_is_exactly_zero():
  """Issue 31: binary [0,0,0,0,0,1] vs all ones gave 5.96e-08 (sklearn: exactly 0.0)."""
  preds, target = np.array([0, 0, 0, 0, 0, 1]), np.ones(6, np.int64)
  batch = _padded(np.random.default_rng(0), preds=preds, target=target)
  expected = skm.cohen_kappa_score(target, preds)
  assert expected == 0.0
  assert _kappa(M.CohenKappa(task="binary"), batch) == 0.0


@pytest.mark.parametrize("weights", [None, "linear", "quadratic"])
@pytest.mark.parametrize("seed", range(6))
def test_kappa_matches_sklearn_to_float32_rounding(weights, seed):
  """Near-chance agreement on many rows: within a few float32 ulps of sklearn's float64
  (the old ``1 - observed / chance`` lost up to 1e-4 relative near 0)."""
  rng = np.random.default_rng(seed)
  c, n = int(rng.integers(2, 7)), int(rng.integers(200, 3000))
  target = rng.integers(0, c, n)
  # mostly independent of the target: kappa near 0, where cancellation hurt
  preds = np.where(rng.random(n) < 0.02 * seed, target, rng.integers(0, c, n))
  batch = _padded(rng, preds=preds, target=target)
  metric = M.CohenKappa(task="multiclass", num_classes=c, weights=weights)
  expected = skm.cohen_kappa_score(target, preds, labels=list(range(c)), weights=weights)
  got = _kappa(metric, batch)
  assert abs(got - expected) <= 4 * np.finfo(np.float32).eps * max(abs(expected), 1e-30) + 1e-12


def test_kappa_counts_beyond_float32_integers_stay_exact():
  """Counts past 2**24 (a doubled state): kappa still equals sklearn's on the counts."""
  rng = np.random.default_rng(3)
  target = rng.integers(0, 3, 500)
  preds = np.where(rng.random(500) < 0.1, target, rng.integers(0, 3, 500))
  metric = M.CohenKappa(task="multiclass", num_classes=3).update(preds=preds, target=target)
  for _ in range(16):  # 500 * 2**16 rows: every cell past 2**24
    metric = metric.merge(metric)
  expected = skm.cohen_kappa_score(target, preds)  # kappa is invariant to scaling the table
  assert abs(float(metric.compute()) - expected) <= 4e-7 * abs(expected)


# --- merges and computes of stacked states -------------------------------------------------


def test_merge_of_states_of_different_shapes_raises():
  """Issue 31: a metric merged with a stacked per-device one broadcast silently."""
  x = np.arange(10, dtype=np.float32)
  single = M.Mean().update(values=x)
  stacked = jax.tree.map(lambda leaf: np.stack([leaf] * 8), single)
  with pytest.raises(ValueError, match="aggregate"):
    single.merge(stacked)
  with pytest.raises(ValueError, match="aggregate"):
    stacked.merge(single)


def test_compute_of_a_stacked_state_raises_and_aggregate_fixes_it():
  x = np.random.default_rng(0).normal(size=(8, 13)).astype(np.float32)
  per_device = jax.vmap(lambda v: M.Mean().update(values=v))(x)
  with pytest.raises(ValueError, match=r"aggregate\(\)"):
    per_device.compute()
  assert np.isclose(float(per_device.aggregate().compute()), x.astype(np.float64).mean(), rtol=1e-6)


def test_confusion_family_compute_of_stacked_state_raises():
  rng = np.random.default_rng(1)
  preds, target = rng.integers(0, 3, (8, 11)), rng.integers(0, 3, (8, 11))
  metric = M.F1Score(task="multiclass", num_classes=3, average="macro")
  per_device = jax.vmap(lambda p, t: metric.update(preds=p, target=t))(preds, target)
  with pytest.raises(ValueError, match=r"aggregate\(\)"):
    per_device.compute()
  expected = skm.f1_score(target.reshape(-1), preds.reshape(-1), average="macro")
  assert np.isclose(float(per_device.aggregate().compute()), expected, rtol=1e-6)


# --- torchmetrics' top-k rule --------------------------------------------------------------


def _torchmetrics_topk_labels(scores, target, k):
  """torchmetrics 1.9's refinement: the target if among the k best scores, else the best."""
  order = np.argsort(-scores, axis=-1, kind="stable")[:, :k]
  hit = np.any(order == target[:, None], axis=-1)
  return np.where(hit, target, order[:, 0])


@pytest.mark.parametrize("average", ["micro", "macro", "weighted", None])
@pytest.mark.parametrize("name", ["Precision", "Recall", "F1Score"])
def test_top_k_rule_torchmetrics(name, average):
  rng = np.random.default_rng(7)
  n, c, k = 157, 5, 2
  scores = rng.normal(size=(n, c)).astype(np.float32)
  target = rng.integers(0, c, n)
  batch = _padded(rng, preds=scores, target=target)
  metric = getattr(M, name)(
    task="multiclass", num_classes=c, top_k=k, top_k_rule="torchmetrics", average=average
  )
  got = np.asarray(jax.jit(lambda m: m.update(**batch).compute())(metric))
  labels = _torchmetrics_topk_labels(scores, target, k)
  reference = {
    "Precision": skm.precision_score,
    "Recall": skm.recall_score,
    "F1Score": skm.f1_score,
  }
  expected = reference[name](
    target, labels, average=average, labels=list(range(c)), zero_division=0
  )
  if average == "macro":  # our multiclass macro: classes present in target or predictions
    present = np.union1d(target, labels)
    expected = reference[name](target, labels, average=None, labels=list(range(c)), zero_division=0)
    expected = expected[present].mean()
  np.testing.assert_allclose(got, expected, rtol=1e-6)


@pytest.mark.parametrize("how", ["weighted", "samplewise"])
@pytest.mark.parametrize("name", ["Precision", "Recall", "F1Score"])
def test_top_k_rule_torchmetrics_holds_weighted_and_samplewise(name, how):
  """Before, ``weighted=True`` and ``multidim_average="samplewise"`` scored the "every" rule
  whatever ``top_k_rule`` said (Precision 0.285 for 0.566, silently)."""
  rng = np.random.default_rng(11)
  rows, m, c, k = 3, 41, 5, 2
  scores = rng.normal(size=(rows, m, c)).astype(np.float32)
  target = rng.integers(0, c, (rows, m))
  reference = {
    "Precision": skm.precision_score,
    "Recall": skm.recall_score,
    "F1Score": skm.f1_score,
  }
  score = functools.partial(reference[name], labels=list(range(c)), zero_division=0)
  options = dict(task="multiclass", num_classes=c, top_k=k, top_k_rule="torchmetrics")
  labels = _torchmetrics_topk_labels(scores.reshape(-1, c), target.reshape(-1), k)
  if how == "weighted":
    weights = rng.uniform(0.5, 2.0, rows * m).astype(np.float32)
    metric = getattr(M, name)(**options, average="weighted", weighted=True)
    batch = _padded(rng, preds=scores.reshape(-1, c), target=target.reshape(-1), weights=weights)
    expected = score(target.reshape(-1), labels, average="weighted", sample_weight=weights)
  else:
    metric = getattr(M, name)(**options, average="micro", multidim_average="samplewise")
    batch = {"preds": scores, "target": target}
    labels = labels.reshape(rows, m)
    expected = np.mean([score(t, p, average="micro") for t, p in zip(target, labels)])
  got = np.asarray(jax.jit(lambda metric: metric.update(**batch).compute())(metric))
  np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_top_k_rule_is_checked():
  with pytest.raises(ValueError, match="top_k_rule"):
    M.Precision(task="multiclass", num_classes=3, top_k=2, top_k_rule="best")
