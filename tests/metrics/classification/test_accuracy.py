"""Accuracy ``average=`` (micro / macro / weighted / None), multilabel and ``ignore_index``
(issue 31) against scikit-learn on garbage-padded uneven batches, and on 8 devices.

torchmetrics' ``MulticlassAccuracy`` averages per-class recall (``macro``: over the
classes in the target or the predictions); that is scikit-learn's ``recall_score`` with
``labels=`` those classes. ``MultilabelAccuracy`` scores each label's ``(tp + tn) / n``:
scikit-learn's ``accuracy_score`` on the label's column. Sample weights go in as
``sample_weight``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import sklearn.metrics as skm
from metric_cases import MetricCase, padded_batches, real
from metric_checks import (
  check_eager,
  check_jit_traces_once,
  check_masked_eval_on_8_devices,
  check_pmap,
  check_shard_map,
)

import padded_eval as pe

M = pe.metrics
C = 5
IGNORED = 2  # an in-range ignore_index
AVERAGES = ("micro", "macro", "weighted", None)


def _fields(task, weighted, ignore_index):
  def fields(rng, b):
    if task == "multilabel":
      preds = rng.random((b, C)).astype(np.float32)
      target = (rng.random((b, C)) < 0.4).astype(np.int32)
      target[:, 0] = 0  # a label never true
      if ignore_index is not None:
        target = np.where(rng.random((b, C)) < 0.2, ignore_index, target).astype(np.int32)
    else:
      preds = rng.standard_normal((b, C)).astype(np.float32)
      preds[:, 4] -= 10.0  # class 4 is never predicted ...
      target = rng.integers(0, C - 1, b).astype(np.int32)  # ... nor true: left out of macro
      if ignore_index is not None:
        target = np.where(rng.random(b) < 0.25, ignore_index, target).astype(np.int32)
    out = {"preds": preds, "target": target}
    if weighted:
      out["weights"] = rng.integers(1, 4, b).astype(np.float32)  # integer weights: exact
    return out

  return lambda rng: padded_batches(rng, fields, batch_size=16)


def _multiclass_reference(average, weighted, ignore_index, top_k=1):
  def reference(bs):
    target, scores = real(bs, "target"), real(bs, "preds")
    w = real(bs, "weights") if weighted else np.ones(len(target))
    keep = target != ignore_index if ignore_index is not None else np.ones(len(target), bool)
    target, scores, w = target[keep], scores[keep], w[keep]
    if top_k > 1:  # the target among the k best is a hit of its class
      best = np.argsort(-scores, axis=-1, kind="stable")[:, :top_k]
      hit = np.any(best == target[:, None], axis=-1)
      support = np.array([np.sum(w[target == c]) for c in range(C)])
      hits = np.array([np.sum(w[(target == c) & hit]) for c in range(C)])
      recall = np.where(support > 0, hits / np.where(support > 0, support, 1), 0.0)
      present = support > 0
      if average == "micro":
        return np.sum(hits) / np.sum(support)
      if average is None:
        return recall
      weights = support if average == "weighted" else present.astype(np.float64)
      return np.sum(weights * recall) / np.sum(weights)
    pred = np.argmax(scores, -1)
    classes = [c for c in range(C) if c != ignore_index]
    if average == "micro":
      return skm.accuracy_score(target, pred, sample_weight=w)
    if average is None:
      per_class = skm.recall_score(
        target, pred, labels=list(range(C)), average=None, sample_weight=w, zero_division=0
      )
      return np.where(np.arange(C) == ignore_index, np.nan, per_class)
    seen = [c for c in classes if np.any(target == c) or np.any(pred == c)]
    return skm.recall_score(
      target, pred, labels=seen, average=average, sample_weight=w, zero_division=0
    )

  return reference


def _multilabel_reference(average, weighted, ignore_index):
  def reference(bs):
    target, guess = real(bs, "target"), (real(bs, "preds") > 0.5).astype(np.int32)
    w = real(bs, "weights") if weighted else np.ones(len(target))
    keep = np.ones(target.shape, bool) if ignore_index is None else target != ignore_index
    if average == "micro":
      weights = np.broadcast_to(w[:, None], target.shape)[keep]
      return skm.accuracy_score(target[keep], guess[keep], sample_weight=weights)
    per_label, support = [], []
    for j in range(C):
      k = keep[:, j]
      per_label.append(skm.accuracy_score(target[k, j], guess[k, j], sample_weight=w[k]))
      support.append(np.sum(w[k] * target[k, j]))
    per_label, support = np.asarray(per_label), np.asarray(support)
    if average is None:
      return per_label
    if average == "weighted":
      return np.sum(support * per_label) / np.sum(support)
    return np.mean(per_label)

  return reference


def _case(task, average, weighted=False, ignore_index=None, top_k=1):
  name = f"accuracy_{task}_{average}_w{int(weighted)}_ii{ignore_index}_k{top_k}"
  if task == "multilabel":
    reference = _multilabel_reference(average, weighted, ignore_index)
  else:
    reference = _multiclass_reference(average, weighted, ignore_index, top_k)
  return MetricCase(
    name,
    lambda: M.Accuracy(
      top_k=top_k, task=task, average=average, num_classes=C, ignore_index=ignore_index
    ),
    _fields(task, weighted, ignore_index),
    reference,
  )


CASES = (
  [
    _case(task, average, weighted, ignore_index)
    for task in ("multiclass", "multilabel")
    for average in AVERAGES
    for weighted in (False, True)
    for ignore_index in (None, -1 if task == "multilabel" else IGNORED)
  ]
  + [_case("multiclass", average, True, -100) for average in AVERAGES]
  + [_case("multiclass", average, True, None, top_k=2) for average in AVERAGES]
)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_sklearn_eager(case):
  check_eager(case)


@pytest.mark.parametrize(
  "name",
  [
    "accuracy_multiclass_macro_w1_ii2_k1",
    "accuracy_multilabel_weighted_w1_ii-1_k1",
    "accuracy_multiclass_None_w0_iiNone_k1",
  ],
)
def test_device_checks(name):
  case = next(c for c in CASES if c.name == name)
  check_pmap(case)
  check_shard_map(case)
  check_jit_traces_once(case)


@pytest.mark.parametrize("case", CASES[::5], ids=lambda c: c.name)
def test_through_masked_eval_on_8_devices(case):
  check_masked_eval_on_8_devices(case)  # NaN equals NaN: assert_allclose's default


def test_torchmetrics_documented_examples():
  """The values torchmetrics' docs give for MulticlassAccuracy / MultilabelAccuracy."""
  target, preds = np.array([2, 1, 0, 0]), np.array([2, 1, 0, 1])
  macro = M.Accuracy(average="macro", num_classes=3).update(preds=preds, target=target)
  np.testing.assert_allclose(float(macro.compute()), 5 / 6, rtol=1e-6)
  per_class = M.Accuracy(average=None, num_classes=3).update(preds=preds, target=target)
  np.testing.assert_allclose(np.asarray(per_class.compute()), [0.5, 1.0, 1.0])
  target = np.array([[0, 1, 0], [1, 0, 1]])
  probs = np.array([[0.11, 0.22, 0.84], [0.73, 0.33, 0.92]])
  for average, want in (("macro", 2 / 3), (None, [1.0, 0.5, 0.5]), ("micro", 2 / 3)):
    m = M.Accuracy(task="multilabel", average=average, num_classes=3)
    np.testing.assert_allclose(np.asarray(m.update(preds=probs, target=target).compute()), want)


