"""Every metric family through ``masked_eval`` on every kind of mesh (issue 26).

``jax.make_mesh`` gives ``Explicit`` axes by default (JAX >= 0.7), unlike
``jax.sharding.Mesh``: before the fix the ``jit`` backend crashed there for F1, AUROC, MCC,
CalibrationError ("Resource axis: data ... not found in mesh: ()") and every other metric
whose batch statistics scatter or one-hot a split batch. Here rows (every metric, every
code path) of the case tables (``tests/metric_cases.py``, ``classification/test_classification.py``,
``curves/test_auc.py``) run through ``masked_eval`` on a ``make_mesh`` mesh with default axis
types and on one with explicitly given ``AxisType.Explicit`` axes, against each case's
independent float64 reference (numpy / scikit-learn / scipy), padded rows full of garbage.
The cases of one group run as one collection in one step (one compilation per mesh): each
case reads its own keywords from its own namespace of the batch (``map_arg``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sklearn.metrics as skm
import test_auc
import test_classification
from jax.sharding import NamedSharding, PartitionSpec
from metric_cases import CASES, poison
from test_bootstrap import np_counts
from test_bootstrap_cases import repeated, with_ids

import padded_eval as pe
from padded_eval.data import sharding
from padded_eval.eval.backends.jit import keep_or_replicate

AxisType = getattr(jax.sharding, "AxisType", None)


_ALL = {case.name: case for case in CASES + test_classification.CASES + test_auc.CASES}
# one row per metric and per code path of its batch statistics (task, class ids, top-k)
GROUPS = {
  "averages_moments_text": [
    "mean",
    "mean_weighted_tokens",
    "accuracy_top3_weighted",
    "mse",
    "mae",
    "rmse",
    "std",
    "r2_raw_weighted",
    "pearson_weighted",
    "perplexity_tokens",
  ],
  "confusion": [
    "f1_binary_macro",
    "f1_multiclass_macro",
    "f1_multilabel_micro",
    "specificity_multiclass_weighted",
    "jaccard_multilabel_macro",
    "f1_multiclass_macro_ids_ignore",
    "f1_multiclass_micro_top2",
    "mcc_binary",
    "mcc_multiclass",
    "mcc_multilabel_ignore",
    "kappa_multiclass",
    "confmat_multiclass",
  ],
  "curves_calibration": [
    "auroc_binary_macro",
    "auroc_multiclass_macro",
    "auprc_multilabel_macro",
    "ece_binary_l1",
    "ece_multiclass_l1",
  ],
}
GROUPS = {group: [_ALL[name] for name in names] for group, names in GROUPS.items()}
_BY_NAME = {case.name: case for group in GROUPS.values() for case in group}


def _meshes():
  meshes = {"make_mesh_default": lambda: jax.make_mesh((8,), ("data",))}
  if AxisType is not None:
    explicit = (AxisType.Explicit, AxisType.Explicit)
    meshes["make_mesh_explicit_2d"] = lambda: jax.make_mesh(
      (4, 2), ("data", "model"), axis_types=explicit
    )
  return meshes


MESHES = _meshes()


def _collection(names):
  members = {}
  for name in names:
    keys = [k for k in _BY_NAME[name].batches()[0] if k != "index"]
    members[name] = _BY_NAME[name].make().map_arg(**{k: f"{name}/{k}" for k in keys})
  return pe.Metrics(members)


def _group_step(names, params, batch):
  del params
  return _collection(names).batch_updates(**batch)


def _group_batches(cases):
  """One batch stream: case ``name``'s keyword ``k`` under ``batch[f"{name}/{k}"]``, all-padding batches
  appended to the shorter streams, and an all-True row mask (each case masks itself)."""
  streams = {case.name: case.batches(seed=5) for case in cases}
  steps = max(len(s) for s in streams.values())
  rng = np.random.default_rng(9)
  for stream in streams.values():
    while len(stream) < steps:
      stream.append(poison({**stream[0], "mask": np.zeros_like(stream[0]["mask"])}, rng))
  rows = len(next(iter(streams.values()))[0]["mask"])
  return streams, [
    {
      "mask": np.ones(rows, bool),
      **{f"{name}/{k}": v for name, s in streams.items() for k, v in s[t].items()},
    }
    for t in range(steps)
  ]


@pytest.mark.parametrize("group", sorted(GROUPS))
@pytest.mark.parametrize("mesh_kind", sorted(MESHES))
def test_jit_on_make_mesh_matches_references(mesh_kind, group):
  cases = GROUPS[group]
  streams, batches = _group_batches(cases)
  step = functools.partial(_group_step, tuple(c.name for c in cases))
  results = pe.masked_eval(step, None, batches, backend="jit", mesh=MESHES[mesh_kind]())
  for case in cases:
    np.testing.assert_allclose(
      np.asarray(results[case.name], np.float64),
      case.reference(streams[case.name]),
      rtol=case.rtol,
      atol=case.atol,
      equal_nan=True,
      err_msg=f"{case.name} on {mesh_kind}",
    )


@pytest.mark.parametrize("group", ["confusion", "curves_calibration"])
def test_shard_map_on_make_mesh_matches_references(group):
  cases = GROUPS[group]
  streams, batches = _group_batches(cases)
  step = functools.partial(_group_step, tuple(c.name for c in cases))
  mesh = jax.make_mesh((8,), ("data",))
  results = pe.masked_eval(step, None, batches, backend="shard_map", mesh=mesh)
  for case in cases:
    np.testing.assert_allclose(
      np.asarray(results[case.name], np.float64),
      case.reference(streams[case.name]),
      rtol=case.rtol,
      atol=case.atol,
      equal_nan=True,
      err_msg=case.name,
    )


def _bootstrap_step(params, batch):
  del params
  metric = pe.metrics.Bootstrap(_BY_NAME["accuracy_top3_weighted"].make(), 4, seed=11)
  return metric.batch_updates(**batch)


@pytest.mark.parametrize("mesh_kind", sorted(MESHES))
def test_bootstrap_replicas_on_make_mesh(mesh_kind):
  case = _BY_NAME["accuracy_top3_weighted"]
  batches = with_ids(case.batches(seed=3))
  results = pe.masked_eval(_bootstrap_step, None, batches, backend="jit", mesh=MESHES[mesh_kind]())
  metric = results.metric
  rows = sum(len(b["mask"]) for b in batches)
  counts = np_counts(11, 4, np.arange(rows))
  expected = [case.reference(repeated(batches, counts[r])) for r in range(4)]
  np.testing.assert_allclose(metric.replicas(), expected, rtol=case.rtol, atol=case.atol)
  np.testing.assert_allclose(metric.compute(), case.reference(batches), rtol=case.rtol)


def test_explicit_params_are_viewed_on_the_auto_mesh_without_a_copy():
  mesh = jax.make_mesh((4, 2), ("data", "model"))
  weights = jax.device_put(
    np.ones((6, 4), np.float32), NamedSharding(mesh, PartitionSpec(None, "model"))
  )
  placed = keep_or_replicate({"w": weights}, sharding.auto_mesh(mesh))["w"]
  assert placed.sharding.mesh == sharding.auto_mesh(mesh)
  assert placed.sharding.spec == weights.sharding.spec
  pointers = lambda x: sorted(s.data.unsafe_buffer_pointer() for s in x.addressable_shards)
  assert pointers(placed) == pointers(weights)


def _model_step(params, batch):
  logits = batch["x"] @ params["w"]  # [B, 3]: w split over "model" on an explicit mesh
  metrics = pe.Metrics(
    {
      "f1": pe.metrics.F1Score(task="multiclass", num_classes=3, from_logits=True),
      "mcc": pe.metrics.MatthewsCorrCoef(task="multiclass", num_classes=3),
      "auroc": pe.metrics.AUROC(task="multiclass", num_classes=3, from_logits=True),
    }
  )
  return metrics.batch_updates(preds=logits, target=batch["y"], mask=batch["mask"])


def test_model_with_params_sharded_on_an_explicit_mesh():
  """A model's params placed on the ``make_mesh`` mesh itself (explicit axes) keep their
  buffers and the metrics match scikit-learn on 203 rows (batch 32, 8 devices)."""
  rng = np.random.default_rng(4)
  n = 203
  x = rng.standard_normal((n, 6)).astype(np.float32)
  w = rng.standard_normal((6, 4)).astype(np.float32)[:, :3]
  w = np.concatenate([w, np.zeros((6, 1), np.float32)], 1)  # 4 columns: split over "model"
  y = rng.integers(0, 3, n).astype(np.int32)
  mesh = jax.make_mesh((4, 2), ("data", "model"))
  params = {"w": jax.device_put(w, NamedSharding(mesh, PartitionSpec(None, "model")))}

  def step(params, batch):
    return _model_step({"w": params["w"][:, :3]}, batch)

  batches = pe.pad_batches({"x": x, "y": y}, 32, pad_value={"x": np.nan, "y": -7})
  results = pe.masked_eval(step, params, batches, backend="jit", mesh=mesh)
  logits = x.astype(np.float64) @ w[:, :3].astype(np.float64)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  pred = logits.argmax(-1)
  assert results["num_examples"] == n
  np.testing.assert_allclose(results["f1"], skm.f1_score(y, pred, average="macro"), rtol=1e-5)
  np.testing.assert_allclose(results["mcc"], skm.matthews_corrcoef(y, pred), rtol=1e-5)
  expected = skm.roc_auc_score(y, probs, multi_class="ovr", average="macro")
  np.testing.assert_allclose(results["auroc"], expected, atol=1e-4)
  assert jnp.isfinite(results["auroc"])


def _tensor_parallel_step(params, batch):
  """A layer as gemma's: logits [B@data, T, V@model] through ``out_sharding=`` (explicit axes)."""
  logits = jnp.einsum(
    "btd,dv->btv", batch["x"], params["w"], out_sharding=PartitionSpec("data", None, "model")
  )
  tokens = batch["mask"][:, None] & (batch["y"] >= 0)
  metrics = pe.Metrics(
    {
      "accuracy": pe.metrics.Accuracy(),
      "top2": pe.metrics.Accuracy(top_k=2),
      "perplexity": pe.metrics.Perplexity(),
      "f1": pe.metrics.F1Score(task="multiclass", num_classes=6, average="macro", from_logits=True),
      "auroc": pe.metrics.AUROC(task="multiclass", num_classes=6, from_logits=True),
    }
  )
  return metrics.batch_updates(preds=logits, target=batch["y"], mask=tokens)


