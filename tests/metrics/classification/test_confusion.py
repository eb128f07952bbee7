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
from metric_checks import check_eager, check_jit_traces_once, check_pmap

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
  check_pmap(case)
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


@pytest.mark.parametrize("beta", [np.int64(2), np.int32(2), np.float32(2.0), 2])
def test_numpy_number_beta_is_accepted(beta):
  preds, target = np.array([0, 1, 1, 2, 2, 0]), np.array([0, 1, 2, 2, 1, 1])
  got = M.FBetaScore(beta, num_classes=3).update(preds=preds, target=target).compute()
  want = skm.fbeta_score(target, preds, beta=2.0, average="macro")
  np.testing.assert_allclose(float(got), want, rtol=1e-6)


# --- multidim_average="samplewise" (torchmetrics) and multilabel average="samples" (sklearn) ---

T = 6  # elements per sample (the extra axis)


def _samplewise_data(task):
  def fields(rng, b):
    if task == "binary":
      preds, target = rng.random((b, T)), rng.integers(0, 2, (b, T))
    elif task == "multilabel":
      preds, target = rng.random((b, 3, C)), rng.random((b, 3, C)) < 0.4
    elif task == "multiclass_ids":
      preds, target = rng.integers(0, C, (b, T)), rng.integers(0, C, (b, T))
    else:
      preds, target = rng.standard_normal((b, T, C)), rng.integers(0, C, (b, T))
    dtype = np.int32 if task == "multiclass_ids" else np.float32
    return {"preds": preds.astype(dtype), "target": target.astype(np.int32)}

  return lambda rng: padded_batches(rng, fields, batch_size=16)


def _sample_reference_values(score, task, average, bs):
  """sklearn on each real row's elements: [N] (or [N, C] with average=None)."""
  preds, target = real(bs, "preds"), real(bs, "target")
  values = []
  for p, t in zip(preds, target):
    if task == "multiclass":
      p = np.argmax(p, -1)
    elif task != "multiclass_ids":
      p = (p > 0.5).astype(np.int32)
    if task == "multilabel":
      p, t = p.reshape(-1, C), t.reshape(-1, C)
    kw = {"zero_division": 0}
    if task == "binary":
      kw["average"] = "binary"
    else:
      kw["average"] = average
      if average is None and task != "multilabel":
        kw["labels"] = list(range(C))
    values.append(SKLEARN[score][1](t, p, **kw))
  return np.asarray(values, np.float64)


def _samplewise_case(score, task, average):
  num_classes = None if task == "binary" else C
  metric_task = "multiclass" if task.startswith("multiclass") else task
  return MetricCase(
    f"samplewise_{score}_{task}_{average}",
    lambda: SKLEARN[score][0](
      task=metric_task, num_classes=num_classes, average=average, multidim_average="samplewise"
    ),
    _samplewise_data(task),
    lambda bs: np.mean(_sample_reference_values(score, task, average, bs), axis=0),
  )


SAMPLEWISE_CASES = [
  _samplewise_case(score, task, average)
  for score in ("precision", "recall", "f1", "jaccard")
  for task in ("multiclass", "multiclass_ids", "multilabel")
  for average in ("micro", "macro", "weighted", None)
] + [_samplewise_case(s, "binary", None) for s in ("precision", "recall", "f1", "jaccard", "f2")]


def _samples_case(score, zero_division):
  return MetricCase(
    f"samples_{score}_zd{zero_division}",
    lambda: SKLEARN[score][0](
      task="multilabel", num_classes=C, average="samples", zero_division=zero_division
    ),
    _undefined_data("multilabel"),
    lambda bs: SKLEARN[score][1](
      *_truth_and_guess(bs, "multilabel"), average="samples", zero_division=zero_division
    ),
  )


SAMPLES_CASES = [
  _samples_case(score, zd)
  for score in ("precision", "recall", "f1", "f2", "jaccard")
  for zd in (0, 1)
] + [_samples_case(score, NAN) for score in ("precision", "recall", "f1")]


@pytest.mark.parametrize("case", SAMPLEWISE_CASES + SAMPLES_CASES, ids=lambda c: c.name)
def test_per_sample_matches_sklearn_eager(case):
  check_eager(case)


@pytest.mark.parametrize(
  "name", ["samplewise_f1_multiclass_macro", "samplewise_jaccard_multilabel_None"]
)
def test_samplewise_device_checks(name):
  case = next(c for c in SAMPLEWISE_CASES if c.name == name)
  check_pmap(case)
  check_jit_traces_once(case)


