"""CohenKappa ``weights="linear" | "quadratic"`` and ``replace_undefined_by`` against
scikit-learn's ``cohen_kappa_score`` (issue 31), on garbage-padded uneven batches and 8
devices."""

from __future__ import annotations

import math
import warnings

import jax
import numpy as np
import pytest
import sklearn.metrics as skm
from metric_cases import MetricCase, padded_batches, real
from metric_checks import (
  check_eager,
  check_jit_traces_once,
  check_masked_eval_on_8_devices,
  check_pmap,
)

import padded_eval as pe

M = pe.metrics
C = 5


def _data(task, constant=None):
  def fields(rng, b):
    if task == "binary":
      target = rng.integers(0, 2, b)
      preds = np.where(rng.random(b) < 0.7, target, 1 - target).astype(np.float32)
      preds = np.where(preds > 0.5, rng.uniform(0.6, 1, b), rng.uniform(0, 0.4, b))
    else:  # ordinal classes, predictions near the target
      target = rng.integers(0, C, b)
      preds = np.clip(target + rng.integers(-1, 2, b), 0, C - 1)
    if constant is not None:
      target = np.full(b, constant)
      preds = np.full(b, 0.9 if constant else 0.1) if task == "binary" else target
    dtype = np.float32 if task == "binary" else np.int32
    return {"preds": np.asarray(preds).astype(dtype), "target": target.astype(np.int32)}

  return lambda rng: padded_batches(rng, fields, batch_size=16)


def _reference(task, weights, replace_undefined_by):
  def reference(bs):
    target, preds = real(bs, "target"), real(bs, "preds")
    guess = (preds > 0.5).astype(np.int32) if task == "binary" else preds
    labels = [0, 1] if task == "binary" else list(range(C))
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")  # sklearn's UndefinedMetricWarning
      return skm.cohen_kappa_score(
        target, guess, labels=labels, weights=weights, replace_undefined_by=replace_undefined_by
      )

  return reference


def _case(task, weights, replace_undefined_by=0.0, constant=None):
  num_classes = None if task == "binary" else C
  return MetricCase(
    f"kappa_{task}_{weights}_r{replace_undefined_by}_c{constant}",
    lambda: M.CohenKappa(
      num_classes=num_classes, task=task, weights=weights, replace_undefined_by=replace_undefined_by
    ),
    _data(task, constant),
    _reference(task, weights, replace_undefined_by),
  )


CASES = [
  _case(task, weights)
  for task in ("binary", "multiclass")
  for weights in (None, "linear", "quadratic")
] + [
  _case(task, weights, replace, constant)
  for task, constant in (("binary", 1), ("binary", 0), ("multiclass", 3))
  for weights in (None, "quadratic")
  for replace in (math.nan, -1.0, 0.5)
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_sklearn(case):
  check_eager(case)


@pytest.mark.parametrize(
  "name", ["kappa_multiclass_quadratic_r0.0_cNone", "kappa_multiclass_None_rnan_c3"]
)
def test_device_checks(name):
  case = next(c for c in CASES if c.name == name)
  check_pmap(case)
  check_jit_traces_once(case)


@pytest.mark.parametrize("case", CASES[::3], ids=lambda c: c.name)
def test_through_masked_eval_on_8_devices(case):
  check_masked_eval_on_8_devices(case, atol=1e-7)


def test_nan_is_one_configuration():
  a = M.CohenKappa(num_classes=3, replace_undefined_by=float("nan"))
  b = M.CohenKappa(num_classes=3, replace_undefined_by=float("nan"))
  assert jax.tree.structure(a) == jax.tree.structure(b)


@pytest.mark.parametrize("bad", [2.0, -1.5, "nan", None, True])
def test_bad_replace_undefined_by_names_the_argument(bad):
  with pytest.raises(ValueError, match="replace_undefined_by"):
    M.CohenKappa(num_classes=3, replace_undefined_by=bad)


@pytest.mark.parametrize("value", [np.int64(1), np.int32(0), np.int64(-1)])
def test_numpy_integer_replace_undefined_by_is_accepted(value):
  # one class in preds and target: kappa is undefined
  preds, target = np.array([0, 0, 0]), np.array([0, 0, 0])
  got = M.CohenKappa(num_classes=3, replace_undefined_by=value)
  got = got.update(preds=preds, target=target).compute()
  with warnings.catch_warnings():  # sklearn warns that kappa is undefined here
    warnings.simplefilter("ignore")
    want = skm.cohen_kappa_score(target, preds, replace_undefined_by=float(value))
  assert float(got) == want