@pytest.mark.skipif(AxisType is None, reason="this JAX has no explicit mesh axes")
def test_class_axis_sharded_logits_under_set_mesh_of_an_explicit_mesh():
  """Issue 33 (gemma): under ``jax.set_mesh`` of a ``make_mesh`` mesh, a model whose layer
  passes ``out_sharding=`` runs, and every metric takes logits split over the class axis
  (gathers and scatters over it raised ShardingTypeError), against numpy / scikit-learn
  float64 over the 5 tokens of 61 rows (batch 16, padding full of NaN)."""
  rng = np.random.default_rng(33)
  n, t, d, v = 61, 5, 4, 6
  x = rng.standard_normal((n, t, d)).astype(np.float32)
  y = rng.integers(0, v, (n, t)).astype(np.int32)
  w = rng.standard_normal((d, v)).astype(np.float32)
  mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
  params = {"w": jax.device_put(w, NamedSharding(mesh, PartitionSpec(None, "model")))}
  batches = pe.pad_batches({"x": x, "y": y}, 16, pad_value={"x": np.nan, "y": -1})
  with jax.set_mesh(mesh):
    results = pe.masked_eval(_tensor_parallel_step, params, batches, backend="jit", mesh=mesh)
  logits = np.einsum("btd,dv->btv", x.astype(np.float64), w.astype(np.float64)).reshape(-1, v)
  log_probs = logits - logits.max(-1, keepdims=True)
  log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
  target = y.reshape(-1)
  top2 = np.argsort(-logits, -1)[:, :2]
  assert results["num_examples"] == n
  np.testing.assert_allclose(results["accuracy"], np.mean(logits.argmax(-1) == target), rtol=1e-6)
  np.testing.assert_allclose(results["top2"], np.mean((top2 == target[:, None]).any(-1)), rtol=1e-6)
  nll = -log_probs[np.arange(n * t), target].mean()
  np.testing.assert_allclose(results["perplexity"], np.exp(nll), rtol=1e-5)
  f1 = skm.f1_score(target, logits.argmax(-1), average="macro")
  np.testing.assert_allclose(results["f1"], f1, rtol=1e-5)
  auroc = skm.roc_auc_score(target, np.exp(log_probs), multi_class="ovr", average="macro")
  np.testing.assert_allclose(results["auroc"], auroc, atol=1e-3)


