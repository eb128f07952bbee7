"""Property suite, devices: aggregation over 1..8 stacked partial states, pmap and
shard_map over subsets of the 8 virtual devices, and the no-abort regression.

The metrics run as one ``pe.Metrics`` collection of every accumulator layout (weighted
mean sums, moments, confusion counts, histograms, per-bin sums), compared with float64
references within the tolerances argued in the other ``test_properties_*`` files.

Safe pattern on XLA's CPU client (see HOWTO.md, "Driving metrics yourself"): every
program with a collective needs all 8 device threads at once, and more than about 32
such programs in flight deadlock it; the loops here wait on each step.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
import scipy.stats
import sklearn.metrics as skm
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import NamedSharding, PartitionSpec
from metric_checks import (
  assert_close,
  jit_aggregate,
  jit_batch_updates,
  jit_compute,
  merge_randomly,
  random_batches,
)

import padded_eval as pe

EPS = 2.0**-24
C = 3
AXIS = "devices"


def _collection():
  return pe.Metrics(
    {
      "mean": pe.metrics.Mean("values"),
      "std": pe.metrics.Std(argname="values"),
      "pearson": pe.metrics.PearsonCorrelation().map_arg(target="values"),
      "recall": pe.metrics.Recall(num_classes=C, average="macro").map_arg(preds="scores"),
      "auroc": pe.metrics.AUROC(101, binning="linear", task="binary").map_arg(
        preds="probs", target="flags"
      ),
    }
  )


def _data(rng, n):
  values = (3.0 + rng.standard_normal(n)).astype(np.float32)
  flags = (rng.random(n) < 0.5).astype(np.int32)
  flags[:2] = [0, 1]
  return {
    "values": values,
    "preds": (values + rng.standard_normal(n)).astype(np.float32),
    "target": rng.integers(0, C, n).astype(np.int32),
    "scores": rng.standard_normal((n, C)).astype(np.float32),
    "probs": (rng.integers(0, 101, n) / 100).astype(np.float32),
    "flags": flags,
  }


def _check(got, data):
  x = data["values"].astype(np.float64)
  assert_close(got["mean"], np.mean(x), rtol=20 * EPS, atol=16 * EPS * np.mean(np.abs(x)))
  assert_close(got["std"], np.std(x), rtol=32 * EPS, atol=0.0)
  pearson = scipy.stats.pearsonr(data["preds"].astype(np.float64), x)[0]
  assert_close(got["pearson"], pearson, atol=64 * EPS)
  guess = np.argmax(data["scores"], -1)
  recall = skm.recall_score(data["target"], guess, average="macro", zero_division=0)
  assert_close(got["recall"], recall, rtol=(C + 4) * EPS, atol=0.0)
  probs = data["probs"].astype(np.float64)
  auroc = skm.roc_auc_score(data["flags"], probs)
  assert_close(got["auroc"], auroc, rtol=105 * EPS, atol=0.0)


def _values(metric):
  return jax.tree.map(lambda v: np.asarray(v, np.float64), jax.device_get(jit_compute(metric)))


@given(seed=st.integers(0, 2**32 - 1), devices=st.integers(1, 8), n=st.integers(2, 40))
def test_aggregate_over_any_number_of_stacked_devices(seed, devices, n):
  """k partial states (random batchings and merge trees) stacked on a leading axis of
  length k, then ``aggregate()``d (the same statistics as after ``all_gather``)."""
  rng = np.random.default_rng(seed)
  data, metric = _data(rng, n), _collection()
  parts = [jit_batch_updates(metric, b) for b in random_batches(data, rng, 16)]
  owner = rng.integers(devices, size=len(parts))
  per_device = [
    merge_randomly([p for p, o in zip(parts, owner) if o == d] or [metric.empty()], rng)
    for d in range(devices)
  ]
  stacked = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *per_device)
  _check(_values(jit_aggregate(stacked)), data)


def _device_batches(data, devices, rng):
  """Padded batches of 2 rows per device, reshaped to ``[devices, 2, ...]``."""
  for batch in random_batches(data, rng, 2 * devices):
    yield jax.tree.map(lambda x: x.reshape((devices, 2) + x.shape[1:]), batch)


@pytest.mark.parametrize("devices", [1, 3, 8])
def test_pmap_reduce_over_a_subset_of_devices(devices):
  """pmap over the first ``devices`` devices, ``reduce`` inside; every device holds the
  total. (``all_gather(...).aggregate()`` in pmap: ``metric_checks.check_pmap``.)"""
  rng = np.random.default_rng(devices)
  data, metric = _data(rng, 29), _collection()

  def step(total, batch):
    return total.merge(metric.batch_updates(**batch).reduce(AXIS))

  pstep = jax.pmap(step, AXIS, in_axes=(None, 0), devices=jax.devices()[:devices])
  total = jax.device_get(metric)
  for batch in _device_batches(data, devices, rng):
    copies = jax.device_get(pstep(total, batch))  # waits: one collective program in flight
    for leaf in jax.tree.leaves(copies):
      np.testing.assert_array_equal(leaf, np.broadcast_to(leaf[0], leaf.shape))
    total = jax.tree.map(lambda x: x[0], copies)
  _check(_values(total), data)


@pytest.mark.parametrize("devices", [2, 8])
def test_shard_map_reduce_over_a_subset_of_devices(devices):
  rng = np.random.default_rng(100 + devices)
  data, metric = _data(rng, 29), _collection()
  mesh = jax.make_mesh((devices,), (AXIS,), devices=jax.devices()[:devices])
  step = jax.jit(
    jax.shard_map(
      lambda m, b: m.merge(metric.batch_updates(**b).reduce(AXIS)),
      mesh=mesh,
      in_specs=(PartitionSpec(), PartitionSpec(AXIS)),
      out_specs=PartitionSpec(),
    )
  )
  total = jax.device_put(metric, NamedSharding(mesh, PartitionSpec()))
  for batch in random_batches(data, rng, 2 * devices):
    total = step(total, jax.device_put(batch, NamedSharding(mesh, PartitionSpec(AXIS))))
    jax.block_until_ready(total)
  _check(_values(total), data)


# --- no abort, ever ------------------------------------------------------------------------------

_REPRODUCTION = textwrap.dedent(
  """
  import os
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
  os.environ["JAX_PLATFORMS"] = "cpu"
  import jax, numpy as np
  import padded_eval as pe

  rng = np.random.default_rng(0)
  step = jax.pmap(lambda b: pe.metrics.AUPRC().batch_updates(**b))
  outs = []
  for _ in range(16):
    mask = rng.random((8, 4)) < 0.8
    preds = np.where(mask, rng.random((8, 4)), np.nan).astype(np.float32)
    target = (rng.random((8, 4)) < 0.5).astype(np.int32)
    outs.append(step({"preds": preds, "target": target, "mask": mask}))
  eager = [out.aggregate() for out in outs]  # nothing waited on in between
  jitted = [jax.jit(lambda m: m.aggregate())(out) for out in outs]
  merged = eager[0]
  for part in eager[1:]:
    merged = merged.merge(part)
  print("AUPRC", float(merged.compute()), float(jitted[-1].compute()))

  # the same with float accumulators (ExactSum, Moments); small and fast, so this part
  # alone did not abort before the fix: the queue drained faster than it filled
  moments = pe.Metrics({"std": pe.metrics.Std(argname="preds"), "mean": pe.metrics.Mean("preds")})
  step = jax.pmap(lambda b: moments.batch_updates(**b))
  outs = [step({"preds": rng.random((8, 4)).astype(np.float32)}) for _ in range(16)]
  aggregated = [out.aggregate() for out in outs]  # nothing waited on in between
  print("Std", float(aggregated[-1].compute()["std"]))
  """
)


def test_aggregate_of_pmap_outputs_does_not_abort():
  """Issue 12: eager ``aggregate()`` of 16 pmap outputs launched one cross-device program
  per op, hundreds in flight, and XLA's CPU client aborted after its 40 s rendezvous
  timeout. Run in a subprocess, so an abort fails this test instead of killing pytest."""
  run = subprocess.run(
    [sys.executable, "-c", _REPRODUCTION], capture_output=True, text=True, timeout=150
  )
  assert run.returncode == 0, f"rc={run.returncode}\n{run.stderr[-3000:]}"
  assert "AUPRC" in run.stdout and "Std" in run.stdout


# --- jax.make_mesh meshes (Explicit axes by default) --------------------------------------------

_MESH_SHAPES = [((8,), ("data",)), ((4, 2), ("data", "model")), ((2, 4), ("model", "data"))]
_AXIS_TYPES = ["default", "explicit", "auto"]


def _mesh_step(params, batch):
  del params
  return _collection().batch_updates(**batch)


@given(
  seed=st.integers(0, 2**32 - 1),
  n=st.integers(1, 70),
  shape=st.sampled_from(range(len(_MESH_SHAPES))),
  axis_types=st.sampled_from(_AXIS_TYPES),
)
def test_jit_on_make_mesh_meshes(seed, n, shape, axis_types):
  """``masked_eval(backend="jit")`` on ``jax.make_mesh`` meshes of any shape and axis types
  matches the float64 references (issue 26: Explicit axes crashed the histograms)."""
  rng = np.random.default_rng(seed)
  data = _data(rng, max(n, 2))
  sizes, names = _MESH_SHAPES[shape]
  kwargs = {}
  if axis_types != "default" and hasattr(jax.sharding, "AxisType"):
    kind = getattr(jax.sharding.AxisType, axis_types.capitalize())
    kwargs["axis_types"] = (kind,) * len(names)
  mesh = jax.make_mesh(sizes, names, **kwargs)
  batches = pe.pad_batches(data, 16, pad_value=0)
  results = pe.masked_eval(_mesh_step, None, batches, backend="jit", mesh=mesh)
  _check(results, data)
