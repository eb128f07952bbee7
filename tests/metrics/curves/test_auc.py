"""AUROC / AUPRC (binned histograms) and CalibrationError against scikit-learn / numpy.

Table rows use scores in the exact modes (probabilities on the linear grid
``k / (num_thresholds - 1)``, logits on the logit grid ``-64 + 128 k / (num_thresholds - 1)``,
here multiples of 1/8), so the
binned areas must equal scikit-learn's to float32 rounding; the default binning of
arbitrary scores is checked on 10k examples against the documented 1e-3 and against
``AUROC.error_bound``. Padded rows hold NaN / inf scores and garbage labels.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import sklearn.metrics as skm
from _metrics_shared import CHECKS
from metric_cases import MetricCase, padded_batches, real
from metric_checks import check_eager
from sklearn.preprocessing import label_binarize

import padded_eval as pe

M = pe.metrics
C = 4


def _grid(values, steps):
  return (np.round(values * steps) / steps).astype(np.float32)


def _data(task, *, logits=False, ignore=None):
  def fields(rng, b):
    shape = (b, C) if task != "binary" else (b,)
    if logits:  # on the logit grid of 1025 bins: multiples of 1/8 (with ties)
      preds = _grid(rng.standard_normal(shape) * 2, 8)
    else:
      preds = _grid(rng.random(shape), 1000)
    if task == "multiclass":
      target = rng.integers(0, C, b)
    else:
      target = (rng.random(shape) < 0.4).astype(np.int32)
    if ignore is not None:
      target = np.where(rng.random(target.shape) < 0.15, ignore, target)
    return {"preds": preds, "target": target.astype(np.int32)}

  return lambda rng: padded_batches(rng, fields, batch_size=16, num_batches=4)


def _curve_reference(kind, task, average, ignore=None):
  score = skm.roc_auc_score if kind == "auroc" else skm.average_precision_score

  def reference(bs):
    preds, target = real(bs, "preds"), real(bs, "target")
    if task == "binary":
      keep = (target == 0) | (target == 1)
      return score(target[keep], preds[keep])
    if task == "multiclass":
      keep = (target >= 0) & (target != ignore)
      truth, preds = label_binarize(target[keep], classes=range(C)), preds[keep]
      classes = [c for c in range(C) if c != ignore]
      value = score(truth[:, classes], preds[:, classes], average=average)
      if average is None:
        full = np.full(C, np.nan)
        full[classes] = value
        return full
      return value
    if average == "micro":
      keep = (target == 0) | (target == 1)
      return score(target[keep], preds[keep])
    per_label = np.array(
      [score(target[target[:, j] >= 0, j], preds[target[:, j] >= 0, j]) for j in range(C)]
    )
    if average is None:
      return per_label
    weight = np.ones(C) if average == "macro" else (target == 1).sum(0)
    return np.sum(weight * per_label) / np.sum(weight)

  return reference


def _curve_case(kind, task, average="macro", *, logits=False, ignore=None, suffix="", exact=False):
  cls = M.AUROC if kind == "auroc" else M.AUPRC
  logit_grid = {"num_thresholds": 1025, "binning": "logit"}  # logits k / 8: a bin each
  grid = logit_grid if logits else {"num_thresholds": 1001, "binning": "linear"}
  if exact:  # every score kept: 64 >= the 48 rows of a case
    grid, suffix = {"exact": True, "capacity": 64}, suffix + "_exact"
  make = lambda: cls(
    task=task,
    num_classes=None if task == "binary" else C,
    average=average,
    from_logits=logits,
    ignore_index=ignore,
    **grid,
  )
  return MetricCase(
    f"{kind}_{task}_{average}{suffix}",
    make,
    _data(task, logits=logits, ignore=ignore),
    _curve_reference(kind, task, average, ignore),
    rtol=1e-5,
    atol=1e-6,
  )


CURVE_CASES = [
  case
  for kind in ("auroc", "auprc")
  for case in (
    [
      _curve_case(kind, "binary"),
      _curve_case(kind, "binary", logits=True, suffix="_logits"),
      _curve_case(kind, "binary", ignore=-1, suffix="_ignore"),
      _curve_case(kind, "multiclass", "macro", ignore=2, suffix="_ignore_class"),
    ]
    + [
      _curve_case(kind, t, a)
      for t in ("multilabel", "multiclass")
      for a in ("macro", "weighted", "micro", None)
    ]
    + [_curve_case(kind, "multilabel", "macro", ignore=-1, logits=True, suffix="_logits_ignore")]
    + [
      _curve_case(kind, "binary", exact=True),
      _curve_case(kind, "binary", logits=True, suffix="_logits", exact=True),
      _curve_case(kind, "multiclass", "macro", ignore=2, suffix="_ignore_class", exact=True),
      _curve_case(kind, "multiclass", "micro", exact=True),
      _curve_case(kind, "multilabel", "weighted", exact=True),
      _curve_case(kind, "multilabel", None, ignore=-1, logits=True, suffix="_ignore", exact=True),
    ]
  )
]


def _ece_reference(task, n_bins, norm, from_logits=False, ignore=None):
  def reference(bs):
    preds, target = real(bs, "preds"), real(bs, "target")
    if task == "binary":
      keep = ((target == 0) | (target == 1)) & (target != ignore)
      conf = 1 / (1 + np.exp(-preds[keep])) if from_logits else preds[keep]
      hit = target[keep] == 1
    else:
      keep = (target >= 0) & (target < C) & (target != ignore)
      probs = preds[keep]
      if from_logits:
        probs = np.exp(probs - probs.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
      conf, hit = probs.max(-1), probs.argmax(-1) == target[keep]
    bins = np.minimum(np.floor(conf.astype(np.float32) * np.float32(n_bins)), n_bins - 1)
    gaps, shares = [], []
    for b in np.unique(bins):
      inside = bins == b
      gaps.append(abs(hit[inside].mean() - conf[inside].mean()))
      shares.append(inside.mean())
    gaps, shares = np.array(gaps), np.array(shares)
    return {
      "l1": np.sum(shares * gaps),
      "l2": np.sqrt(np.sum(shares * gaps**2)),
      "max": np.max(gaps),
    }[norm]

  return reference


def _ece_case(task, norm, n_bins=10, from_logits=False, ignore=None, suffix=""):
  def fields(rng, b):
    if task == "binary":
      preds = rng.standard_normal(b) if from_logits else rng.random(b)
      target = (rng.random(b) < np.clip(preds if not from_logits else 0.5, 0, 1)).astype(int)
    else:
      preds = rng.standard_normal((b, C)) * 2
      if not from_logits:
        preds = np.exp(preds) / np.exp(preds).sum(-1, keepdims=True)
      target = rng.integers(0, C, b)
    if ignore is not None:
      target = np.where(rng.random(b) < 0.15, ignore, target)
    return {"preds": preds.astype(np.float32), "target": target.astype(np.int32)}

  make = lambda: M.CalibrationError(
    n_bins,
    task=task,
    num_classes=None if task == "binary" else C,
    norm=norm,
    from_logits=from_logits,
    ignore_index=ignore,
  )
  return MetricCase(
    f"ece_{task}_{norm}{suffix}",
    make,
    lambda rng: padded_batches(rng, fields, batch_size=16, num_batches=4),
    _ece_reference(task, n_bins, norm, from_logits, ignore),
  )


ECE_CASES = (
  [_ece_case("binary", n) for n in ("l1", "l2", "max")]
  + [_ece_case("multiclass", n) for n in ("l1", "l2", "max")]
  + [
    _ece_case("binary", "l1", from_logits=True, ignore=-1, suffix="_logits_ignore"),
    _ece_case("multiclass", "l1", n_bins=15, from_logits=True, ignore=1, suffix="_logits_ignore"),
  ]
)

CASES = CURVE_CASES + ECE_CASES
_OTHER_CHECKS = {c.__name__.removeprefix("check_"): c for c in CHECKS if c is not check_eager}
# Every generic check on one curve row; the main ones on one calibration row.
PROTOCOL = (
  [("auroc_binary_macro_logits", c) for c in _OTHER_CHECKS]
  + [("auprc_multilabel_None_ignore_exact", c) for c in _OTHER_CHECKS]
) + [("ece_multiclass_l1_logits_ignore", c) for c in ("scan", "pmap", "empty_state")]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_matches_reference_eager(case):
  check_eager(case)


@pytest.mark.parametrize("name,check", PROTOCOL, ids=[f"{c}-{n}" for n, c in PROTOCOL])
def test_protocol(name, check):
  _OTHER_CHECKS[check](next(case for case in CASES if case.name == name))


# --- default binning on 10k examples -----------------------------------------------------


def _scores(kind, rng, n):
  target = (rng.random(n) < 0.3).astype(np.int32)
  if kind == "uniform":
    return rng.random(n).astype(np.float32), target, False
  logits = (rng.normal(0, 6, n) + np.where(target == 1, 3.0, -3.0)).astype(np.float32)
  if kind == "confident_logits":
    return logits, target, True
  return (1 / (1 + np.exp(-logits.astype(np.float64)))).astype(np.float32), target, False


@pytest.mark.parametrize("kind", ["uniform", "confident_probs", "confident_logits"])
def test_default_bins_within_1e_3_on_10k(kind):
  preds, target, from_logits = _scores(kind, np.random.default_rng(7), 10_000)
  padded = np.concatenate([preds, np.full(240, np.nan, np.float32)])
  labels = np.concatenate([target, np.full(240, -1, np.int32)])
  mask = np.arange(padded.size) < preds.size
  auroc = M.AUROC(from_logits=from_logits).update(preds=padded, target=labels, mask=mask)
  auprc = M.AUPRC(from_logits=from_logits).update(preds=padded, target=labels, mask=mask)
  exact_roc = skm.roc_auc_score(target, preds.astype(np.float64))
  error = abs(float(auroc.compute()) - exact_roc)
  assert error <= float(auroc.error_bound()) + 1e-6
  assert error < 1e-3
  assert abs(float(auprc.compute()) - skm.average_precision_score(target, preds)) < 1e-3


def test_linear_bins_are_exact_on_their_grid():
  rng = np.random.default_rng(0)
  target = (rng.random(10_000) < 0.5).astype(np.int32)
  preds = _grid(np.clip(rng.normal(0.5 + 0.1 * target, 0.2), 0, 1), 10_000)  # many ties
  for cls, score in ((M.AUROC, skm.roc_auc_score), (M.AUPRC, skm.average_precision_score)):
    metric = cls(10_001, binning="linear").update(preds=preds, target=target)
    assert abs(float(metric.compute()) - score(target, preds)) < 1e-6


def test_undefined_areas_are_nan():
  only_positives = {"preds": jnp.array([0.2, 0.7]), "target": jnp.array([1, 1])}
  assert np.isnan(float(M.AUROC(11).update(**only_positives).compute()))
  assert float(M.AUPRC(11).update(**only_positives).compute()) == 1.0
  only_negatives = {"preds": jnp.array([0.2, 0.7]), "target": jnp.array([0, 0])}
  assert np.isnan(float(M.AUPRC(11).update(**only_negatives).compute()))
  # A label without positives is left out of the macro mean.
  preds = jnp.array([[0.9, 0.1], [0.2, 0.3], [0.6, 0.8]])
  target = jnp.array([[1, 0], [0, 0], [1, 0]])
  per_label = (
    M.AUROC(11, binning="linear", task="multilabel", num_classes=2, average=None)
    .update(preds=preds, target=target)
    .compute()
  )
  assert float(per_label[0]) == 1.0 and np.isnan(float(per_label[1]))
  assert (
    float(
      M.AUROC(11, binning="linear", task="multilabel", num_classes=2)
      .update(preds=preds, target=target)
      .compute()
    )
    == 1.0
  )


BAD_CONFIGS = [
  (lambda: M.AUROC(1), "num_thresholds"),
  (lambda: M.AUROC(2**22), "num_thresholds"),
  (lambda: M.AUPRC(binning="log"), "binning"),
  (lambda: M.AUROC(task="multiclass"), "num_classes"),
  (lambda: M.AUROC(task="binary", num_classes=4), "num_classes"),
  (lambda: M.AUPRC(task="binary", average="samples"), "average"),  # samples: multilabel only
  (lambda: M.CalibrationError(0), "n_bins"),
  (lambda: M.CalibrationError(norm="L1"), "norm"),
  (lambda: M.CalibrationError(task="multilabel", num_classes=3), "task"),
]


@pytest.mark.parametrize("make,argname", BAD_CONFIGS, ids=[a for _, a in BAD_CONFIGS])
def test_bad_config_names_the_argument(make, argname):
  with pytest.raises(ValueError, match=argname):
    make()