def test_ignored_class_id_is_out_of_the_mean_torchmetrics_scores_it_zero():
  """The one documented difference: an ignored class id that is predicted elsewhere."""
  target, preds = np.array([0, 1, 2, 2]), np.array([0, 1, 1, 2])  # class 1 predicted on a 2
  ours = M.Accuracy(average="macro", num_classes=3, ignore_index=1)
  value = float(ours.update(preds=preds, target=target).compute())
  np.testing.assert_allclose(value, (1.0 + 0.5) / 2)  # classes 0 and 2
  keep = target != 1
  tp = np.array([np.sum((target[keep] == c) & (preds[keep] == c)) for c in range(3)])
  fn = np.array([np.sum(target[keep] == c) for c in range(3)]) - tp
  fp = np.array([np.sum(preds[keep] == c) for c in range(3)]) - tp
  present = tp + fp + fn > 0  # torchmetrics 1.9: class 1 (fp only) counts, scoring 0
  torchmetrics = np.mean(np.where(tp + fn > 0, tp / np.maximum(tp + fn, 1), 0.0)[present])
  assert present[1] and abs(torchmetrics - value) > 0.1


@pytest.mark.parametrize(
  "kwargs, match",
  [
    ({"average": "samples"}, "average"),
    ({"average": "macro"}, "num_classes"),
    ({"task": "multilabel"}, "num_classes"),
    ({"task": "binary", "average": "macro"}, "average"),
    ({"task": "multilabel", "num_classes": 3, "top_k": 2}, "top_k"),
    ({"ignore_index": 1.5}, "ignore_index"),
    ({"average": "macro", "num_classes": 3, "top_k": 4}, "top_k"),
  ],
)
def test_bad_configuration_names_the_argument(kwargs, match):
  with pytest.raises(ValueError, match=match):
    M.Accuracy(**kwargs)


