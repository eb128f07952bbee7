"""StatScores, NPV, BalancedAccuracy, HammingLoss and ZeroOneLoss against scikit-learn.

One row per metric also sits in ``tests/metric_cases.py`` (every generic check). Here:
more tasks and options eagerly on garbage-padded batches, and through
``pe.masked_eval`` on 8 devices. NPV and StatScores have no scikit-learn function: the
references are float64 numpy on scikit-learn's ``multilabel_confusion_matrix``
(torchmetrics' documented formulas).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import sklearn.metrics as skm
from metric_cases import MetricCase, padded_batches, real
from metric_checks import check_eager
from test_confusion import run_masked_eval

import padded_eval as pe

M = pe.metrics
C = 5


def _data(task, ignore=None):
  def fields(rng, b):
    if task == "binary":
      preds, target = rng.random(b), rng.integers(0, 2, b)
    elif task == "multilabel":
      preds, target = rng.random((b, C)), (rng.random((b, C)) < 0.4)
    else:
      preds, target = rng.standard_normal((b, C)), rng.integers(0, C, b)
    target = target.astype(np.int32)
    if ignore is not None:
      target = np.where(rng.random(target.shape) < 0.15, ignore, target).astype(np.int32)
    return {"preds": preds.astype(np.float32), "target": target}

  return lambda rng: padded_batches(rng, fields, batch_size=16)


def _kept(bs, task, ignore=None):
  """(y_true, y_pred, kept): multiclass / binary filtered; multilabel with a kept mask."""
  preds, target = real(bs, "preds"), real(bs, "target")
  guess = np.argmax(preds, -1) if task == "multiclass" else (preds > 0.5).astype(np.int32)
  keep = target != ignore if ignore is not None else np.ones(target.shape, bool)
  if task == "multilabel":
    return target, guess, keep
  return target[keep], guess[keep], None


def _mcm(yt, yp, task):
  labels = [1] if task == "binary" else list(range(C))
  mcm = skm.multilabel_confusion_matrix(yt, yp, labels=None if task == "multilabel" else labels)
  return (mcm[:, i, j].astype(np.float64) for i, j in ((0, 0), (0, 1), (1, 0), (1, 1)))


def _npv(task, average):
  def reference(bs):
    tn, fp, fn, tp = _mcm(*_kept(bs, task)[:2], task)
    ratio = lambda a, b: np.where(b > 0, a / np.where(b > 0, b, 1), 0.0)
    if task == "binary":
      return ratio(tn, tn + fn)[0]
    if average == "micro":
      return ratio(tn.sum(), (tn + fn).sum())
    per = ratio(tn, tn + fn)
    if average is None:
      return per
    present = (tp + fp + fn > 0) if task == "multiclass" else np.ones(C, bool)
    if average == "macro":
      return per[present].mean()
    return np.sum((tp + fn) * per) / np.sum(tp + fn)

  return reference


def _stat_scores(task, average, ignore=None):
  def reference(bs):
    tn, fp, fn, tp = _mcm(*_kept(bs, task, ignore)[:2], task)
    table = np.stack([tp, fp, tn, fn, tp + fn], -1)
    if ignore is not None and 0 <= ignore < C:
      table[ignore] = np.nan
    if task == "binary":
      return table[0]
    return np.nansum(table, 0) if average == "micro" else table

  return reference


def _quiet(fn):
  def call(*args, **kw):
    with warnings.catch_warnings():  # "y_pred contains classes not in y_true"
      warnings.simplefilter("ignore")
      return fn(*args, **kw)

  return call


def _sklearn(fn, task, ignore=None, **kw):
  def reference(bs):
    yt, yp, kept = _kept(bs, task, ignore)
    if task == "multilabel" and ignore is not None:  # any kept label wrong
      wrong = np.any(kept & (yt != yp), -1)
      return np.mean(wrong[np.any(kept, -1)])
    return _quiet(fn)(yt, yp, **kw)

  return reference


def _case(name, make, task, reference, ignore=None):
  return MetricCase(name, make, _data(task, ignore), reference)


CASES = [
  _case("npv_binary", lambda: M.NPV(task="binary"), "binary", _npv("binary", None)),
  *[
    _case(
      f"npv_{t}_{a}",
      lambda t=t, a=a: M.NegativePredictiveValue(task=t, num_classes=C, average=a),
      t,
      _npv(t, a),
    )
    for t in ("multiclass", "multilabel")
    for a in ("micro", "macro", "weighted", None)
  ],
  _case(
    "stats_binary", lambda: M.StatScores(task="binary"), "binary", _stat_scores("binary", None)
  ),
  _case(
    "stats_multiclass_ignore_class",
    lambda: M.StatScores(num_classes=C, ignore_index=2),
    "multiclass",
    _stat_scores("multiclass", None, ignore=2),
    ignore=2,
  ),
  _case(
    "stats_multiclass_micro",
    lambda: M.StatScores(num_classes=C, average="micro"),
    "multiclass",
    _stat_scores("multiclass", "micro"),
  ),
  _case(
    "stats_multilabel_micro",
    lambda: M.StatScores(task="multilabel", num_classes=C, average="micro"),
    "multilabel",
    _stat_scores("multilabel", "micro"),
  ),
  _case(
    "balanced_binary",
    lambda: M.BalancedAccuracy(task="binary"),
    "binary",
    _sklearn(skm.balanced_accuracy_score, "binary"),
  ),
  _case(
    "balanced_multiclass_adjusted",
    lambda: M.BalancedAccuracy(num_classes=C, adjusted=True),
    "multiclass",
    _sklearn(skm.balanced_accuracy_score, "multiclass", adjusted=True),
  ),
  _case(
    "balanced_multiclass_ignore_class",
    lambda: M.BalancedAccuracy(num_classes=C, ignore_index=1),
    "multiclass",
    _sklearn(skm.balanced_accuracy_score, "multiclass", ignore=1),
    ignore=1,
  ),
  *[
    _case(
      f"hamming_{t}",
      lambda t=t: M.HammingLoss(task=t, num_classes=None if t == "binary" else C),
      t,
      _sklearn(skm.hamming_loss, t),
    )
    for t in ("binary", "multiclass", "multilabel")
  ],
  *[
    _case(
      f"zero_one_{t}",
      lambda t=t: M.ZeroOneLoss(task=t, num_classes=None if t == "binary" else C),
      t,
      _sklearn(skm.zero_one_loss, t),
    )
    for t in ("binary", "multiclass", "multilabel")
  ],
  _case(
    "zero_one_multilabel_ignore",
    lambda: M.ZeroOneLoss(task="multilabel", num_classes=C, ignore_index=-1),
    "multilabel",
    _sklearn(skm.zero_one_loss, "multilabel", ignore=-1),
    ignore=-1,
  ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_sklearn_eager(case):
  check_eager(case)


@pytest.mark.parametrize(
  "name",
  [
    "npv_multiclass_macro",
    "stats_multiclass_ignore_class",
    "balanced_multiclass_adjusted",
    "hamming_multilabel",
    "zero_one_multilabel_ignore",
  ],
)
def test_through_masked_eval_on_8_devices(name):
  got, want = run_masked_eval(next(c for c in CASES if c.name == name))
  np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7, equal_nan=True)


BAD = [
  (lambda: M.StatScores(num_classes=3, average="macro"), "average"),
  (lambda: M.BalancedAccuracy(task="multilabel", num_classes=3), "task"),
  (lambda: M.BalancedAccuracy(num_classes=3, adjusted=1), "adjusted"),
  (lambda: M.ZeroOneLoss(task="binary", threshold=2.0), "threshold"),
  (lambda: M.NPV(num_classes=3, zero_division=0.5), "zero_division"),
]


@pytest.mark.parametrize("make,argname", BAD, ids=[a for _, a in BAD])
def test_bad_config_names_the_argument(make, argname):
  with pytest.raises(ValueError, match=argname):
    make()


def test_weights_are_refused_with_the_fix():
  with pytest.raises(ValueError, match="weights"):
    M.ZeroOneLoss(num_classes=3).update(
      preds=np.array([0, 1]), target=np.array([0, 1]), weights=np.ones(2)
    )


@pytest.mark.parametrize(
  "target,preds",
  [
    ([1, 1, 1], [1, 0, 1]),  # one class in the target, a miss: scikit-learn gives -inf
    ([1, 1, 1], [1, 1, 1]),  # one class, every row right: 0 / 0, NaN
    ([2, 2, 2, 2], [2, 0, 1, 2]),
  ],
)
def test_adjusted_with_one_class_in_the_target_follows_sklearn(target, preds):
  # chance is 1 / 1 with one class in the target: scikit-learn divides by 1 - chance = 0
  target, preds = np.array(target, np.int32), np.array(preds, np.int32)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    want = skm.balanced_accuracy_score(target, preds, adjusted=True)
  pad_t, pad_p = np.array([0, 1, 2**30], np.int32), np.array([2, 0, -7], np.int32)
  mask = np.r_[np.ones(len(target), bool), np.zeros(3, bool)]
  metric = M.BalancedAccuracy(num_classes=3, adjusted=True).update(
    preds=np.r_[preds, pad_p], target=np.r_[target, pad_t], mask=mask
  )
  np.testing.assert_equal(float(metric.compute()), want)


@pytest.mark.parametrize(
  "make",
  [
    lambda n: M.Precision(num_classes=n),
    lambda n: M.Accuracy(num_classes=n, average="macro"),
    lambda n: M.ConfusionMatrix(num_classes=n),
    lambda n: M.BalancedAccuracy(num_classes=n),
  ],
)
def test_num_classes_beyond_int32_ids_is_a_value_error(make):
  # class ids are int32: class 2**31 cannot be named (was RESOURCE_EXHAUSTED at the update)
  with pytest.raises(ValueError, match=r"num_classes.*2\*\*40|num_classes.*1099511627776"):
    make(2**40)
  make(5)
