"""One batch's score buffer holds that batch's slots only; a total holds ``capacity`` (issue 33).

Before, ``AUROC(exact=True, capacity=C)`` built every batch's buffer at ``C`` slots and merged
by a gather over all ``C``: each step cost ``O(columns * C)`` whatever the batch, and the final
sort sorted ``C`` slots whatever was seen (OGB molpcba's 128 tasks at ``capacity=2**16``: 17x
Flax's loop on 1003 graphs). Now a batch's buffer has ``min(elements, C)`` slots, a merge
scatters the smaller buffer's slots into the larger, and ``masked_eval`` computes on the used
slots only (rounded up to a power of two). Values against scikit-learn, on 203 rows with NaN
and garbage in the padded rows.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import sklearn.metrics as skm

import padded_eval as pe
from padded_eval.eval import cache as _cache

M = pe.metrics
N, BATCH, CAPACITY = 203, 32, 4096


def _data(seed=0, n=N, columns=3):
  rng = np.random.default_rng(seed)
  preds = np.round(rng.random((n, columns)), 2).astype(np.float32)  # ties
  target = (rng.random((n, columns)) < 0.4).astype(np.int32)
  target[:2] = [[0] * columns, [1] * columns]
  return preds, target


def _sklearn(kind, preds, target):
  score = skm.roc_auc_score if kind == "AUROC" else skm.average_precision_score
  return np.mean([score(target[:, c], preds[:, c].astype(np.float64)) for c in range(3)])


def _metric(kind, capacity=CAPACITY):
  return getattr(M, kind)(task="multilabel", num_classes=3, exact=True, capacity=capacity)


@pytest.mark.parametrize("kind", ["AUROC", "AUPRC"])
def test_a_batch_holds_its_own_slots_and_any_merge_order_gives_sklearn(kind):
  preds, target = _data()
  metric = _metric(kind)
  parts = [
    metric.batch_updates(preds=preds[i : i + BATCH], target=target[i : i + BATCH])
    for i in range(0, N, BATCH)
  ]
  assert [p.buffer.scores.shape for p in parts] == [(3, 32)] * 6 + [(3, 11)]
  assert metric.empty().buffer.scores.shape == (3, CAPACITY)
  expected = _sklearn(kind, preds, target)
  rng = np.random.default_rng(1)
  for _ in range(3):  # random binary merge trees: batch + batch, batch + total, total + batch
    trees = [parts[i] for i in rng.permutation(len(parts))]
    while len(trees) > 1:
      i = int(rng.integers(len(trees) - 1))
      a, b = trees[i], trees[i + 1]
      trees[i : i + 2] = [a.merge(b) if rng.random() < 0.5 else b.merge(a)]
    total = trees[0]
    assert total.buffer.scores.shape == (3, CAPACITY)
    np.testing.assert_allclose(float(total.compute()), expected, rtol=0, atol=1e-6)
  one = parts[0]  # one batch computes on its own slots
  np.testing.assert_allclose(
    float(one.compute()), _sklearn(kind, preds[:BATCH], target[:BATCH]), rtol=0, atol=1e-6
  )


def test_merging_past_capacity_counts_the_dropped_elements():
  preds, target = _data(n=40)
  metric = _metric("AUROC", capacity=48)
  a = metric.batch_updates(preds=preds[:32], target=target[:32])
  b = metric.batch_updates(preds=preds[32:], target=target[32:])
  both = a.merge(b).merge(a)  # 32 + 8 + 32 = 72 elements per column into 48 slots
  assert both.buffer.scores.shape == (3, 48)
  np.testing.assert_array_equal(np.asarray(both.buffer.size), [48] * 3)
  np.testing.assert_array_equal(np.asarray(both.buffer.dropped), [24] * 3)
  assert np.isnan(float(both.compute()))
  with pytest.raises(ValueError, match="capacity=48 vs 64"):
    a.merge(_metric("AUROC", capacity=64).batch_updates(preds=preds, target=target))


def test_a_batch_larger_than_capacity_keeps_capacity_slots():
  preds, target = _data(n=40)
  part = _metric("AUPRC", capacity=16).batch_updates(preds=preds, target=target)
  assert part.buffer.scores.shape == (3, 16)
  np.testing.assert_array_equal(np.asarray(part.buffer.dropped), [24] * 3)


@pytest.mark.parametrize("backend", ["jit", "pmap", "shard_map"])
def test_masked_eval_computes_on_the_used_slots_only(backend):
  preds, target = _data()
  # padded rows: NaN scores and an out-of-range label, which masking must keep out
  batches = [
    {**b, "preds": np.where(b["mask"][:, None], b["preds"], np.nan)}
    for b in pe.pad_batches({"preds": preds, "target": target}, BATCH, pad_value=7)
  ]
  metric = pe.Metrics({"auroc": _metric("AUROC", 1 << 14), "auprc": _metric("AUPRC", 1 << 14)})

  def step(params, batch):
    del params
    return metric.batch_updates(preds=batch["preds"], target=batch["target"], mask=batch["mask"])

  results = pe.masked_eval(step, None, batches, backend=backend)
  assert results["num_examples"] == N
  for kind in ("AUROC", "AUPRC"):
    np.testing.assert_allclose(
      results[kind.lower()], _sklearn(kind, preds, target), rtol=0, atol=1e-6
    )
  assert results.metric.children["auroc"].buffer.scores.shape == (3, 1 << 14)  # the total
  cut = _cache.trimmed(results.metric).children["auroc"].buffer
  assert cut.scores.shape == (3, 256) and cut.limit == 1 << 14  # 203 used: 256 slots sorted


def test_trimming_keeps_a_traced_buffer_and_a_full_one():
  preds, target = _data(n=8)
  full = _metric("AUROC", capacity=8).update(preds=preds, target=target)
  assert _cache.trimmed(full).buffer.scores.shape == (3, 8)
  shapes = jax.jit(lambda m: _cache.trimmed(m).buffer.scores.shape[-1] * 0 + m.buffer.scores)(
    _metric("AUROC", capacity=64).update(preds=preds, target=target)
  ).shape
  assert shapes == (3, 64)