def _class_metrics_step(params, batch):
  """Logits ``[B@data, T, 6@model]`` (``out_sharding=``) into every class-score family."""
  logits = jnp.einsum(
    "btd,dv->btv", batch["x"], params["w"], out_sharding=PartitionSpec("data", None, "model")
  )
  tokens = batch["mask"][:, None] & (batch["y"] >= 0)
  classes = dict(task="multiclass", num_classes=6)
  metrics = pe.Metrics(
    {
      "precision": pe.metrics.Precision(**classes),
      "recall": pe.metrics.Recall(**classes, average="weighted"),
      "specificity": pe.metrics.Specificity(**classes),
      "balanced": pe.metrics.BalancedAccuracy(**classes),
      "jaccard": pe.metrics.JaccardIndex(**classes, average="micro"),
      "mcc": pe.metrics.MatthewsCorrCoef(**classes),
      "kappa": pe.metrics.CohenKappa(**classes),
      "confusion": pe.metrics.ConfusionMatrix(**classes),
      "zero_one": pe.metrics.ZeroOneLoss(**classes),
      "macro_accuracy": pe.metrics.Accuracy(**classes, average="macro"),
      "auroc_exact": pe.metrics.AUROC(**classes, from_logits=True, exact=True, capacity=512),
      "auprc_exact": pe.metrics.AUPRC(**classes, from_logits=True, exact=True, capacity=512),
    }
  )
  return metrics.batch_updates(preds=logits, target=batch["y"], mask=tokens)


