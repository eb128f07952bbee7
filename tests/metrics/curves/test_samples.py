"""Multilabel AUROC / AUPRC ``average="samples"`` (issue 31) against scikit-learn's
``roc_auc_score`` / ``average_precision_score(average="samples")`` on garbage-padded uneven
batches (tied scores, ignored labels) and on 8 devices."""

from __future__ import annotations

import warnings

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
C = 6
IGNORED = -1


def _data(ties, ignore):
  def fields(rng, b):
    target = (rng.random((b, C)) < 0.4).astype(np.int32)
    preds = 1 / (1 + np.exp(-(1.2 * target - 0.6 + rng.standard_normal((b, C)))))
    if ties:
      preds = np.round(preds, 1)
    if ignore:
      target = np.where(rng.random((b, C)) < 0.15, IGNORED, target)
    return {"preds": preds.astype(np.float32), "target": target.astype(np.int32)}

  return lambda rng: padded_batches(rng, fields, batch_size=16)


def _reference(name):
  def reference(bs):
    target, scores = real(bs, "target"), real(bs, "preds")
    values = []
    for t, s in zip(target, scores):  # sklearn's "samples": one binary problem per row
      keep = t != IGNORED
      t, s = t[keep], s[keep]
      if name == "auroc":
        if len(set(t.tolist())) < 2:
          continue  # sklearn raises on a row of one class: not a row here
        values.append(skm.roc_auc_score(t, s))
      elif len(t):
        with warnings.catch_warnings():
          warnings.simplefilter("ignore")  # "no positive class": AP 0, as sklearn's mean
          values.append(skm.average_precision_score(t, s))
    return np.mean(values)

  return reference


def _case(name, ties, ignore):
  cls = M.AUROC if name == "auroc" else M.AUPRC
  return MetricCase(
    f"samples_{name}_ties{int(ties)}_ignore{int(ignore)}",
    lambda: cls(
      task="multilabel",
      num_classes=C,
      average="samples",
      ignore_index=IGNORED if ignore else None,
    ),
    _data(ties, ignore),
    _reference(name),
  )


CASES = [
  _case(name, ties, ignore)
  for name in ("auroc", "auprc")
  for ties in (False, True)
  for ignore in (False, True)
]


def test_no_ignored_rows_equal_sklearn_directly():
  case = _case("auprc", True, False)
  batches = case.batches()
  got = case.make()
  for b in batches:
    got = got.update(**b)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    want = skm.average_precision_score(
      real(batches, "target"), real(batches, "preds"), average="samples"
    )
  np.testing.assert_allclose(float(got.compute()), want, rtol=2e-6)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_sklearn(case):
  check_eager(case)


@pytest.mark.parametrize("name", ["samples_auroc_ties1_ignore1", "samples_auprc_ties0_ignore0"])
def test_device_checks(name):
  case = next(c for c in CASES if c.name == name)
  check_pmap(case)
  check_shard_map(case)
  check_jit_traces_once(case)


@pytest.mark.parametrize("case", CASES[::2], ids=lambda c: c.name)
def test_through_masked_eval_on_8_devices(case):
  check_masked_eval_on_8_devices(case, atol=1e-7)


def test_exact_value_has_zero_bound_and_no_curve():
  case = CASES[0]
  m = case.make().update(**case.batches()[0])
  assert float(m.error_bound()) == 0.0
  with pytest.raises(ValueError, match="samples"):
    m.curve()


@pytest.mark.parametrize(
  "make",
  [
    lambda: M.AUROC(task="binary", average="samples"),
    lambda: M.AUROC(task="multiclass", num_classes=3, average="samples"),
    lambda: M.AUROC(task="multilabel", num_classes=3, average="samples", exact=True, capacity=8),
    lambda: M.AUPRC(task="multilabel", num_classes=3, average="samples", thresholds=5),
    lambda: M.AUROC(task="multilabel", num_classes=3, average="samples", max_fpr=0.5),
    lambda: M.EER(task="multilabel", num_classes=3, average="samples"),
  ],
)
def test_refused_configurations_name_the_argument(make):
  with pytest.raises(ValueError, match="samples"):
    make()
