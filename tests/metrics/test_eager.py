"""Eager ``merge``, ``aggregate`` and ``compute`` (outside any jit) run as one compiled program each.

An exact merge or compute is dozens of small operations (normalizations, two-sums, ratios);
dispatched one by one, a new configuration compiled each of them and every later call
dispatched them all. Their shapes are the state's, so one program per configuration serves
every batch. ``batch_updates`` stays op by op: jitted, each new batch shape would compile the
whole update where op by op it compiles only that shape's few reductions. The numbers are the
traced code's own, so they match the references as the jitted update does
(tests/metrics/test_base.py checks both).
"""

import jax
import jax.monitoring
import numpy as np
import pytest

import padded_eval as pe
from padded_eval.exact.accumulate import ExactCount

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@pytest.fixture
def compiles():
  """The number of XLA compilations made so far while the test runs (a one-element list)."""
  count = [0]

  def listener(event, duration, **kwargs):
    del duration, kwargs
    if event == _COMPILE_EVENT:
      count[0] += 1

  jax.monitoring.register_event_duration_secs_listener(listener)
  yield count
  unregister = getattr(jax.monitoring, "unregister_event_duration_listener", None)
  if unregister is None:  # jax < 0.9 (the floors)
    from jax._src import monitoring

    unregister = monitoring._unregister_event_duration_listener_by_callback
  unregister(listener)


def _batch(rng, rows, classes=5):
  mask = rng.random(rows) < 0.7
  logits = rng.normal(size=(rows, classes)).astype(np.float32)
  labels = rng.integers(0, classes, rows)
  logits[~mask] = np.nan  # padded rows: garbage that must not count
  labels[~mask] = 10**6
  return {"preds": logits, "target": labels, "mask": mask}


def _reference_accuracy(batches):
  hits = [(b["preds"].argmax(-1) == b["target"])[b["mask"]] for b in batches]
  return np.concatenate(hits).astype(np.float64).mean()


def test_eager_merge_and_aggregate_compile_once_and_match_the_reference(compiles):
  rng = np.random.default_rng(1)
  batches = [_batch(rng, 8) for _ in range(8)]
  parts = [pe.metrics.Accuracy().batch_updates(**b) for b in batches]
  stacked = jax.tree.map(lambda *xs: np.stack(xs), *parts)
  jax.clear_caches()  # so that no operation of the merge was compiled by an earlier test
  before = compiles[0]
  total = parts[0]
  for part in parts[1:]:
    total = total.merge(part)
  assert compiles[0] - before == 1  # one merge program for all seven merges
  before = compiles[0]
  aggregated = stacked.aggregate()
  assert compiles[0] - before == 1
  before = compiles[0]
  values = [float(metric.compute()) for metric in (total, aggregated)]
  assert compiles[0] - before == 1  # compute: one program for both (the same shapes)
  np.testing.assert_allclose(values, _reference_accuracy(batches), rtol=1e-6)


def test_aggregate_of_pmap_outputs_still_runs_on_one_device():
  """pmap's outputs sit on every device: ``aggregate`` fetches them before its one program, so
  no eager program with cross-device collectives is left in flight (conftest's warning)."""
  n = jax.local_device_count()
  rng = np.random.default_rng(2)
  batch = _batch(rng, 4 * n)
  sharded = jax.tree.map(lambda x: x.reshape((n, 4) + x.shape[1:]), batch)
  per_device = jax.pmap(lambda b: pe.metrics.Accuracy().batch_updates(**b))(sharded)
  assert len(jax.tree.leaves(per_device)[0].sharding.device_set) == n
  total = per_device.aggregate()
  for leaf in jax.tree.leaves(total):
    assert len(leaf.sharding.device_set) == 1
  np.testing.assert_allclose(float(total.compute()), _reference_accuracy([batch]), rtol=1e-6)


def test_traced_and_python_inputs_still_take_the_traced_path():
  """Inside jit the update is inlined as before, with the same numbers as eagerly; a Python
  number among the keywords is taken as before."""
  rng = np.random.default_rng(3)
  batch = _batch(rng, 16)
  jitted = jax.jit(lambda m, b: m.update(**b))(pe.metrics.Accuracy(), batch)
  eager = pe.metrics.Accuracy().update(**batch)
  np.testing.assert_array_equal(np.asarray(jitted.compute()), np.asarray(eager.compute()))

  values = np.array([1.0, 2.0, 4.0], np.float32)
  with_scalar = pe.metrics.Mean("x").update(x=values, weights=2.0)
  np.testing.assert_allclose(float(with_scalar.compute()), values.astype(np.float64).mean())


class _NumpyCount(pe.Metric):
  """A metric written for eager use only: numpy on its inputs and on its state in ``compute``
  (it cannot be traced)."""

  count: object = pe.metrics.base.state(lambda self: pe.metrics.base.empty_count(self))

  def _batch_state(self, *, values, mask=None, **_):
    real = np.ones(np.shape(values), bool) if mask is None else np.asarray(mask)
    hits = real & (np.asarray(values) > 0)
    return {"count": ExactCount.of(np.sum(hits, dtype=np.int32))}

  def compute(self):
    return np.float32(self.count.to_numpy())  # reads the state on the host


def test_a_metric_that_cannot_be_traced_still_works_eagerly():
  """User code with numpy worked eagerly before; it still does (op by op)."""
  values = np.array([1.0, -2.0, 3.0, 4.0], np.float32)
  mask = np.array([True, True, True, False])
  metric = _NumpyCount().update(values=values, mask=mask).update(values=values, mask=mask)
  assert int(metric.compute()) == 4
  collection = pe.Metrics({"numpy": _NumpyCount(), "mean": pe.metrics.Mean()})
  logs = collection.update(values=values, mask=mask).compute()
  assert int(logs["numpy"]) == 2
  np.testing.assert_allclose(float(logs["mean"]), values[mask].astype(np.float64).mean())


def test_eager_compute_of_an_exact_curve_sorts_the_used_slots_only():
  """``compute`` cuts a score buffer to its used slots on the host before its one program, as
  masked_eval does: the value equals scikit-learn's, whatever the capacity."""
  sklearn_metrics = pytest.importorskip("sklearn.metrics")
  rng = np.random.default_rng(4)
  scores = rng.random(40).astype(np.float32)
  labels = rng.random(40) < 0.4
  mask = rng.random(40) < 0.8
  scores[~mask] = np.nan
  metric = pe.metrics.AUROC(exact=True, capacity=4096).update(
    preds=scores, target=labels, mask=mask
  )
  assert metric.buffer.scores.shape[-1] == 4096
  expected = sklearn_metrics.roc_auc_score(labels[mask], scores[mask].astype(np.float64))
  np.testing.assert_allclose(float(metric.compute()), expected, rtol=1e-6)


def test_clear_caches_drops_the_eager_programs(compiles):
  rng = np.random.default_rng(5)
  batch = _batch(rng, 16)
  first = pe.metrics.Accuracy().update(**batch).compute()
  before = compiles[0]
  pe.metrics.Accuracy().update(**batch).compute()
  assert compiles[0] == before  # cached
  pe.clear_caches()
  again = pe.metrics.Accuracy().update(**batch).compute()
  assert compiles[0] > before  # compiled anew
  np.testing.assert_array_equal(np.asarray(again), np.asarray(first))