@pytest.mark.parametrize(
  "case",
  [SAMPLEWISE_CASES[1], SAMPLEWISE_CASES[-1], SAMPLES_CASES[2], SAMPLES_CASES[-1]],
  ids=lambda c: c.name,
)
def test_per_sample_through_masked_eval_on_8_devices(case):
  got, want = run_masked_eval(case)
  np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7, equal_nan=True)


def test_sample_values_are_torchmetrics_samplewise_outputs():
  """The [N] per-sample values (padding removed) through masked_eval(outputs=True)."""
  case = next(c for c in SAMPLEWISE_CASES if c.name == "samplewise_f1_multiclass_macro")
  make = case.make

  def step(params, batch):
    metric = make()
    inputs = {"preds": batch["preds"], "target": batch["target"], "mask": batch["mask"]}
    return metric.batch_updates(**inputs), {"f1": metric.sample_values(**inputs)}

  batches = case.batches()
  logs, rows = pe.masked_eval(step, None, batches, backend="pmap", outputs=True)
  want = _sample_reference_values("f1", "multiclass", "macro", batches)
  np.testing.assert_allclose(rows["f1"], want, rtol=2e-6, atol=1e-7)
  np.testing.assert_allclose(logs["f1score"], np.mean(want), rtol=2e-6)


@pytest.mark.parametrize(
  "make,match",
  [
    (lambda: M.F1Score(num_classes=3, average="samples"), "multilabel"),
    (lambda: M.F1Score(num_classes=3, multidim_average="sample"), "multidim_average"),
    (
      lambda: M.F1Score(
        task="multilabel", num_classes=3, average="samples", multidim_average="samplewise"
      ),
      "choose one",
    ),
  ],
)
def test_bad_per_sample_configs(make, match):
  with pytest.raises(ValueError, match=match):
    make()


# --- labels= subsets (scikit-learn's labels) ---------------------------------------------------


def _labels_case(score, task, average, labels):
  def reference(bs):
    yt, yp = _truth_and_guess(bs, task)
    value = SKLEARN[score][1](yt, yp, labels=labels, average=average, zero_division=0)
    if average is None:
      full = np.full(C, np.nan)
      full[labels] = value
      return full
    return value

  return MetricCase(
    f"labels_{score}_{task}_{average}_{''.join(map(str, labels))}",
    lambda: SKLEARN[score][0](task=task, num_classes=C, average=average, labels=labels),
    _undefined_data(task),
    reference,
  )


LABELS_CASES = [
  _labels_case(score, task, average, labels)
  for score in ("precision", "recall", "f1", "jaccard")
  for task in ("multiclass", "multilabel")
  for average in ("micro", "macro", "weighted", None)
  for labels in ([0, 2, 3], [1], [3, 4])
]


@pytest.mark.parametrize("case", LABELS_CASES, ids=lambda c: c.name)
def test_labels_match_sklearn_eager(case):
  check_eager(case)


def test_labels_through_masked_eval_on_8_devices():
  case = next(c for c in LABELS_CASES if c.name == "labels_f1_multiclass_macro_023")
  got, want = run_masked_eval(case)
  np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("bad", [[], [5], [1, 1], [0.5], "01"])
def test_bad_labels_name_the_argument(bad):
  with pytest.raises(ValueError, match="labels"):
    M.F1Score(num_classes=C, labels=bad)
  with pytest.raises(ValueError, match="labels"):
    M.F1Score(task="binary", labels=[1])


# --- sample weights (weighted=True; scikit-learn's sample_weight) -----------------------------


def _weighted_data(task):
  plain = _undefined_data(task)

  def data(rng):
    batches = plain(rng)
    for b in batches:  # weights of padded rows are garbage too
      w = rng.uniform(0.1, 3.0, b["mask"].shape).astype(np.float32)
      b["weights"] = np.where(b["mask"], w, rng.choice([np.nan, np.inf, -5.0], w.shape))
    return batches

  return data


