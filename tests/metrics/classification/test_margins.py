"""HingeLoss (issue 31) against scikit-learn's ``hinge_loss`` (binary, Crammer-Singer, with
``sample_weight``) and a float64 numpy transcription of torchmetrics' ``HingeLoss``
(``squared``, ``multiclass_mode="one-vs-all"``), on garbage-padded uneven batches and 8
devices."""

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
  check_shard_map,
)

import padded_eval as pe

M = pe.metrics
C = 4


def _data(task, weighted):
  def fields(rng, b):
    if task == "binary":
      out = {"preds": 1.5 * rng.standard_normal(b), "target": rng.integers(0, 2, b)}
    else:
      out = {"preds": rng.standard_normal((b, C)), "target": rng.integers(0, C, b)}
    out = {"preds": out["preds"].astype(np.float32), "target": out["target"].astype(np.int32)}
    if weighted:
      out["weights"] = rng.uniform(0.1, 3.0, b).astype(np.float32)
    return out

  def data(rng):
    batches = padded_batches(rng, fields, batch_size=16)
    for b in batches if weighted else ():
      bad = rng.choice([np.nan, np.inf, -7.0], b["mask"].shape)
      b["weights"] = np.where(b["mask"], b["weights"], bad).astype(np.float32)
    return batches

  return data


def _torchmetrics_hinge(scores, target, task, squared, mode, w):
  """torchmetrics 1.9's _binary/_multiclass_hinge_loss_update, in float64 (weights added)."""
  if task == "binary":
    margin = np.where(target == 1, scores, -scores)
  else:
    onehot = np.eye(C, dtype=bool)[target]
    if mode == "crammer-singer":
      margin = scores[onehot] - np.max(scores[~onehot].reshape(len(target), -1), axis=1)
    else:
      margin = np.where(onehot, scores, -scores)
  measures = np.clip(1 - margin, 0, None)
  if squared:
    measures = measures**2
  w = w.reshape(w.shape + (1,) * (measures.ndim - 1))
  return np.sum(w * measures, axis=0) / np.sum(w)


def _reference(task, squared, mode, weighted):
  def reference(bs):
    scores, target = real(bs, "preds"), real(bs, "target")
    w = real(bs, "weights") if weighted else np.ones(len(target))
    if not squared and mode == "crammer-singer":  # scikit-learn's hinge_loss
      labels = None if task == "binary" else list(range(C))
      return skm.hinge_loss(target, scores, labels=labels, sample_weight=w)
    return _torchmetrics_hinge(scores, target, task, squared, mode, w)

  return reference


def _case(task, squared=False, mode="crammer-singer", weighted=False):
  num_classes = None if task == "binary" else C
  return MetricCase(
    f"hinge_{task}_sq{int(squared)}_{mode}_w{int(weighted)}",
    lambda: M.HingeLoss(task=task, num_classes=num_classes, squared=squared, multiclass_mode=mode),
    _data(task, weighted),
    _reference(task, squared, mode, weighted),
  )


CASES = [
  _case("binary", squared, weighted=weighted)
  for squared in (False, True)
  for weighted in (False, True)
] + [
  _case("multiclass", squared, mode, weighted)
  for squared in (False, True)
  for mode in ("crammer-singer", "one-vs-all")
  for weighted in (False, True)
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_peers(case):
  check_eager(case)


@pytest.mark.parametrize(
  "name", ["hinge_multiclass_sq0_crammer-singer_w1", "hinge_multiclass_sq1_one-vs-all_w0"]
)
def test_device_checks(name):
  case = next(c for c in CASES if c.name == name)
  check_pmap(case)
  check_shard_map(case)
  check_jit_traces_once(case)


@pytest.mark.parametrize("case", CASES[::3], ids=lambda c: c.name)
def test_through_masked_eval_on_8_devices(case):
  check_masked_eval_on_8_devices(case, atol=1e-7)


def test_invalid_elements_are_counted_and_left_out():
  scores = np.array([[1.0, 0.0, 0.0], [np.nan, 0.0, 1.0], [0.0, 2.0, 0.0]], np.float32)
  target = np.array([0, 1, 7])
  m = M.HingeLoss(task="multiclass", num_classes=3).update(preds=scores, target=target)
  assert m.invalid_counts() == {"target out of range": 1, "nan score": 1}
  np.testing.assert_allclose(float(m.compute()), skm.hinge_loss([0], scores[:1], labels=[0, 1, 2]))


@pytest.mark.parametrize(
  "kwargs, match",
  [
    ({"task": "multilabel", "num_classes": 3}, "task"),
    ({"task": "multiclass"}, "num_classes"),
    ({"squared": 1}, "squared"),
    ({"task": "multiclass", "num_classes": 3, "multiclass_mode": "ovr"}, "multiclass_mode"),
  ],
)
def test_bad_configuration_names_the_argument(kwargs, match):
  with pytest.raises(ValueError, match=match):
    M.HingeLoss(**kwargs)
