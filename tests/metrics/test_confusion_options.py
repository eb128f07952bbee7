"""The confusion family's peer options (issue 31) against scikit-learn on garbage-padded batches.

``zero_division`` and ``FBetaScore(beta=0 | inf)``: every row is checked eagerly
(``check_eager``), a few run the generic device checks, and every row runs through
``pe.masked_eval`` on 8 devices. The data make ratios undefined on purpose: a class
that is never predicted, one that is never true, multilabel columns that are all 0.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
import sklearn.metrics as skm
from metric_cases import MetricCase, padded_batches, real
from metric_checks import check_eager, check_jit_traces_once, check_pmap_reduce

import padded_eval as pe

M = pe.metrics
C = 5
NAN = float("nan")


def _undefined_data(task):
  """Batches (16 rows, 3 of them real in the last) with undefined per-class ratios."""

  def fields(rng, b):
    if task == "binary":  # never predicted positive: precision undefined
      return {
        "preds": rng.uniform(0.0, 0.45, b).astype(np.float32),
        "target": rng.integers(0, 2, b).astype(np.int32),
      }
    if task == "multilabel":  # label 0 never true nor predicted; label 1 never true
      preds = rng.random((b, C)).astype(np.float32)
      target = (rng.random((b, C)) < 0.4).astype(np.int32)
      preds[:, 0], target[:, :2] = 0.1, 0
      return {"preds": preds, "target": target}
    # class 4 never true, class 3 never predicted
    return {
      "preds": rng.choice([0, 1, 2, 4], b).astype(np.int32),
      "target": rng.integers(0, 4, b).astype(np.int32),
    }

  return lambda rng: padded_batches(rng, fields, batch_size=16)


def _truth_and_guess(bs, task):
  preds, target = real(bs, "preds"), real(bs, "target")
  if task in ("binary", "multilabel"):
    return target.astype(np.int32), (preds > 0.5).astype(np.int32)
  return target, preds


SKLEARN = {
  "precision": (M.Precision, skm.precision_score),
  "recall": (M.Recall, skm.recall_score),
  "f1": (M.F1Score, skm.f1_score),
  "jaccard": (M.JaccardIndex, skm.jaccard_score),
  "f2": (lambda **kw: M.FBetaScore(2.0, **kw), lambda *a, **kw: skm.fbeta_score(*a, beta=2, **kw)),
  "fbeta0": (
    lambda **kw: M.FBetaScore(0, **kw),
    lambda *a, **kw: skm.fbeta_score(*a, beta=0, **kw),
  ),
  "fbeta_inf": (
    lambda **kw: M.FBetaScore(math.inf, **kw),
    lambda *a, **kw: skm.fbeta_score(*a, beta=np.inf, **kw),
  ),
}


def _sklearn_reference(score, task, average, zero_division):
  def reference(bs):
    yt, yp = _truth_and_guess(bs, task)
    kw = {"zero_division": zero_division}
    if task == "binary":
      return SKLEARN[score][1](yt, yp, average="binary", **kw)
    if average is None:
      kw["labels"] = list(range(C))
    return SKLEARN[score][1](yt, yp, average=average, **kw)

  return reference


def _case(score, task, average, zero_division):
  num_classes = None if task == "binary" else C
  return MetricCase(
    f"{score}_{task}_{average}_zd{zero_division}",
    lambda: SKLEARN[score][0](
      task=task, num_classes=num_classes, average=average, zero_division=zero_division
    ),
    _undefined_data(task),
    _sklearn_reference(score, task, average, zero_division),
  )


def _choices(score):
  return (0, 1) if score == "jaccard" else (0, 1, NAN)  # sklearn's jaccard refuses NaN


ZERO_DIVISION_CASES = [
  _case(score, task, average, zd)
  for score in ("precision", "recall", "f1", "jaccard", "f2")
  for task in ("multiclass", "multilabel")
  for average in ("micro", "macro", "weighted", None)
  for zd in _choices(score)
] + [
  _case(score, "binary", None, zd)
  for score in ("precision", "recall", "f1", "jaccard")
  for zd in _choices(score)
]
BETA_LIMIT_CASES = [
  _case(score, task, average, zd)
  for score in ("fbeta0", "fbeta_inf")
  for task, average in (("binary", None), ("multiclass", "macro"), ("multilabel", "weighted"))
  for zd in (0, 1)
]
CASES = ZERO_DIVISION_CASES + BETA_LIMIT_CASES


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_sklearn_eager(case):
  check_eager(case)


@pytest.mark.parametrize(
  "name",
  [
    "f1_multiclass_macro_zdnan",
    "precision_multilabel_weighted_zd1",
    "fbeta_inf_multiclass_macro_zd1",
  ],
)
def test_device_checks(name):
  case = next(c for c in CASES if c.name == name)
  check_pmap_reduce(case)
  check_jit_traces_once(case)


def run_masked_eval(case, backend="pmap"):
  """The case's metric through ``pe.masked_eval`` (8 devices), and the reference."""
  make = case.make

  def step(params, batch):
    return make().batch_updates(preds=batch["preds"], target=batch["target"], mask=batch["mask"])

  batches = case.batches()
  logs = pe.masked_eval(step, None, batches, backend=backend)
  assert logs["num_examples"] == sum(int(np.sum(b["mask"])) for b in batches)
  return np.asarray(logs[make().name], np.float64), case.reference(batches)


@pytest.mark.parametrize("case", CASES[::10], ids=lambda c: c.name)
def test_through_masked_eval_on_8_devices(case):
  assert jax.local_device_count() == 8
  got, want = run_masked_eval(case)
  np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7, equal_nan=True)


def test_zero_division_nan_is_one_configuration():
  """float("nan") objects differ; the metric keeps one, so jit's cache key matches."""
  a = M.F1Score(num_classes=3, zero_division=float("nan"))
  b = M.F1Score(num_classes=3, zero_division=float("nan"))
  assert jax.tree.structure(a) == jax.tree.structure(b)


@pytest.mark.parametrize("bad", [2, -1, 0.5, "nan", None, True])
def test_bad_zero_division_names_the_argument(bad):
  with pytest.raises(ValueError, match="zero_division"):
    M.Precision(num_classes=3, zero_division=bad)


def test_jaccard_refuses_nan_like_sklearn():
  with pytest.raises(ValueError, match="zero_division must be 0 or 1"):
    M.JaccardIndex(num_classes=3, zero_division=NAN)


@pytest.mark.parametrize("bad", [-1.0, NAN, "2", True])
def test_bad_beta_names_the_argument(bad):
  with pytest.raises(ValueError, match="beta"):
    M.FBetaScore(bad, num_classes=3)