def _weighted_case(score, task, average):
  num_classes = None if task == "binary" else C

  def reference(bs):
    yt, yp = _truth_and_guess(bs, task)
    kw = {"sample_weight": real(bs, "weights"), "zero_division": 0}
    if task == "binary":
      return SKLEARN[score][1](yt, yp, average="binary", **kw)
    if average is None:
      kw["labels"] = list(range(C))
    return SKLEARN[score][1](yt, yp, average=average, **kw)

  return MetricCase(
    f"weighted_{score}_{task}_{average}",
    lambda: SKLEARN[score][0](task=task, num_classes=num_classes, average=average, weighted=True),
    _weighted_data(task),
    reference,
  )


WEIGHTED_CASES = [
  _weighted_case(score, task, average)
  for score in ("precision", "recall", "f1", "jaccard", "f2")
  for task in ("multiclass", "multilabel")
  for average in ("micro", "macro", "weighted", None)
] + [_weighted_case(s, "binary", None) for s in ("precision", "recall", "f1", "jaccard")]


@pytest.mark.parametrize("case", WEIGHTED_CASES, ids=lambda c: c.name)
def test_weighted_matches_sklearn_eager(case):
  check_eager(case)


@pytest.mark.parametrize(
  "name", ["weighted_f1_multiclass_weighted", "weighted_recall_multilabel_macro"]
)
def test_weighted_device_checks_and_masked_eval(name):
  case = next(c for c in WEIGHTED_CASES if c.name == name)
  check_pmap(case)
  check_jit_traces_once(case)
  make = case.make

  def step(params, batch):
    keys = ("preds", "target", "mask", "weights")
    return make().batch_updates(**{k: batch[k] for k in keys})

  batches = case.batches()
  logs = pe.masked_eval(step, None, batches, backend="pmap")
  np.testing.assert_allclose(logs[make().name], case.reference(batches), rtol=2e-6, atol=1e-7)


def test_weights_need_weighted_true():
  with pytest.raises(ValueError, match="weights"):
    M.F1Score(num_classes=3).update(
      preds=np.array([0, 1]), target=np.array([0, 1]), weights=np.ones(2)
    )
  with pytest.raises(ValueError, match="weighted"):
    M.F1Score(num_classes=3, weighted=True, multidim_average="samplewise")
  with pytest.raises(ValueError, match="weighted"):
    M.F1Score(num_classes=3, weighted=1)


@pytest.mark.parametrize("zero_division", [np.int64(1), np.int32(0), np.float32(1.0)])
def test_numpy_number_zero_division_is_accepted(zero_division):
  # class 2 is predicted but never true: its recall's denominator is 0
  preds, target = np.array([0, 1, 2, 1]), np.array([0, 1, 1, 1])
  got = M.Recall(num_classes=3, average=None, zero_division=zero_division)
  got = got.update(preds=preds, target=target).compute()
  want = skm.recall_score(
    target, preds, labels=[0, 1, 2], average=None, zero_division=float(zero_division)
  )
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


@pytest.mark.parametrize("ignore_index", [2**40, -(2**31) - 1, np.uint64(2**63)])
@pytest.mark.parametrize(
  "make",
  [
    lambda ig: M.Precision(num_classes=3, ignore_index=ig),
    lambda ig: M.ConfusionMatrix(num_classes=3, ignore_index=ig),
    lambda ig: M.Accuracy(num_classes=3, ignore_index=ig),
  ],
)
def test_ignore_index_outside_int32_is_refused_naming_it(make, ignore_index):
  """Target ids are int32: such an ignore_index was an OverflowError at the first update."""
  with pytest.raises(ValueError, match=rf"ignore_index must be .*int32.*{ignore_index}"):
    make(ignore_index)


@pytest.mark.parametrize("beta", [0.5, 2.0, 1e10, 1e19, 1e20, 1e30])
@pytest.mark.parametrize("average", ["macro", "micro", "weighted"])
def test_f_beta_at_any_beta_equals_scikit_learn(beta, average):
  """``1 + beta**2`` overflows float32 beyond beta = 1.8e19: before, the score was inf / inf,
  NaN (scikit-learn, in float64: about the recall)."""
  rng = np.random.default_rng(int(np.log10(beta) * 10) + 7)
  target = rng.integers(0, 3, 101)
  preds = np.where(rng.random(101) < 0.6, target, rng.integers(0, 3, 101))
  metric = pe.metrics.FBetaScore(beta, task="multiclass", num_classes=3, average=average)
  got = float(metric.update(preds=preds, target=target).compute())
  expected = skm.fbeta_score(target, preds, beta=beta, average=average)
  np.testing.assert_allclose(got, expected, rtol=1e-6)
