"""ConfusionMatrix(weighted=True) against scikit-learn's ``sample_weight`` (issue 31), on
garbage-padded uneven batches (NaN / inf / negative weights on padded rows) and 8 devices.

Integer weights are summed exactly (every cell an integer below ``2**24``): the counts equal
scikit-learn's bit for bit; float weights are within float32 rounding of the float64 sums.
"""

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


def _data(task, integer_weights):
  def fields(rng, b):
    if task == "multilabel":
      out = {
        "preds": rng.random((b, C)).astype(np.float32),
        "target": (rng.random((b, C)) < 0.4).astype(np.int32),
      }
    elif task == "binary":
      out = {"preds": rng.random(b).astype(np.float32), "target": rng.integers(0, 2, b)}
    else:
      out = {
        "preds": rng.standard_normal((b, C)).astype(np.float32),
        "target": rng.integers(0, C, b),
      }
    out["target"] = out["target"].astype(np.int32)
    w = rng.integers(0, 5, b) if integer_weights else rng.uniform(0.01, 3.0, b)
    out["weights"] = w.astype(np.float32)
    return out

  def data(rng):
    batches = padded_batches(rng, fields, batch_size=16)
    for b in batches:  # padded weights: garbage that would poison any sum it reached
      bad = rng.choice([np.nan, np.inf, -7.0, 1e30], b["mask"].shape)
      b["weights"] = np.where(b["mask"], b["weights"], bad).astype(np.float32)
    return batches

  return data


def _reference(task, normalize):
  def reference(bs):
    target, preds, w = real(bs, "target"), real(bs, "preds"), real(bs, "weights")
    if task == "multilabel":
      return skm.multilabel_confusion_matrix(
        target, (preds > 0.5).astype(np.int32), sample_weight=w
      ).astype(np.float64)
    if task == "binary":
      guess, labels = (preds > 0.5).astype(np.int32), [0, 1]
    else:
      guess, labels = np.argmax(preds, -1), list(range(C))
    return skm.confusion_matrix(target, guess, labels=labels, sample_weight=w, normalize=normalize)

  return reference


def _case(task, normalize=None, integer_weights=False):
  num_classes = None if task == "binary" else C
  return MetricCase(
    f"weighted_confusion_{task}_{normalize}_int{int(integer_weights)}",
    lambda: M.ConfusionMatrix(num_classes, task=task, normalize=normalize, weighted=True),
    _data(task, integer_weights),
    _reference(task, normalize),
  )


CASES = [
  _case(task, None, integer)
  for task in ("multiclass", "binary", "multilabel")
  for integer in (False, True)
] + [_case("multiclass", normalize) for normalize in ("true", "pred", "all")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_sklearn_sample_weight(case):
  check_eager(case)


@pytest.mark.parametrize("task", ["multiclass", "binary", "multilabel"])
def test_integer_weights_are_exact(task):
  case = _case(task, None, integer_weights=True)
  batches = case.batches()
  metric = case.make()
  for b in batches:
    metric = metric.update(**b)
  np.testing.assert_array_equal(metric.counts(), case.reference(batches))


@pytest.mark.parametrize("name", ["weighted_confusion_multiclass_None_int0"])
def test_device_checks(name):
  case = next(c for c in CASES if c.name == name)
  check_pmap(case)
  check_shard_map(case)
  check_jit_traces_once(case)


@pytest.mark.parametrize("case", CASES[::2], ids=lambda c: c.name)
def test_through_masked_eval_on_8_devices(case):
  check_masked_eval_on_8_devices(case, atol=1e-6)


def test_weights_need_weighted_true():
  with pytest.raises(ValueError, match="weights"):
    M.ConfusionMatrix(3).update(preds=np.array([0, 1]), target=np.array([0, 1]), weights=np.ones(2))
  with pytest.raises(ValueError, match="weighted"):
    M.ConfusionMatrix(3, weighted="yes")