def test_scores_of_another_width_are_refused():
  m = M.Accuracy(average="macro", num_classes=3)
  with pytest.raises(ValueError, match="num_classes=3"):
    m.update(preds=np.zeros((2, 4), np.float32), target=np.array([0, 1]))


def _bool_target_step(params, batch):
  metric = M.Accuracy(task="multiclass", num_classes=10)
  return metric.batch_updates(preds=batch["x"] @ params, target=batch["y"], mask=batch["mask"])


@pytest.mark.parametrize("backend", ["pmap", "jit"])
def test_bool_target_into_multiclass_names_target(backend):
  """Issue 65: bool labels into a 10-class Accuracy read as classes 0 and 1 (accuracy 0.100 where
  the int labels give the model's accuracy); now a ValueError naming ``target``. Two classes
  (``[B, 2]`` scores) still read a bool target as 0 / 1."""
  rng = np.random.default_rng(65)
  x = rng.standard_normal((203, 6)).astype(np.float32)
  w = rng.standard_normal((6, 10)).astype(np.float32)
  labels = (x.astype(np.float64) @ w).argmax(-1)
  labels[::3] = rng.integers(0, 10, len(labels[::3]))
  pad = {"x": np.nan, "y": True}
  with pytest.raises(
    ValueError, match=r"target has dtype bool .* expected int class ids in \[0, 10\)"
  ):
    pe.masked_eval(
      _bool_target_step,
      w,
      pe.pad_batches({"x": x, "y": labels > 4}, 32, pad_value=pad),
      backend=backend,
    )
  ints = pe.pad_batches(
    {"x": x, "y": labels.astype(np.int32)}, 32, pad_value={"x": np.nan, "y": -1}
  )
  got = pe.masked_eval(_bool_target_step, w, ints, backend=backend)
  want = skm.accuracy_score(labels, (x.astype(np.float64) @ w).argmax(-1))
  np.testing.assert_allclose(got["accuracy"], want, rtol=1e-6)
  two = M.Accuracy().update(preds=x @ w[:, :2], target=labels > 4)
  np.testing.assert_allclose(
    float(two.compute()),
    np.mean((x.astype(np.float64) @ w[:, :2]).argmax(-1) == (labels > 4)),
    rtol=1e-6,
  )


def test_a_one_hot_target_is_told_to_pass_class_indices():
  # Issue 65: a one-hot target was blamed on "one score per row is not a class id".
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 4, 13)
  data = {"x": rng.random((13, 4)).astype(np.float32), "y": np.eye(4, dtype=np.float32)[labels]}

  def step(params, batch):
    return pe.metrics.Accuracy().batch_updates(
      preds=batch["x"], target=batch["y"], mask=batch["mask"]
    )

  with pytest.raises(
    ValueError, match=r"one-hot .* class indices: pass jnp.argmax\(target, axis=-1\)"
  ) as e:
    pe.masked_eval(step, None, pe.pad_batches(data, 8), backend="jit")
  assert "one score per row" not in str(e.value)

  def fixed(params, batch):  # what the message says
    target = jnp.argmax(batch["y"], axis=-1)
    return pe.metrics.Accuracy().batch_updates(preds=batch["x"], target=target, mask=batch["mask"])

  got = pe.masked_eval(fixed, None, pe.pad_batches(data, 8), backend="jit")["accuracy"]
  assert got == pytest.approx(skm.accuracy_score(labels, data["x"].argmax(-1)))