@pytest.mark.skipif(AxisType is None, reason="this JAX has no explicit mesh axes")
def test_every_class_score_family_takes_logits_split_over_the_class_axis():
  """Issue 33 (gemma), the other families: under ``jax.set_mesh`` of an explicit mesh, logits
  split over the class axis go into precision / recall / specificity / balanced accuracy /
  Jaccard / MCC / kappa / confusion matrix / zero-one loss / macro accuracy and exact AUROC /
  AUPRC, against scikit-learn float64 over the 5 tokens of 61 rows (batch 16, NaN padding, and
  ignored tokens labelled -1 inside real rows)."""
  rng = np.random.default_rng(34)
  n, t, d, v = 61, 5, 4, 6
  x = rng.standard_normal((n, t, d)).astype(np.float32)
  y = rng.integers(0, v, (n, t)).astype(np.int32)
  y[rng.random((n, t)) < 0.1] = -1  # ignored tokens of real rows
  w = rng.standard_normal((d, v)).astype(np.float32)
  mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
  params = {"w": jax.device_put(w, NamedSharding(mesh, PartitionSpec(None, "model")))}
  batches = pe.pad_batches({"x": x, "y": y}, 16, pad_value={"x": np.nan, "y": 3})
  with jax.set_mesh(mesh):
    results = pe.masked_eval(_class_metrics_step, params, batches, backend="jit", mesh=mesh)
  logits = np.einsum("btd,dv->btv", x.astype(np.float64), w.astype(np.float64)).reshape(-1, v)
  kept = y.reshape(-1) >= 0
  logits, target = logits[kept], y.reshape(-1)[kept]
  pred = logits.argmax(-1)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  confusion = skm.confusion_matrix(target, pred, labels=range(v))
  negatives = confusion.sum() - confusion.sum(0) - confusion.sum(1) + np.diag(confusion)
  specificity = negatives / (negatives + confusion.sum(0) - np.diag(confusion))
  expected = {
    "precision": skm.precision_score(target, pred, average="macro", zero_division=0),
    "recall": skm.recall_score(target, pred, average="weighted", zero_division=0),
    "specificity": specificity.mean(),
    "balanced": skm.balanced_accuracy_score(target, pred),
    "jaccard": skm.jaccard_score(target, pred, average="micro"),
    "mcc": skm.matthews_corrcoef(target, pred),
    "kappa": skm.cohen_kappa_score(target, pred),
    "confusion": confusion,
    "zero_one": np.mean(pred != target),
    "macro_accuracy": skm.recall_score(target, pred, average="macro", zero_division=0),
    "auroc_exact": skm.roc_auc_score(target, probs, multi_class="ovr", average="macro"),
    "auprc_exact": skm.average_precision_score(np.eye(v)[target], probs, average="macro"),
  }
  assert results["num_examples"] == n
  for key, want in expected.items():
    np.testing.assert_allclose(results[key], want, rtol=1e-5, atol=1e-7, err_msg=key)
